"""A variant's IR keys weak memos (the analyses memo holds it until its ``Compiled`` dies).
Its hash was taken afresh on every lookup, through ``const_key``'s ``math``/``struct``: at
interpreter exit, when a module's globals may already be None, the memo's removal callback
hashed the key and printed ``TypeError: 'NoneType' object is not callable`` (seen at the
end of a GPU test run). A hash once taken now reads no module global again."""

from __future__ import annotations

import dataclasses
import gc
import pickle
import sys
import weakref

import pytest

from attnc.compiler import ir
from attnc.compiler.pipeline import compile_source

SOURCE = "variant exit_probe { param cap: f32 = 30.0; score = cap * tanh(score / cap); }"


class _Held:
    pass


def _ir() -> ir.VariantIR:
    compiled, diagnostics = compile_source(SOURCE, "exit_probe.attn")
    assert not diagnostics
    return compiled[0].variant


def test_variant_and_param_hashes_are_taken_once(monkeypatch) -> None:
    v = _ir()
    before = hash(v), hash(v.params[0])
    monkeypatch.setattr(ir, "struct", None)
    monkeypatch.setattr(ir, "math", None)
    assert (hash(v), hash(v.params[0])) == before
    assert v == dataclasses.replace(v)


def test_weak_memo_removal_after_globals_cleared(monkeypatch) -> None:
    seen: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    memo: weakref.WeakValueDictionary[ir.VariantIR, _Held] = weakref.WeakValueDictionary()
    held = _Held()
    memo[_ir()] = held
    monkeypatch.setattr(ir, "struct", None)
    monkeypatch.setattr(ir, "math", None)
    del held
    gc.collect()
    assert seen == [] and len(memo) == 0


def test_cached_hash_is_not_pickled() -> None:
    v = _ir()
    hash(v)
    assert "_hash" not in pickle.loads(pickle.dumps(v)).__dict__
    assert "_hash" not in pickle.loads(pickle.dumps(v.params[0])).__dict__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
