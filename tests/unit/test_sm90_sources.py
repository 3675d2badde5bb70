"""The sources of each Hopper prefill module render (no nvcc): one source, or two for a module
with a three-consumer kernel, whose main source names the second."""

from __future__ import annotations

import pytest

from attnc.codegen.module import sm90_has_three_consumer_kernel
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names
from attnc.runtime.build import modules


@pytest.mark.parametrize("name", stdlib_names())
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_stdlib_module_renders(name: str, head_dim: int) -> None:
    variant = compile_source(*resolve_source(f"stdlib:{name}"))[0][0].variant
    spec = modules.PREFILL_SM90_MODULES.spec(variant, "bfloat16", head_dim, "90a")
    split = sm90_has_three_consumer_kernel(variant, head_dim)
    assert len(spec.parts) == (1 if split else 0)
    assert ("#define ATTNC_SM90_WIDE_ELSEWHERE 1" in spec.source) == split
    assert "ATTNC_DEFINE_PREFILL_SM90_MODULE(" in spec.source
    for part in spec.parts:
        assert "ATTNC_DEFINE_PREFILL_SM90_WIDE(" in part
        assert "ATTNC_DEFINE_PREFILL_SM90_MODULE(" not in part
        assert "tile_map" not in part  # its kernels are the main source's alone
