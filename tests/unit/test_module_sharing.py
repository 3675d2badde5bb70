"""Variants that differ only in what reaches no generated code (their source file, their doc)
share one module: its IR is the first one's. The compiled prefill op's body checks the
derived float32 values of the params only for a variant compiled to the module's IR, and
compared the whole IR: a variant read from a second file launched values its eager path
refuses (softcap's cap = 3e38, whose 1 / cap is below float32's normal range)."""

from __future__ import annotations

import pytest
import torch

import attnc
from attnc.runtime.build import modules
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.wrappers import prefill_launch
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from attnc.version import PACKAGE_DIR
from tests.unit.test_prefill_call_memo import _qkv, _ragged_plan, _Recorder, cpu_run  # noqa: F401

STDLIB = PACKAGE_DIR / "stdlib_variants"


def _two_copies(tmp_path):
    paths = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        for name in ("softcap.attn", "masks.attn"):  # softcap imports masks
            (tmp_path / folder / name).write_text((STDLIB / name).read_text())
        paths.append(tmp_path / folder / "softcap.attn")
    return [attnc.load(str(p)) for p in paths]


def test_the_same_text_from_two_files_shares_a_module_and_its_checks(
    tmp_path,
    cpu_run,  # noqa: F811
    monkeypatch,
) -> None:
    a, b = _two_copies(tmp_path)
    assert a.ir != b.ir and a.ir.same_code(b.ir)
    spec_a = modules.PREFILL_MODULES.spec(a.ir, "bfloat16", 64, "80")
    assert spec_a == modules.PREFILL_MODULES.spec(b.ir, "bfloat16", 64, "80")
    shared = _Recorder(a)  # the module both get: built for a's IR
    w = BatchPrefillWrapper(b, torch.empty(1 << 22, dtype=torch.uint8))
    w._module_choice = lambda *x: PrefillChoice("fa2", shared, 16)
    monkeypatch.setattr(prefill_launch, "module_by_id", lambda module_id: shared)
    q, k, v = _qkv(*_ragged_plan(w))
    with pytest.raises(ValueError, match=r"cap = 3e\+38"):
        w.run(q, (k, v), cap=3e38)

    @torch.compile(backend="eager", fullgraph=True, dynamic=False)
    def compiled_run(q, k, v, cap):
        return w.run(q, (k, v), cap=cap)

    torch._dynamo.reset()
    try:
        with pytest.raises(ValueError, match=r"cap = 3e\+38"):
            compiled_run(q, k, v, 3e38)
    finally:
        torch._dynamo.reset()
    assert shared.calls == []


def test_same_code_ignores_only_what_reaches_no_module() -> None:
    import dataclasses

    v = attnc.load("stdlib:softcap").ir
    assert v.same_code(dataclasses.replace(v, doc="other", file="/x/y.attn"))
    # neither reaches the module either (a second file's `kv_layout` line or `cap = 30.0`)
    assert v.same_code(dataclasses.replace(v, kv_layouts=("paged",)))
    cap = dataclasses.replace(v.params[0], default=30.0)
    assert v.params[0].default != 30.0 and v.same_code(dataclasses.replace(v, params=(cap,)))
    assert not v.same_code(dataclasses.replace(v, name="other"))
    assert not v.same_code(dataclasses.replace(v, normalize="none"))
