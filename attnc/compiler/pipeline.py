"""The compiler pipeline: a list of named stages, each of which ``--emit`` can stop after.

parse -> imports -> lower -> (verify) -> simplify -> (verify) -> analyse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from attnc.compiler import ir
from attnc.compiler.affine import AffineScore, analyse_affine
from attnc.compiler.imports import load_modules
from attnc.compiler.lower import Program, lower_modules
from attnc.compiler.mask_analysis import MaskAnalysis, analyse_mask
from attnc.compiler.simplify import simplify_variant
from attnc.compiler.verify import verify_variant
from attnc.dsl import ast
from attnc.dsl.errors import Diagnostic
from attnc.dsl.parser import parse_module

STDLIB_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "stdlib_variants")
STDLIB_PREFIX = "stdlib:"


@dataclass(frozen=True)
class Compiled:
    """One variant after every pass: unsimplified and optimised IR plus the analyses."""

    lowered: ir.VariantIR
    variant: ir.VariantIR
    affine: AffineScore | None
    mask_analysis: MaskAnalysis


def resolve_source(spec: str) -> tuple[str, str]:
    """(text, file name) of a path, ``stdlib:NAME`` or inline source text."""
    if spec.startswith(STDLIB_PREFIX):
        name = spec[len(STDLIB_PREFIX) :]
        path = os.path.join(STDLIB_DIR, f"{name}.attn")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no stdlib variant '{name}'; available: {', '.join(stdlib_names())}"
            )
        spec = path
    if "{" in spec or "\n" in spec:
        return spec, "<string>"
    shipped = os.path.join(os.path.dirname(STDLIB_DIR), spec)
    if not os.path.exists(spec) and spec.startswith("stdlib_variants/") and os.path.isfile(shipped):
        spec = shipped  # the package's own folder, as the docs spell it
    with open(spec, encoding="utf-8") as f:
        return f.read(), spec


def stdlib_names() -> list[str]:
    """Names of the shipped variant files (those defining at least one variant)."""
    names = []
    for fname in sorted(os.listdir(STDLIB_DIR)):
        if fname.endswith(".attn"):
            with open(os.path.join(STDLIB_DIR, fname), encoding="utf-8") as f:
                if "variant " in f.read():
                    names.append(fname[: -len(".attn")])
    return names


def parse(text: str, file: str) -> ast.Module:
    """Stage ``ast``."""
    return parse_module(text, file)


def lower(root: ast.Module) -> Program:
    """Stage ``ir``: imports resolved, names and types checked."""
    program = lower_modules(load_modules(root))
    for v in program.variants:
        verify_variant(v, "lowering")
    return program


def optimise(v: ir.VariantIR) -> Compiled:
    """Stage ``opt``: simplified IR plus affine and mask analyses."""
    simplified = simplify_variant(v)
    verify_variant(simplified, "simplify")
    return analyse(simplified, lowered=v)


def analyse(v: ir.VariantIR, lowered: ir.VariantIR | None = None) -> Compiled:
    """The analyses of already simplified IR ``v`` (``lowered``: the IR before simplify)."""
    return Compiled(lowered or v, v, analyse_affine(v.score), analyse_mask(v.mask))


def compile_source(text: str, file: str) -> tuple[list[Compiled], tuple[Diagnostic, ...]]:
    """Every variant of the source through ``opt``, and the warnings."""
    program = lower(parse(text, file))
    return [optimise(v) for v in program.variants], program.warnings
