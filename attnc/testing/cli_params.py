"""Owns: turning ``attnc test --param NAME=VALUE`` text into checked param values.

Each value is parsed by its declared type and then goes through the same checks as the
Python API (``attnc.runtime.checks.params``): unknown names get a did-you-mean, i32 values
must fit in 32 bits, and tensor params cannot be set from the command line. Every error is a
``ValueError`` naming the param.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attnc.compiler import ir
from attnc.dsl.errors import printable
from attnc.dsl.literals import F32_OVERFLOW, FLOAT_TEXT, INTEGER_TEXT, short_text
from attnc.runtime.checks.params import check_plan_params, describe_decl

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def split_assignment(text: str) -> tuple[str, str]:
    """``"NAME=VALUE"`` -> ``("NAME", "VALUE")``, both stripped."""
    if "=" not in text:
        raise ValueError(f"--param expects NAME=VALUE, got '{printable(text)}'")
    name, value = text.split("=", 1)
    name, value = name.strip(), value.strip()
    if not name:
        raise ValueError(f"--param expects NAME=VALUE, got '{printable(text)}' (no name)")
    return name, value


def parse_value(decl: ir.ParamDecl, text: str, variant_name: str) -> object:
    """The value of ``decl`` written as ``text``; a ``ValueError`` naming the param otherwise."""
    where = f"variant '{variant_name}': --param {decl.name} ({describe_decl(decl)})"
    if decl.kind == "tensor":
        raise ValueError(
            f"{where}: a tensor param cannot be set on the command line "
            "(the test draws random tensors); set scalar params only"
        )
    if decl.dtype == ir.BOOL:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{where}: expected true or false, got '{printable(text)}'")
    if decl.dtype == ir.I32:
        if INTEGER_TEXT.fullmatch(text) is None:  # int() would also read "١٢٨" as 128
            raise ValueError(f"{where}: expected an integer, got '{printable(text)}'")
        if len(text.lstrip("+-").lstrip("0")) > 10:  # int() refuses more than 4300 digits
            raise ValueError(
                f"{where}: '{printable(short_text(text, 40))}' is out of the i32 range"
            )
        return int(text)
    if FLOAT_TEXT.fullmatch(text) is None:  # float() would also read "١٢", "1_0", " 1"
        raise ValueError(f"{where}: expected a number, got '{printable(text)}'")
    try:
        value = float(text)
    except ValueError:  # not reached by FLOAT_TEXT's texts; kept as a named error
        raise ValueError(
            f"{where}: expected a number, got '{printable(short_text(text, 40))}'"
        ) from None
    if math.isfinite(value):
        in_range = abs(value) < F32_OVERFLOW  # as the Python API: what float32 rounds to a number
    else:  # written inf or nan is taken, as by the Python API; 1e400 is not
        in_range = text.lower().lstrip("+-") in ("inf", "infinity", "nan")
    if not in_range:
        raise ValueError(f"{where}: '{printable(short_text(text, 40))}' is out of the f32 range")
    return value


def fixed_params(
    variants: Sequence[ir.VariantIR], assignments: Sequence[str]
) -> dict[str, dict[str, object]]:
    """Per variant name, the checked values of the ``--param`` assignments it declares.

    A name no variant in ``variants`` declares is an error with a did-you-mean (checked
    against the first variant's params when several are tested)."""
    pairs = [split_assignment(a) for a in assignments]
    names = [n for n, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--param: {printable(twice[0])} is given more than once")
    declared = {p.name for v in variants for p in v.params}
    result: dict[str, dict[str, object]] = {}
    for v in variants:
        raw = {n: t for n, t in pairs if n in declared and _has(v, n)}
        unknown = {n: t for n, t in pairs if n not in declared}
        typed = {n: parse_value(v.param(n), t, v.name) for n, t in raw.items()}
        result[v.name] = check_plan_params(v.params, {**unknown, **typed}, variant_name=v.name)
    return result


def _has(v: ir.VariantIR, name: str) -> bool:
    return any(p.name == name for p in v.params)
