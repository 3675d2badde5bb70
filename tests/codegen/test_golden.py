"""The generated CUDA functor and PyTorch reference of every stdlib variant equal the golden
files in tests/codegen/golden/ (``pytest --update-golden`` rewrites them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnc.codegen.stages import emit_stage
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names

GOLDEN = Path(__file__).resolve().parent / "golden"
STAGES = [("cuda", "{name}.cuh"), ("torch", "{name}_reference.py")]


def generated(name: str, stage: str) -> tuple[str, str]:
    compiled, _ = compile_source(*resolve_source(f"stdlib:{name}"))
    assert [c.variant.name for c in compiled] == [name]
    return emit_stage(compiled[0], stage)


@pytest.mark.parametrize("stage, pattern", STAGES, ids=[s for s, _ in STAGES])
@pytest.mark.parametrize("name", stdlib_names())
def test_golden(name: str, stage: str, pattern: str, update_golden: bool) -> None:
    fname, text = generated(name, stage)
    assert fname == pattern.format(name=name)
    path = GOLDEN / fname
    if update_golden:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.is_file(), f"missing golden file {path}; run pytest --update-golden"
    assert text == path.read_text(encoding="utf-8"), (
        f"generated {stage} of '{name}' differs from {path}; if the change is intended, "
        "run pytest tests/codegen/test_golden.py --update-golden and review the diff"
    )


def test_no_stale_golden_files() -> None:
    expected = {p.format(name=n) for n in stdlib_names() for _, p in STAGES}
    found = {p.name for p in GOLDEN.iterdir() if p.suffix in (".cuh", ".py")}
    assert found == expected


def test_generation_is_deterministic() -> None:
    for name in stdlib_names():
        for stage, _ in STAGES:
            assert generated(name, stage) == generated(name, stage)
