"""ctypes mirror of the decode module C ABI (``attnc/decode_args.h``) and loading of decode
modules: generated source -> built library -> a loaded, ABI-checked module."""

from __future__ import annotations

import ctypes

from attnc.runtime import abi
from attnc.runtime.modules import ModuleRegistry

DECODE_ABI_VERSION = 1
FLAG_MERGE = 1

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int32


class AttncDecodeArgs(ctypes.Structure):
    """Field-for-field mirror of ``struct AttncDecodeArgs``; pointers are plain addresses."""

    _fields_ = [
        ("q", _P),
        ("k", _P),
        ("v", _P),
        ("o", _P),
        ("lse", _P),
        ("header", _P),
        ("cta_indptr", _P),
        ("items", _P),
        ("req_page_begin", _P),
        ("req_kv_len", _P),
        ("page_ids", _P),
        ("merge_items", _P),
        ("part_o", _P),
        ("part_lse", _P),
        ("q_stride_tok", _I64),
        ("q_stride_head", _I64),
        ("o_stride_tok", _I64),
        ("o_stride_head", _I64),
        ("kv_stride_page", _I64),
        ("kv_stride_tok", _I64),
        ("kv_stride_head", _I64),
        ("num_qo_heads", _I32),
        ("num_kv_heads", _I32),
        ("head_dim", _I32),
        ("page_size", _I32),
        ("kv_layout", _I32),
        ("rows_per_item", _I32),
        ("num_ctas", _I32),
        ("merge_ctas", _I32),
        ("flags", _I32),
        ("sm_scale", ctypes.c_float),
        ("variant_params", _P),
        ("variant_params_size", _I64),
    ]


class DecodeModule:
    """A loaded decode library: the launcher plus the variant it was generated for."""

    def __init__(self, module_id: str, lib: ctypes.CDLL, ir: object, name: str) -> None:
        self.module_id = module_id
        self.lib = lib
        self.ir = ir
        self.name = name
        self.params_type = abi.params_struct(ir.params)  # type: ignore[attr-defined]
        self._launch = lib.attnc_decode

    def shape(self, head_dim: int, rows_needed: int) -> tuple[int, int, int]:
        """(rows per work item, KV tokens per CTA tile, CTAs per SM) on the current device."""
        out = (ctypes.c_int32 * 3)()
        rc = self.lib.attnc_decode_shape(head_dim, rows_needed, out)
        if rc != 0:
            raise RuntimeError(
                f"attnc: decode module {self.name}: shape query failed ({abi.error_name(rc)})"
            )
        return int(out[0]), int(out[1]), int(out[2])

    def launch(self, args_ref: object, stream: int) -> None:
        """Call ``attnc_decode``; a non-zero return code becomes a RuntimeError."""
        rc = self._launch(args_ref, stream)
        if rc != 0:
            raise RuntimeError(
                f"attnc: decode module {self.name} failed with code {rc} ({abi.error_name(rc)})"
            )


def _declare(lib: ctypes.CDLL) -> None:
    lib.attnc_decode.argtypes = [ctypes.POINTER(AttncDecodeArgs), ctypes.c_void_p]
    lib.attnc_decode.restype = ctypes.c_int
    lib.attnc_decode_abi_version.argtypes = []
    lib.attnc_decode_abi_version.restype = ctypes.c_int
    lib.attnc_decode_shape.argtypes = [_I32, _I32, ctypes.POINTER(_I32)]
    lib.attnc_decode_shape.restype = ctypes.c_int


def _render_decode(ir: object, dtype: str, head_dim: int) -> str:
    from attnc.codegen.decode_module import render_decode_module

    return render_decode_module(ir, dtype, head_dim)  # type: ignore[arg-type]


DECODE_MODULES: ModuleRegistry[DecodeModule] = ModuleRegistry(
    "decode",
    _render_decode,
    DecodeModule,
    _declare,
    "attnc_decode_abi_version",
    DECODE_ABI_VERSION,
    name_infix="_decode",
)
load_decode_module = DECODE_MODULES.load
decode_module_by_id = DECODE_MODULES.by_id
get_decode_module = DECODE_MODULES.get
