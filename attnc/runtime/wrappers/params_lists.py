"""Owns: the way resolved param values cross a torch custom op boundary.

A custom op's schema takes typed lists, not a mapping, so under ``torch.compile`` the values
``checks.params.resolve_params`` returned travel as three lists (i32/bool ints, f32 floats,
tensors), each in declaration order, and are joined back inside the op before the one
``abi.fill_params`` that packs them. Eager calls never take this detour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def split_params(
    decls: Sequence[object], values: Mapping[str, object]
) -> tuple[list[int], list[float], list[torch.Tensor]]:
    """Resolved param values -> (i32/bool ints, f32 floats, tensors), each in decl order."""
    ints: list[int] = []
    floats: list[float] = []
    tensors: list[torch.Tensor] = []
    for decl in decls:
        value = values[decl.name]  # type: ignore[attr-defined]
        if decl.kind == "tensor":  # type: ignore[attr-defined]
            tensors.append(value)  # type: ignore[arg-type]
        elif decl.dtype == "f32":  # type: ignore[attr-defined]
            floats.append(value)  # type: ignore[arg-type]
        else:
            ints.append(int(value))  # type: ignore[call-overload]
    return ints, floats, tensors


def join_params(
    decls: Sequence[object], ints: list[int], floats: list[float], tensors: list[torch.Tensor]
) -> dict[str, object]:
    """The inverse of ``split_params``: one value per param name (bools come back as bool)."""
    it_i, it_f, it_t = iter(ints), iter(floats), iter(tensors)
    values: dict[str, object] = {}
    for decl in decls:
        if decl.kind == "tensor":  # type: ignore[attr-defined]
            values[decl.name] = next(it_t)  # type: ignore[attr-defined]
        elif decl.dtype == "f32":  # type: ignore[attr-defined]
            values[decl.name] = next(it_f)  # type: ignore[attr-defined]
        elif decl.dtype == "bool":  # type: ignore[attr-defined]
            values[decl.name] = bool(next(it_i))  # type: ignore[attr-defined]
        else:
            values[decl.name] = next(it_i)  # type: ignore[attr-defined]
    return values
