"""Generated modules: source -> built library -> a loaded, ABI-checked module.

Modules are built lazily per (variant IR, dtype, head_dim, arch) and memoised; each has a
string id (its library path) so the torch custom ops can find it again.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import torch

from attnc.codegen.instances import DTYPE_SHORT
from attnc.dsl.errors import printable
from attnc.runtime import abi
from attnc.runtime.build import jit, toolchain

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
M = TypeVar("M")


# What a launcher's own codes mean to a caller (eager calls name the tensor before this).
_HINTS = {
    10003: ": the launcher refused the layout (it needs q, k, v, out and the workspace "
    "16-byte aligned, their strides but the last dim's in whole multiples of 8 elements, "
    "and a whole number of query heads per KV head)",
}


class LoadedModule:
    """A loaded kernel library (prefill or decode): the launcher plus the variant it was
    generated for, and the ctypes ``Params`` struct of that variant."""

    kind = "kernel"  # the word error messages use for the module

    def __init__(self, module_id: str, lib: ctypes.CDLL, ir: object, name: str) -> None:
        self.module_id = module_id
        self.lib = lib
        self.ir = ir
        self.name = name
        self.params_type = abi.params_struct(ir.params)  # type: ignore[attr-defined]

    def raise_on_error(self, rc: int, what: str = "failed") -> None:
        """A non-zero return code ``rc`` of the library becomes a RuntimeError naming it."""
        if rc != 0:
            hint = _HINTS.get(rc, "")
            raise RuntimeError(
                f"attnc: {self.kind} module {self.name} {what} with code {rc} "
                f"({abi.error_name(rc)}){hint}"
            )


class PrefillModule(LoadedModule):
    """A loaded prefill library: the launcher plus the variant it was generated for."""

    kind = "prefill"

    def tile_q_tokens(self, head_dim: int, group_size: int, max_q_len: int) -> int:
        """Query tokens per work item the launcher uses for this shape."""
        return int(self.lib.attnc_prefill_tile_q_tokens(head_dim, group_size, max_q_len))

    def ctas_per_sm(self, head_dim: int, group_size: int, max_q_len: int) -> int:
        """CTAs of that shape one SM of the current device holds (<= 0: no device/error)."""
        return int(self.lib.attnc_prefill_ctas_per_sm(head_dim, group_size, max_q_len))

    def launch(self, args: abi.AttncPrefillArgs, stream: int) -> None:
        """Call ``attnc_prefill``; a non-zero return code becomes a RuntimeError."""
        self.raise_on_error(self.lib.attnc_prefill(ctypes.byref(args), ctypes.c_void_p(stream)))


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16``/``"bfloat16"`` -> ``"bfloat16"`` (same for float16)."""
    name = _DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, torch.dtype) else dtype
    if name not in DTYPE_SHORT:
        raise ValueError(f"dtype: must be torch.bfloat16 or torch.float16, got {dtype}")
    return str(name)


class ModuleRegistry(Generic[M]):
    """Builds, loads and memoises one kind of generated module (prefill, decode).

    A module is built on first use per (variant IR, dtype, head_dim, arch), its library's ABI
    version is checked once, and it is registered under its resolved library path (its id,
    which the torch custom ops carry).
    """

    def __init__(
        self,
        kind: str,
        render: Callable[[object, str, int], tuple[str, ...]],
        make: Callable[[str, ctypes.CDLL, object, str], M],
        declare: Callable[[ctypes.CDLL], None],
        version_symbol: str,
        version: int,
        name_infix: str = "",
        arch_flags: Callable[[str], tuple[str, ...]] = lambda arch: (),
    ) -> None:
        self.kind = kind
        self._arch_flags = arch_flags
        self._render = render
        self._make = make
        self._declare = declare
        self._version_symbol = version_symbol
        self._version = version
        self._infix = name_infix
        self._by_id: dict[str, M] = {}
        self._by_key: dict[tuple[object, ...], M] = {}
        self._lock = threading.Lock()

    def load(self, path: Path | str, ir: object, name: str) -> M:
        """Open a built library, check its ABI version, and register it by path."""
        module_id = str(Path(path).resolve())
        found = self._by_id.get(module_id)
        if found is not None:
            return found
        # Outside the lock: the load may wait for another process's build of this library,
        # and the modules of other threads need not wait with it (it opens each once).
        lib = jit.load_library(module_id)
        with self._lock:
            if module_id in self._by_id:
                return self._by_id[module_id]
            self._declare(lib)
            version = getattr(lib, self._version_symbol)()
            if version != self._version:
                raise RuntimeError(
                    f"attnc: {printable(module_id)} has {self.kind} ABI version {version}, "
                    f"expected {self._version}; clear the cache (ATTNC_CACHE_DIR)"
                )
            module = self._make(module_id, lib, ir, name)
            self._by_id[module_id] = module
            return module

    def find(self, module_id: str) -> M | None:
        """The loaded module with this id, or None."""
        return self._by_id.get(module_id)

    def get(
        self, ir: object, dtype: torch.dtype | str, head_dim: int, arch: str | None = None
    ) -> M:
        """The module for ``ir`` at ``dtype``/``head_dim`` on ``arch`` (default: the current
        CUDA device's), built on first use."""
        dname = dtype_name(dtype)
        target = toolchain.normalize_arch(arch) if arch is not None else toolchain.current_arch()
        key = (ir, dname, head_dim, target)
        module = self._by_key.get(key)
        if module is None:
            spec = self.spec(ir, dname, head_dim, target)
            path = jit.build_modules([spec], arch=target)[0]
            module = self.load(path, ir, spec.name)
            self._by_key[key] = module
        return module

    def spec(
        self, ir: object, dtype: torch.dtype | str, head_dim: int, arch: str
    ) -> jit.ModuleSpec:
        """What gets built for ``ir`` at ``dtype``/``head_dim`` on ``arch`` (normalised): the
        same name, sources and flags, hence the same cache entry, as :meth:`get` uses."""
        dname = dtype_name(dtype)
        name = f"{ir.name}{self._infix}_{DTYPE_SHORT[dname]}_d{head_dim}"  # type: ignore[attr-defined]
        source, *parts = self._render(ir, dname, head_dim)
        return jit.ModuleSpec(name, source, self._arch_flags(arch), tuple(parts))


def _render_prefill(ir: object, dtype: str, head_dim: int) -> tuple[str, ...]:
    from attnc.codegen.module import render_prefill_module

    return (render_prefill_module(ir, dtype, head_dim),)  # type: ignore[arg-type]


def prefill_arch_flags(arch: str) -> tuple[str, ...]:
    """Tile shapes per target: on sm_90+ the 128-row tiles stream 64 keys per stage as two
    32-key S tiles (d=128; 128 as 2 x 64 at d=64), measured faster on an H200 (see
    tests/gpu/kernel_harness/NOTES.md); elsewhere (sm_80 spills with it; newer chips are
    untested) the default shapes."""
    major = int("".join(ch for ch in arch if ch.isdigit())[:-1] or 0)
    return ("-DATTNC_PREFILL_TUNE=1",) if major == 9 else ()


PREFILL_MODULES: ModuleRegistry[PrefillModule] = ModuleRegistry(
    "prefill",
    _render_prefill,
    PrefillModule,
    abi.declare_prefill_functions,
    "attnc_prefill_abi_version",
    abi.PREFILL_ABI_VERSION,
    arch_flags=prefill_arch_flags,
)
load_prefill_module = PREFILL_MODULES.load
get_prefill_module = PREFILL_MODULES.get


def _render_prefill_sm90(ir: object, dtype: str, head_dim: int) -> tuple[str, ...]:
    from attnc.codegen.module import render_prefill_sm90_sources

    return render_prefill_sm90_sources(ir, dtype, head_dim)  # type: ignore[arg-type]


def sm90_prefill_available() -> bool:
    """True when this install has the Hopper (sm_90a) prefill template."""
    from attnc.codegen import module, templates

    template = Path(templates.__file__).parent / "prefill_sm90_module.cu.j2"
    return hasattr(module, "render_prefill_sm90_sources") and template.is_file()


# The Hopper prefill module: the same C ABI as the FA2 one, built for sm_90a only.
PREFILL_SM90_MODULES: ModuleRegistry[PrefillModule] = ModuleRegistry(
    "prefill",
    _render_prefill_sm90,
    PrefillModule,
    abi.declare_prefill_functions,
    "attnc_prefill_abi_version",
    abi.PREFILL_ABI_VERSION,
    name_infix="_sm90",
)
get_prefill_sm90_module = PREFILL_SM90_MODULES.get


def module_by_id(module_id: str) -> PrefillModule:
    """The loaded prefill module (FA2 or Hopper) with this id (its resolved library path)."""
    for registry in (PREFILL_MODULES, PREFILL_SM90_MODULES):
        module = registry.find(module_id)
        if module is not None:
            return module
    raise KeyError(f"attnc: no prefill module with id {module_id!r} is loaded")


class DecodeModule(LoadedModule):
    """A loaded decode library: the launcher plus the variant it was generated for."""

    kind = "decode"

    def __init__(self, module_id: str, lib: ctypes.CDLL, ir: object, name: str) -> None:
        super().__init__(module_id, lib, ir, name)
        self._launch = lib.attnc_decode

    def shape(self, head_dim: int, rows_needed: int) -> tuple[int, int, int]:
        """(rows per work item, KV tokens per CTA tile, CTAs per SM) on the current device."""
        out = (ctypes.c_int32 * 3)()
        self.raise_on_error(
            self.lib.attnc_decode_shape(head_dim, rows_needed, out), "shape query failed"
        )
        return int(out[0]), int(out[1]), int(out[2])

    def launch(self, args_ref: object, stream: int) -> None:
        """Call ``attnc_decode``; a non-zero return code becomes a RuntimeError."""
        self.raise_on_error(self._launch(args_ref, stream))


def _declare(lib: ctypes.CDLL) -> None:
    lib.attnc_decode.argtypes = [ctypes.POINTER(abi.AttncDecodeArgs), ctypes.c_void_p]
    lib.attnc_decode.restype = ctypes.c_int
    lib.attnc_decode_abi_version.argtypes = []
    lib.attnc_decode_abi_version.restype = ctypes.c_int
    lib.attnc_decode_shape.argtypes = [
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int32),
    ]
    lib.attnc_decode_shape.restype = ctypes.c_int


def _render_decode(ir: object, dtype: str, head_dim: int) -> tuple[str, ...]:
    from attnc.codegen.decode_module import render_decode_module

    return (render_decode_module(ir, dtype, head_dim),)  # type: ignore[arg-type]


DECODE_MODULES: ModuleRegistry[DecodeModule] = ModuleRegistry(
    "decode",
    _render_decode,
    DecodeModule,
    _declare,
    "attnc_decode_abi_version",
    abi.DECODE_ABI_VERSION,
    name_infix="_decode",
)
get_decode_module = DECODE_MODULES.get
