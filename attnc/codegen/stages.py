"""Text of each ``attnc compile --emit`` stage."""

from __future__ import annotations

import hashlib
import json

from attnc.codegen.functor import emit_functor, param_fields
from attnc.codegen.params_layout import ParamField
from attnc.codegen.torch_ref import emit_reference_source
from attnc.compiler import ir
from attnc.compiler.bias_step import bias_step
from attnc.compiler.hoist import hoistable, level
from attnc.compiler.index_range import checked_loads
from attnc.compiler.ir_printer import format_ir, format_variant
from attnc.compiler.pipeline import Compiled, parse, resolve_source
from attnc.dsl.limits import deep_recursion
from attnc.dsl.printer import format_module


def emit_ast(spec: str) -> str:
    """The parsed file printed back as canonical source."""
    text, file = resolve_source(spec)
    with deep_recursion():
        return format_module(parse(text, file))


# Longest variant name a stage's file name holds whole (file systems allow 255 bytes).
MAX_FILE_STEM = 80


def emit_stage(c: Compiled, stage: str) -> tuple[str, str]:
    """(file name, text) of ``stage`` (ir, opt, cuda, torch) for one compiled variant. A
    variant name past :data:`MAX_FILE_STEM` characters is cut and given a digest of itself,
    so the file name stays short and distinct."""
    with deep_recursion():  # the analyses of --emit opt recurse once per && term
        return _emit_stage(c, stage, _file_stem(c.variant.name))


def _file_stem(name: str) -> str:
    if len(name) <= MAX_FILE_STEM:
        return name
    return f"{name[: MAX_FILE_STEM - 17]}_{hashlib.sha256(name.encode()).hexdigest()[:16]}"


def _emit_stage(c: Compiled, stage: str, name: str) -> tuple[str, str]:
    if stage == "ir":
        return f"{name}.ir", format_variant(c.lowered)
    if stage == "opt":
        return f"{name}.opt", format_variant(c.variant) + _analyses(c)
    if stage == "cuda":
        return f"{name}.cuh", emit_functor(c, c.variant.file)
    if stage == "torch":
        return f"{name}_reference.py", emit_reference_source(c.variant)
    if stage == "params":
        return f"{name}.params.json", params_json(c.variant)
    raise ValueError(f"unknown stage '{stage}'")


def params_json(v: ir.VariantIR) -> str:
    """The runtime param list as JSON: name, kind, dtype, shape, default and the C field."""
    rows = [
        {
            "name": p.name,
            "kind": p.kind,
            "dtype": p.dtype,
            "shape": list(p.dims),
            "default": p.default,
            "required": p.required,
            "c_field": f.c_name,
            "c_type": f.c_type,
        }
        for p, f in zip(v.params, _user_fields(v), strict=True)
    ]
    return json.dumps({"variant": v.name, "params": rows}, indent=2) + "\n"


def _user_fields(v: ir.VariantIR) -> list[ParamField]:
    return [f for f in param_fields(v) if f.param is not None]


def _analyses(c: Compiled) -> str:
    lines = ["  analyses:"]
    a = c.affine
    if a is None:
        lines.append("    score: not affine (transform evaluated per element)")
    elif a.identity:
        lines.append("    score: identity (folded into the exp2 scale)")
    else:
        lines.append(f"    score: affine, scale = {format_ir(a.scale)}, bias = {format_ir(a.bias)}")
        step = bias_step(a.bias)
        if step is not None:
            lines.append(f"    bias: linear in kv_idx, step per key = {format_ir(step)}")
    lines.append(f"    mask: {c.mask_analysis.describe()}")
    hoisted: list[ir.Expr] = []
    for e in (c.variant.score, c.variant.mask, c.variant.output):
        if e is not None:
            hoisted.extend(x for x in hoistable(e, ir.ELEMENT) if x not in hoisted)
    for x in hoisted:
        lines.append(f"    hoisted to {ir.LEVEL_NAMES[level(x)]}: {format_ir(x)}")
    for load in checked_loads(c.variant):
        lines.append(f"    bounds-checked read (0 outside the shape): {format_ir(load)}")
    return "\n".join(lines) + "\n"
