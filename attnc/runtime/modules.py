"""Prefill modules: generated source -> built library -> a loaded, ABI-checked module.

Modules are built lazily per (variant IR, dtype, head_dim, arch) and memoised; each has a
string id (its library path) so the torch custom op can find it again.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from attnc.runtime import abi, jit

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_SHORT = {"bfloat16": "bf16", "float16": "fp16"}
_BY_ID: dict[str, PrefillModule] = {}
_BY_KEY: dict[tuple[object, ...], PrefillModule] = {}
_LOCK = threading.Lock()


class PrefillModule:
    """A loaded prefill library: the launcher plus the variant it was generated for."""

    def __init__(self, module_id: str, lib: ctypes.CDLL, ir: object, name: str) -> None:
        self.module_id = module_id
        self.lib = lib
        self.ir = ir
        self.name = name
        self.params_type = abi.params_struct(ir.params)  # type: ignore[attr-defined]

    def tile_q_tokens(self, head_dim: int, group_size: int, max_q_len: int) -> int:
        """Query tokens per work item the launcher uses for this shape."""
        return int(self.lib.attnc_prefill_tile_q_tokens(head_dim, group_size, max_q_len))

    def launch(self, args: abi.AttncPrefillArgs, stream: int) -> None:
        """Call ``attnc_prefill``; a non-zero return code becomes a RuntimeError."""
        rc = self.lib.attnc_prefill(ctypes.byref(args), ctypes.c_void_p(stream))
        if rc != 0:
            raise RuntimeError(
                f"attnc: prefill module {self.name} failed with code {rc} ({abi.error_name(rc)})"
            )


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16``/``"bfloat16"`` -> ``"bfloat16"`` (same for float16)."""
    name = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype
    if name not in _SHORT:
        raise ValueError(f"dtype: must be torch.bfloat16 or torch.float16, got {dtype}")
    return str(name)


def load_prefill_module(path: Path | str, ir: object, name: str) -> PrefillModule:
    """Open a built prefill library, check its ABI version, and register it by path."""
    module_id = str(Path(path).resolve())
    with _LOCK:
        if module_id in _BY_ID:
            return _BY_ID[module_id]
        lib = jit.load_library(module_id)
        abi.declare_prefill_functions(lib)
        version = lib.attnc_prefill_abi_version()
        if version != abi.PREFILL_ABI_VERSION:
            raise RuntimeError(
                f"attnc: {module_id} has prefill ABI version {version}, "
                f"expected {abi.PREFILL_ABI_VERSION}; clear the cache (ATTNC_CACHE_DIR)"
            )
        module = PrefillModule(module_id, lib, ir, name)
        _BY_ID[module_id] = module
        return module


def module_by_id(module_id: str) -> PrefillModule:
    """The loaded module with this id (used by the custom op)."""
    return _BY_ID[module_id]


def get_prefill_module(
    ir: object, dtype: torch.dtype | str, head_dim: int, arch: str | None = None
) -> PrefillModule:
    """The prefill module for ``ir`` at ``dtype``/``head_dim``, built on first use."""
    key = (ir, dtype_name(dtype), head_dim, arch)
    module = _BY_KEY.get(key)
    if module is None:
        from attnc.codegen.module import render_prefill_module

        dname = dtype_name(dtype)
        name = f"{ir.name}_{_SHORT[dname]}_d{head_dim}"  # type: ignore[attr-defined]
        source = render_prefill_module(ir, dname, head_dim)  # type: ignore[arg-type]
        path = jit.build_module(name, source, arch=arch)
        module = load_prefill_module(path, ir, name)
        _BY_KEY[key] = module
    return module
