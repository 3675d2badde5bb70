"""The compiler pipeline: a list of named stages, each of which ``--emit`` can stop after.

parse -> imports -> lower -> (verify) -> simplify -> (verify) -> analyse.
"""

from __future__ import annotations

from attnc.compiler import ir
from attnc.compiler.affine import analyse_affine
from attnc.compiler.import_paths import ImportRecord
from attnc.compiler.imports import load_modules
from attnc.compiler.lower import Program, lower_modules
from attnc.compiler.mask_analysis import analyse_mask
from attnc.compiler.results import Compiled, remember
from attnc.compiler.simplify import simplify_variant
from attnc.compiler.sources import STDLIB_DIR, STDLIB_PREFIX, resolve_source, stdlib_names
from attnc.compiler.verify import verify_variant
from attnc.dsl import ast
from attnc.dsl.errors import Diagnostic
from attnc.dsl.limits import deep_recursion
from attnc.dsl.parser import parse_module

__all__ = [
    "STDLIB_DIR",
    "STDLIB_PREFIX",
    "Compiled",
    "analyse",
    "compile_source",
    "compile_with_imports",
    "lower",
    "optimise",
    "parse",
    "resolve_source",
    "stdlib_names",
]


def parse(text: str, file: str) -> ast.Module:
    """Stage ``ast``."""
    return parse_module(text, file)


def lower(root: ast.Module) -> Program:
    """Stage ``ir``: imports resolved, names and types checked."""
    with deep_recursion():
        program = lower_modules(load_modules(root))
        for v in program.variants:
            verify_variant(v, "lowering")
    return program


def optimise(v: ir.VariantIR) -> Compiled:
    """Stage ``opt``: simplified IR plus affine and mask analyses."""
    with deep_recursion():
        simplified = simplify_variant(v)
        verify_variant(simplified, "simplify")
        return analyse(simplified, lowered=v)


def analyse(v: ir.VariantIR, lowered: ir.VariantIR | None = None) -> Compiled:
    """The analyses of already simplified IR ``v`` (``lowered``: the IR before simplify)."""
    with deep_recursion():
        affine, mask = analyse_affine(v.score), analyse_mask(v.mask)
    return remember(Compiled(lowered or v, v, affine, mask))


def compile_source(text: str, file: str) -> tuple[list[Compiled], tuple[Diagnostic, ...]]:
    """Every variant of the source through ``opt``, and the warnings."""
    compiled, warnings, _ = compile_with_imports(text, file)
    return compiled, warnings


def compile_with_imports(
    text: str, file: str
) -> tuple[list[Compiled], tuple[Diagnostic, ...], tuple[ImportRecord, ...]]:
    """``compile_source`` plus an :data:`~attnc.compiler.imports.ImportRecord` of every
    import statement met (transitively): the path, the file it named and the sha256 of the
    bytes that file was parsed from (not of the file now: an edit during the compile must not
    be taken for what was compiled)."""
    imports: list[ImportRecord] = []
    modules = load_modules(parse(text, file), imports)
    with deep_recursion():
        program = lower_modules(modules)
        for v in program.variants:
            verify_variant(v, "lowering")
    return [optimise(v) for v in program.variants], program.warnings, tuple(imports)
