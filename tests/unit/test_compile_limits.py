"""Shared sub-expressions stay shared (a DAG, not a tree) through every pass, deep files
compile without Python recursion errors, and each size limit is a located error naming it."""

from __future__ import annotations

import math
import time

import pytest
import torch

from attnc.codegen.functor import emit_functor
from attnc.codegen.stages import emit_ast, emit_stage
from attnc.codegen.torch_ref import emit_reference_source, load_reference
from attnc.compiler.evaluate import evaluate
from attnc.compiler.pipeline import compile_source
from attnc.dsl.errors import AttnError
from attnc.dsl.limits import MAX_IMPORT_DEPTH, MAX_PARAMS
from attnc.dsl.parser import grammar_parser


def compile_timed(text: str):
    grammar_parser()  # built once per process; not part of checking a file
    start = time.perf_counter()
    compiled, _ = compile_source(text, "deep.attn")
    c = compiled[0]
    functor, reference = emit_functor(c), emit_reference_source(c.variant)
    return c, functor, reference, time.perf_counter() - start


def doubling_defs(n: int, step: str) -> str:
    lines = ["def g0(x) = x;"]
    lines += [f"def g{i}(x) = {step.format(p=f'g{i - 1}(x)')};" for i in range(1, n + 1)]
    return "\n".join(lines)


def test_forty_nested_doubling_defs_check_quickly() -> None:
    src = doubling_defs(40, "{p} + {p}") + "\nvariant d { score = g40(score); }"
    c, functor, reference, seconds = compile_timed(src)
    assert seconds < 1.0
    assert evaluate(c.variant.score, {"score": 0.5}) == 0.5 * 2.0**40
    assert len(functor) < 20_000 and len(reference) < 20_000


def test_doubling_defs_sympy_cannot_fold_stay_a_dag() -> None:
    src = doubling_defs(40, "tanh({p}) * {p}") + "\nvariant d { score = g40(score); }"
    c, functor, reference, seconds = compile_timed(src)
    assert seconds < 1.0
    assert len(functor) < 40_000 and len(reference) < 40_000
    module = load_reference(c.variant)
    env = {"score": torch.tensor([0.9, -1.2], dtype=torch.float64)}
    env["sm_scale"] = torch.tensor(1.0, dtype=torch.float64)
    got = module.score(env, {})
    want = [evaluate(c.variant.score, {"score": x}) for x in (0.9, -1.2)]
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    assert all(math.isfinite(x) for x in want)


def test_printing_a_deep_dag_names_shared_parts(tmp_path) -> None:
    src = doubling_defs(40, "tanh({p}) * {p}") + "\nvariant d { score = g40(score); }"
    c, _, _, _ = compile_timed(src)
    for stage in ("ir", "opt"):
        _, text = emit_stage(c, stage)
        assert "score = let %0 = " in text and "%1 = tanh(%0) * %0," in text
        assert len(text) < 10_000
    path = tmp_path / "sum.attn"
    path.write_text("variant s { score = score + " + " + ".join(["1.0"] * 1500) + "; }")
    assert emit_ast(str(path)).count("1.0") == 1500


def test_six_hundred_chained_lets() -> None:
    lets = "\n".join(f"    let a{i} = tanh(a{i - 1}) + 0.5;" for i in range(1, 601))
    src = f"variant l {{\n    let a0 = score;\n{lets}\n    score = a600;\n}}"
    c, functor, reference, seconds = compile_timed(src)
    assert seconds < 5.0  # ~2 s on 2 cores: 600 SymPy rewrites of tanh(a) + 0.5
    x = 0.3
    for _ in range(600):
        x = math.tanh(x) + 0.5
    assert evaluate(c.variant.score, {"score": 0.3}) == pytest.approx(x, rel=1e-12)


def test_too_many_chained_lets_is_a_located_error_naming_the_limit() -> None:
    lets = "\n".join(f"    let a{i} = tanh(a{i - 1}) + 0.5;" for i in range(1, 1101))
    src = f"variant l {{\n    let a0 = score;\n{lets}\n    score = a1100;\n}}"
    with pytest.raises(AttnError) as err:
        compile_source(src, "deep.attn")
    assert err.value.message == (
        "expression (after substituting lets and defs) nested too deeply "
        "(more than 2000 levels, the limit)"
    )
    assert err.value.loc.file == "deep.attn" and err.value.loc.line == 1002


@pytest.mark.parametrize("terms", [201, 1500])
def test_long_flat_sums_compile(terms: int) -> None:
    body = " + ".join(f"float(kv_idx) * {i}.0" for i in range(terms))
    c, _, _, _ = compile_timed(f"variant s {{ score = score + {body}; }}")
    want = 1.5 + 2.0 * sum(range(terms))
    assert evaluate(c.variant.score, {"score": 1.5, "kv_idx": 2}) == pytest.approx(want)


def test_too_long_sum_is_a_located_error_naming_the_limit() -> None:
    body = " + ".join(["kv_idx"] * 2100)
    with pytest.raises(AttnError) as err:
        compile_source(f"variant s {{\n mask = {body} > 0;\n}}", "deep.attn")
    assert err.value.message == "expression nested too deeply (more than 2000 levels, the limit)"
    assert err.value.loc.line == 2


def import_chain(folder, files: int) -> str:
    """``files`` files, each importing the next; the source of a variant importing the first."""
    for i in range(files):
        head = f'import "m{i + 1}.attn";\n' if i + 1 < files else ""
        (folder / f"m{i}.attn").write_text(f"{head}def g{i}() = 1.0;\n", encoding="utf-8")
    return 'import "m0.attn";\nvariant v { score = score * g0(); }\n'


def test_a_hundred_chained_imports_compile(tmp_path) -> None:
    source = import_chain(tmp_path, MAX_IMPORT_DEPTH)
    compiled, _ = compile_source(source, str(tmp_path / "top.attn"))
    assert compiled[0].variant.name == "v"


def test_too_long_import_chain_is_a_located_error_naming_the_limit(tmp_path) -> None:
    # A thousand levels once ran out of Python stack while parsing a valid file, reported
    # as "not valid .attn text" at some import in the middle.
    source = import_chain(tmp_path, 1000)
    with pytest.raises(AttnError) as info:
        compile_source(source, str(tmp_path / "top.attn"))
    last = MAX_IMPORT_DEPTH - 1
    assert info.value.loc.file == str(tmp_path / f"m{last}.attn")
    assert info.value.message == (
        f"imports nested too deeply (more than {MAX_IMPORT_DEPTH} levels, the limit)"
    )


def params_source(count: int) -> str:
    decls = "\n".join(f"    param p{i}: f32 = 0.0;" for i in range(count))
    return f"variant v {{\n{decls}\n    score = score + p0 + p{count - 1};\n}}\n"


def test_the_most_params_compile() -> None:
    compiled, _ = compile_source(params_source(MAX_PARAMS), "many.attn")
    assert len(compiled[0].variant.params) == MAX_PARAMS


def test_too_many_params_is_a_located_error_naming_the_limit() -> None:
    # 9000 f32 params compiled, then failed in nvcc: "Formal parameter space overflowed
    # (36264 bytes required, max 32764 bytes allowed)" for every kernel of the module.
    with pytest.raises(AttnError) as info:
        compile_source(params_source(9000), "many.attn")
    assert (info.value.loc.file, info.value.loc.line) == ("many.attn", MAX_PARAMS + 2)
    assert (
        info.value.message == f"too many params (more than {MAX_PARAMS}, the limit of one variant)"
    )
