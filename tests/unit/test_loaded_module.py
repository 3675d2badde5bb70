"""Prefill and decode modules share one loaded-module base: its error names the kind and code."""

from __future__ import annotations


def test_loaded_module_error_names_kind_and_code() -> None:
    import ctypes

    import pytest

    from attnc.runtime.build.modules import DecodeModule, PrefillModule

    class FakeIR:
        params: tuple[object, ...] = ()

    lib = ctypes.CDLL(None)
    for cls, kind in ((PrefillModule, "prefill"), (DecodeModule, "decode")):
        module = cls.__new__(cls)
        module.name, module.lib, module.ir = "m", lib, FakeIR()
        module.raise_on_error(0)
        with pytest.raises(RuntimeError, match=f"attnc: {kind} module m failed with code 3"):
            module.raise_on_error(3)
