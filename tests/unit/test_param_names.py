"""Param names and the runtime calls' own arguments: params may share the names of the
positional tensors (q, k, v, kv, kv_cache), which are positional-only, and a param named as
a keyword option of those calls (``ir.CALL_OPTIONS``) is refused where it is declared."""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path

import pytest
import torch

import attnc
from attnc.compiler import ir
from attnc.compiler.pipeline import compile_source
from attnc.dsl.errors import AttnError
from attnc.runtime.reference import request_reference

PACKAGE = Path(attnc.__file__).parent
# Every runtime call that takes a variant's params as keyword arguments.
CALLS = {
    "Variant.reference": attnc.Variant.reference,
    "Variant.prefill": attnc.Variant.prefill,
    "BatchPrefillWrapper.run": attnc.BatchPrefillWrapper.run,
    "BatchDecodeWrapper.run": attnc.BatchDecodeWrapper.run,
    "request_reference": request_reference,
}

# The calls' own argument names as param names, each changing the result, and the same
# variant with its params renamed.
NAMED = """variant named {
    param q: f32;
    param k: f32 = 0.5;
    param v: tensor<f32>[num_qo_heads];
    param kv: i32 = 3;
    param kv_cache: bool = false;
    param self: f32 = 0.25;
    score = score * q * v[qo_head] + k * float(kv_idx);
    mask = (kv_cache || kv_idx <= q_pos) && q_pos - kv_idx < kv;
    output = out * self;
}
"""
RENAMES = {"q": "a", "k": "b", "v": "c", "kv": "d", "kv_cache": "e", "self": "f"}


def _renamed(text: str) -> str:
    """``text`` with every param renamed (``RENAMES``), as whole words."""
    for old, new in RENAMES.items():
        text = re.sub(rf"\b{old}\b(?!_)", new, text)
    return text.replace("variant named", "variant renamed")


def _inputs(q_len: int = 5, kv_len: int = 9, h_qo: int = 4, h_kv: int = 2, d: int = 16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(q_len, h_qo, d, generator=g, dtype=torch.float64)
    k = torch.randn(kv_len, h_kv, d, generator=g, dtype=torch.float64)
    v = torch.randn(kv_len, h_kv, d, generator=g, dtype=torch.float64)
    return q, k, v


def _expected(q, k, v, *, scale, slope, head_scale, window, kv_cache, factor):
    """The variant ``NAMED`` written out in float64 (every row sees at least one key)."""
    q_len, h_qo, d = q.shape
    kv_len, h_kv, _ = k.shape
    kh = k.repeat_interleave(h_qo // h_kv, dim=1)
    vh = v.repeat_interleave(h_qo // h_kv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kh) / math.sqrt(d)
    kv_idx = torch.arange(kv_len, dtype=torch.float64)
    s = s * scale * head_scale.double()[:, None, None] + slope * kv_idx
    q_pos = torch.arange(q_len)[:, None] + kv_len - q_len
    key = torch.arange(kv_len)[None, :]
    visible = (q_pos - key < window) & (kv_cache or (key <= q_pos))
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vh) * factor


def test_params_named_like_the_call_arguments_work_in_reference() -> None:
    named = attnc.load(source=NAMED)
    renamed = attnc.load(source=_renamed(NAMED))
    assert [p.name for p in named.params] == list(RENAMES)
    assert [p.name for p in renamed.params] == list(RENAMES.values())
    q, k, v = _inputs()
    head_scale = torch.tensor([1.0, -0.5, 2.0, 0.25])
    given = dict(q=2.0, k=0.75, v=head_scale, kv=4, kv_cache=True, self=1.5)
    got = named.reference(q, k, v, **given)
    same = renamed.reference(q, k, v, **{RENAMES[n]: x for n, x in given.items()})
    torch.testing.assert_close(got, same, rtol=0, atol=0)
    want = _expected(
        q, k, v, scale=2.0, slope=0.75, head_scale=head_scale, window=4, kv_cache=True,
        factor=1.5,
    )  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # Defaults: k, kv, kv_cache and self; q and v have none.
    want = _expected(
        q, k, v, scale=2.0, slope=0.5, head_scale=head_scale, window=3, kv_cache=False,
        factor=0.25,
    )  # fmt: skip
    got = named.reference(q, k, v, q=2.0, v=head_scale)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="missing param 'q'"):
        named.reference(q, k, v, v=head_scale)


def test_params_named_like_the_call_arguments_work_in_request_reference() -> None:
    named = attnc.load(source=NAMED)
    q, k, v = _inputs()
    given = dict(q=2.0, k=0.75, v=torch.tensor([1.0, -0.5, 2.0, 0.25]), kv=4, self=1.5)
    got = request_reference(named, q, k, v, **given)
    torch.testing.assert_close(got, named.reference(q, k, v, **given), rtol=0, atol=0)


@pytest.mark.parametrize(
    "name, owners",
    [("return_lse", "Variant.reference, Variant.prefill, BatchPrefillWrapper.run, "
      "BatchDecodeWrapper.run and request_reference"), ("backend", "Variant.prefill")],
)  # fmt: skip
def test_a_param_named_as_a_call_option_is_refused_where_declared(name: str, owners: str) -> None:
    """The message names the calls that take the option (it said every call did)."""
    assert set(ir.CALL_OPTIONS) - set(ir.BUILTINS) - {ir.OUTPUT_BUILTIN} == {
        "return_lse",
        "backend",
    }
    text = f'variant v {{\n    doc "x";\n    param {name}: f32;\n    score = score * {name};\n}}\n'
    with pytest.raises(AttnError) as info:
        compile_source(text, "x.attn")
    err = info.value
    assert err.message == (
        f"param '{name}' has the name of a keyword argument of {owners}, so it could not be "
        "passed there: choose another name"
    )
    assert str(err.loc) == "x.attn:3:5"
    line = f"param {name}: f32;"
    assert str(err) == (
        f"x.attn:3:5: error: {err.message}\n        {line}\n        ^{'~' * (len(line) - 1)}"
    )


@pytest.mark.parametrize("name", sorted(ir.CALL_OPTIONS))
def test_every_call_option_is_refused_as_a_param_name(name: str) -> None:
    with pytest.raises(AttnError) as info:
        compile_source(f"variant v {{\n    param {name}: f32 = 1.0;\n}}\n", "x.attn")
    assert str(info.value.loc) == "x.attn:2:5"
    assert f"'{name}'" in info.value.message


def test_call_options_match_the_runtime_signatures() -> None:
    """Every keyword-only parameter of a call that takes params as keyword arguments is in
    ``ir.CALL_OPTIONS`` (and each name there is one), and every parameter before them is
    positional-only, so no param name can collide with an argument of the call."""
    keyword_only: set[str] = set()
    for where, call in CALLS.items():
        params = list(inspect.signature(call).parameters.values())
        kinds = [p.kind for p in params]
        assert kinds[-1] is inspect.Parameter.VAR_KEYWORD, where
        assert inspect.Parameter.POSITIONAL_OR_KEYWORD not in kinds, where
        assert inspect.Parameter.VAR_POSITIONAL not in kinds, where
        options = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        owned = {name for name, calls in ir.CALL_OPTIONS.items() if where in calls}
        assert options == owned, where
        keyword_only |= options
        # A param may take the name of each positional argument.
        positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
        bound = inspect.signature(call).bind(*positional, **{p.name: 0 for p in positional})
        assert set(bound.arguments[params[-1].name]) == {p.name for p in positional}, where
    assert keyword_only == set(ir.CALL_OPTIONS)


def test_every_call_taking_params_as_keywords_is_checked() -> None:
    """The functions of the package with a ``**params`` argument are the calls above."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes = [(tree, "")]
        while scopes:
            node, prefix = scopes.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    scopes.append((child, f"{prefix}{child.name}."))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if child.args.kwarg is not None and child.args.kwarg.arg == "params":
                        found.add(f"{prefix}{child.name}")
    assert found == {call.__qualname__ for call in CALLS.values()}
