"""Bad runtime inputs each get a ValueError naming the argument (issue 11, items 20 and 21)."""

from __future__ import annotations

import pytest
import torch

import attnc
from attnc.runtime.checks import tensors
from attnc.runtime.wrappers.prefill_batch import check_indices as _check_indices

I32 = dict(dtype=torch.int32)


def _paged(page_size, pages=2, last=3):
    indptr = torch.tensor([0, 2], **I32)
    return indptr, indptr, torch.arange(pages, **I32), torch.tensor([last], **I32), page_size


@pytest.mark.parametrize(
    ("page_size", "message"),
    [
        (16.7, "page_size: expected an int, got float 16.7"),
        (True, "page_size: expected an int, got bool True"),
        (16.0, "page_size: expected an int, got float 16.0"),
        (0, r"page_size: must be in \[1, 2147483647\], got 0"),
    ],
)
def test_prefill_page_size_must_be_an_int(page_size, message):
    with pytest.raises(ValueError, match=f"^{message}"):
        _check_indices(*_paged(page_size))


def test_prefill_page_size_accepts_numpy_ints():
    import numpy as np

    *_, page = _check_indices(*_paged(np.int64(16)))
    assert page == 16 and type(page) is int


def test_prefill_kv_over_int32_tokens_is_refused():
    """32769 pages of 65536 tokens: 2**31 + 4 tokens would wrap in the kernels' int32; a
    request within 2**16 of that wraps their tile arithmetic (MAX_KV_TOKENS)."""
    pages = 2**15 + 1
    qo = torch.tensor([0, 1], **I32)
    kv = torch.tensor([0, pages], **I32)
    ids = torch.arange(pages, **I32)
    with pytest.raises(ValueError, match=r"^kv_indptr: request 0 holds 2147483652 KV tokens"):
        _check_indices(qo, kv, ids, torch.tensor([4], **I32), 2**16)
    # 2**15 pages of 65534 tokens and a last of 1: MAX_KV_TOKENS + 1, refused.
    with pytest.raises(ValueError, match=r"^kv_indptr: request 0 holds 2147418113 KV tokens"):
        _check_indices(qo, kv, ids, torch.tensor([1], **I32), 2**16 - 2)
    # 2**15 pages of 65533 tokens and a last of 2**15: MAX_KV_TOKENS, accepted.
    _check_indices(qo, kv, ids, torch.tensor([2**15], **I32), 2**16 - 3)


def test_ragged_kv_past_the_kernels_limit_is_refused():
    """A ragged request of MAX_KV_TOKENS + 1 keys (k can be a zero-stride view of that many
    rows) is refused naming kv_indptr; MAX_KV_TOKENS keys pass."""
    from attnc.runtime.checks.limits import MAX_KV_TOKENS

    qo = torch.tensor([0, 1, 2], **I32)
    kv = torch.tensor([0, 5, 5 + MAX_KV_TOKENS + 1], **I32)
    with pytest.raises(ValueError, match=r"^kv_indptr: request 1 holds 2147418113 KV tokens, more"):
        _check_indices(qo, kv, None, None, None)
    _check_indices(qo, torch.tensor([0, 5, 5 + MAX_KV_TOKENS], **I32), None, None, None)


def test_a_request_past_the_query_limit_is_refused():
    """A request of MAX_QUERY_TOKENS + 1 queries is refused naming qo_indptr (the index check
    bounds q_pos by that limit); MAX_QUERY_TOKENS queries pass."""
    from attnc.runtime.checks.limits import MAX_QUERY_TOKENS

    kv = torch.tensor([0, 5, 10], **I32)
    qo = torch.tensor([0, 3, 3 + MAX_QUERY_TOKENS + 1], **I32)
    with pytest.raises(ValueError, match=r"^qo_indptr: request 1 holds 2147418113 query tokens"):
        _check_indices(qo, kv, None, None, None)
    _check_indices(torch.tensor([0, 3, 3 + MAX_QUERY_TOKENS], **I32), kv, None, None, None)


@pytest.mark.parametrize(
    ("heads", "name"),
    [((4.0, 2, 64), "num_qo_heads"), ((4, True, 64), "num_kv_heads"), ((4, 2, 64.0), "head_dim")],
)
def test_heads_must_be_ints(heads, name):
    with pytest.raises(ValueError, match=f"^{name}: expected an int"):
        tensors.check_heads(*heads)


def _q():
    return torch.zeros(6, 4, 64, dtype=torch.bfloat16)


def test_out_may_not_alias_q():
    q = _q()
    with pytest.raises(ValueError, match="^out: overlaps q in memory"):
        tensors.check_out(q, q)
    with pytest.raises(ValueError, match="^out: overlaps q in memory"):
        tensors.check_out(q.view(6, 4, 2, 32).flatten(2), q)  # another view of q


def test_out_next_to_q_in_one_buffer_is_fine():
    base = torch.zeros(12, 4, 64, dtype=torch.bfloat16)
    assert tensors.check_out(base[6:], base[:6]) is not None


def test_out_overlapping_q_in_one_buffer_is_refused():
    base = torch.zeros(12, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^out: overlaps q"):
        tensors.check_out(base[5:11], base[:6])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(1, 4, 64, dtype=torch.bfloat16).expand(6, 4, 64),  # stride 0
        lambda: torch.zeros(64, dtype=torch.bfloat16).as_strided((6, 4, 64), (0, 0, 1)),
        lambda: torch.zeros(512, dtype=torch.bfloat16).as_strided((6, 4, 64), (8, 16, 1)),
    ],
)
def test_out_with_overlapping_elements_is_refused(make):
    with pytest.raises(ValueError, match="^out: elements overlap in memory"):
        tensors.check_out(make(), _q())


def test_out_permuted_but_dense_is_fine():
    out = torch.zeros(4, 6, 64, dtype=torch.bfloat16).transpose(0, 1)  # head-major rows
    assert tensors.check_out(out, _q()) is out


def test_load_takes_an_existing_path_with_braces_as_a_path(tmp_path, monkeypatch):
    folder = tmp_path / "specs{v1}"
    folder.mkdir()
    path = folder / "w{1}.attn"
    path.write_text("variant braced { mask = kv_idx <= q_pos; }\n")
    assert attnc.load(str(path)).name == "braced"
    # The CLI and the code generators read specs through the same function.
    from attnc.compiler.sources import resolve_source

    assert resolve_source(str(path)) == (path.read_text(), str(path))
    monkeypatch.chdir(folder)
    assert attnc.load("w{1}.attn").name == "braced"


def test_load_text_without_variant_or_newline_is_a_missing_file():
    with pytest.raises(FileNotFoundError, match=r"'missing\{1\}\.attn'"):
        attnc.load("missing{1}.attn")
    with pytest.raises(FileNotFoundError):
        attnc.load("missing.attn")


def test_load_source_keyword_and_inline_text():
    text = "variant inline { score = score * 0.5; }"
    assert attnc.load(text).name == "inline"
    assert attnc.load(source=text).name == "inline"
    one_line_no_keyword = "x"
    with pytest.raises(FileNotFoundError):
        attnc.load(one_line_no_keyword)
    with pytest.raises(ValueError, match="not both"):
        attnc.load("stdlib:causal", source=text)
    with pytest.raises(ValueError, match="^spec: expected a path"):
        attnc.load()
