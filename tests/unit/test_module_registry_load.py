"""ModuleRegistry.load held the registry's lock while the library was opened, and opening
one may wait for another process's build of it (up to the lock timeout): every other thread
loading a module of the same kind waited too. The wait is now outside the lock."""

from __future__ import annotations

import threading
import types

from attnc.runtime.build import jit
from attnc.runtime.build.modules import ModuleRegistry


def _registry() -> ModuleRegistry:
    return ModuleRegistry(
        "test",
        render=lambda ir, dtype, head_dim: (),
        make=lambda module_id, lib, ir, name: types.SimpleNamespace(id=module_id, lib=lib),
        declare=lambda lib: None,
        version_symbol="version",
        version=1,
    )


def test_a_slow_load_does_not_hold_up_another_module(monkeypatch, tmp_path) -> None:
    slow, quick = str(tmp_path / "slow.so"), str(tmp_path / "quick.so")
    release = threading.Event()

    def load_library(path: str) -> object:
        if path == slow:
            assert release.wait(10), "the slow load was never released"
        return types.SimpleNamespace(version=lambda: 1)

    monkeypatch.setattr(jit, "load_library", load_library)
    registry = _registry()
    waiting = threading.Thread(target=registry.load, args=(slow, None, "slow"))
    waiting.start()
    try:
        done = threading.Thread(target=registry.load, args=(quick, None, "quick"))
        done.start()
        done.join(2)
        assert not done.is_alive(), "the quick module waited for the slow one"
    finally:
        release.set()
        waiting.join(10)
    assert registry.find(slow) is not None and registry.find(quick) is not None
    assert registry.load(slow, None, "slow") is registry.find(slow)
