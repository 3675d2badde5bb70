"""Copies of attnc's objects. A shallow copy of a wrapper held the original's workspace and
plan token, so the copy's plan() rewrote the lists the original's run() then launched on
without a word (a deep copy failed on a ctypes struct): wrappers now refuse copies and
pickles. A copied or unpickled Variant kept the original's handle, the number by which custom
ops find their variant (in another process, whichever variant holds that number there), and a
variant that had run Variant.prefill could not be deep-copied or pickled: copies are now made
anew from the compiled variant. An AttnError could be pickled but not unpickled (its
constructor's arguments were not its pickled state), so a worker pool's compile error broke
the pool: it now travels with its rendered diagnostics."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

import attnc
from attnc.runtime.variant import live_variant
from attnc.runtime.wrappers.single_prefill import thread_plans

COPIES: dict[str, Callable[[object], object]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda x: pickle.loads(pickle.dumps(x)),
}


def _wrappers() -> list[object]:
    variant = attnc.load("stdlib:causal")
    workspace = torch.empty(1 << 20, dtype=torch.uint8)
    decode = object.__new__(attnc.BatchDecodeWrapper)  # its constructor needs a CUDA device
    decode.variant = variant
    return [attnc.BatchPrefillWrapper(variant, workspace), decode]


@pytest.mark.parametrize("how", list(COPIES))
def test_a_wrapper_refuses_copies(how: str) -> None:
    for wrapper in _wrappers():
        name = type(wrapper).__name__
        with pytest.raises(TypeError, match=f"{name} cannot be copied or pickled: its plan"):
            COPIES[how](wrapper)


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copied_variant_has_a_handle_of_its_own_and_computes_the_same(how: str) -> None:
    variant = attnc.load("stdlib:alibi")
    thread_plans(variant)  # as after a Variant.prefill call: its plans do not travel
    twin = COPIES[how](variant)
    assert isinstance(twin, attnc.Variant) and twin is not variant
    assert twin.handle != variant.handle and live_variant(twin.handle) is twin
    assert live_variant(variant.handle) is variant
    assert twin.ir == variant.ir and twin.params == variant.params
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 4, 16, generator=gen, dtype=torch.float64) for _ in "qkv")
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
    want = variant.reference(q, k, v, slopes=slopes)
    got = twin.reference(q, k, v, slopes=slopes)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_attn_error_crosses_processes_with_its_quoted_lines(tmp_path) -> None:
    source = "variant x {\n  let s = score;\n  mask = s > 0;\n}\n"
    with pytest.raises(attnc.AttnError) as raised:
        attnc.load(source=source)
    error = raised.value
    assert len(error.notes) == 1  # the mask that reads the let
    blob = tmp_path / "error.pickle"
    blob.write_bytes(pickle.dumps(error))
    read = (
        "import pickle, sys; e = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(type(e).__name__, e.loc.line, e.loc.col, e.message, sep='|'); print(e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", read, str(blob)], capture_output=True, text=True, check=True
    ).stdout
    head, text = out.split("\n", 1)
    assert head == f"AttnError|{error.loc.line}|{error.loc.col}|{error.message}"
    assert text == str(error) + "\n"
    assert "let s = score;" in text and "mask = s > 0;" in text  # both quoted lines


def test_an_attn_error_keeps_its_added_notes_and_attributes() -> None:
    with pytest.raises(attnc.AttnError) as raised:
        attnc.load(source="variant x {\n  mask = q_pos > ;\n}\n")
    error = raised.value
    error.add_note("while loading layer 3")
    error.layer = 3  # type: ignore[attr-defined]
    for twin in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert str(twin) == str(error) and twin.diagnostic == error.diagnostic
        assert twin.__notes__ == ["while loading layer 3"] and twin.layer == 3


class _NamedVariant(attnc.Variant):
    pass


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_of_a_variant_subclass_keeps_its_class(how: str) -> None:
    base = attnc.load("stdlib:causal")
    variant = _NamedVariant(base.compiled, base.warnings)
    assert type(COPIES[how](variant)) is _NamedVariant
