"""Owns: the one description of a variant's ``Params`` struct layout.

The functor emitter writes the C++ struct from it and the runtime's ctypes packer builds its
mirror from it, so field order, C types, ctypes types and (mangled) field names cannot drift
apart. One field per param in declaration order: f32 -> ``float``, i32 and bool -> ``int``
(bool as 0 or 1), tensor -> a ``const float*`` / ``const int*`` device pointer. A variant
without params gets one ``int unused_`` member so both sides agree on a non-zero size.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from attnc.codegen.names import param_field
from attnc.compiler import ir

PLACEHOLDER_FIELD = "unused_"


@dataclass(frozen=True)
class ParamField:
    """One member of ``Params``: the param it holds (``param`` is None for the placeholder),
    its C++ name and type, its ctypes type and a comment for the generated header."""

    param: str | None
    c_name: str
    c_type: str
    ctypes_type: type
    kind: str
    dtype: str
    comment: str


def _field(p: ir.ParamDecl) -> ParamField:
    if p.kind == "tensor":
        c_type = "const float*" if p.dtype == ir.F32 else "const int*"
        comment = f"{p.type_text()}, dense row-major"
        return ParamField(
            p.name, param_field(p.name), c_type, ctypes.c_void_p, "tensor", p.dtype, comment
        )
    if p.dtype == ir.F32:
        return ParamField(
            p.name, param_field(p.name), "float", ctypes.c_float, "scalar", p.dtype, "f32"
        )
    comment = "bool (0 or 1)" if p.dtype == ir.BOOL else p.dtype
    return ParamField(
        p.name, param_field(p.name), "int", ctypes.c_int32, "scalar", p.dtype, comment
    )


def params_layout(params: Sequence[ir.ParamDecl]) -> tuple[ParamField, ...]:
    """The members of ``Params`` for ``params`` (a variant's ``params``), in order."""
    return _layout(tuple(params))


@lru_cache(maxsize=256)  # the runtime packs params on every call
def _layout(params: tuple[ir.ParamDecl, ...]) -> tuple[ParamField, ...]:
    fields = tuple(_field(p) for p in params)
    if fields:
        return fields
    return (
        ParamField(
            None,
            PLACEHOLDER_FIELD,
            "int",
            ctypes.c_int32,
            "scalar",
            ir.I32,
            "this variant has no params",
        ),
    )


def ctypes_fields(params: Sequence[ir.ParamDecl]) -> list[tuple[str, type]]:
    """``_fields_`` of a ctypes Structure laid out like the generated ``Params``."""
    return [(f.c_name, f.ctypes_type) for f in params_layout(params)]
