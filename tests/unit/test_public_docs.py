"""Every public name of the package is documented: each module has a docstring, and so do
its public functions and classes and their public methods (names without a leading
underscore, defined in that module, and listed in ``__all__`` when the module has one)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import attnc


def _undocumented() -> list[str]:
    missing = []
    for info in pkgutil.walk_packages(attnc.__path__, "attnc."):
        module = importlib.import_module(info.name)
        if not (module.__doc__ or "").strip():
            missing.append(f"module {info.name}")
        listed = getattr(module, "__all__", None)
        for name, obj in vars(module).items():
            if name.startswith("_") or (listed is not None and name not in listed):
                continue
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if not (obj.__doc__ or "").strip():
                missing.append(f"{info.name}.{name}")
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not inspect.isfunction(member):
                        continue
                    if not (member.__doc__ or "").strip():
                        missing.append(f"{info.name}.{name}.{attr}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    assert _undocumented() == []
