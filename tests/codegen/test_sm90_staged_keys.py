"""Which Hopper kernels stage key values (sm90/staged_keys.cuh), compiled without a GPU: a
variant whose key values fit beside the stages gets shapes with ``KEY_BYTES`` =
``sizeof(V::KeyValues)``, reads a lane's pair of keys from shared memory as one vector and
prefetches the reads into L1 only ahead of the producer's own; eight reads summed into the
score are one value a key (before key terms, eight values: their kernels spilled 168 and 48
bytes of stack). One whose values would not fit (eight separate conditions: 32 bytes a key)
keeps ``KEY_BYTES`` 0, the consumers' own reads and the producer's L1 prefetch after each
stage."""

from __future__ import annotations

import re

import pytest
from test_sm90_compile import dump_sass, launcher_tu, nvcc_compile, sm90_kernel_resources
from test_sm90_compile import pytestmark as compile_marks

from attnc.compiler.pipeline import compile_source

pytestmark = compile_marks  # nvcc, skipped without it

EIGHT_READS = " + ".join(f"t[(kv_idx + {i}) % 64]" for i in range(8))
EIGHT_TERMS = " && ".join(f"t[(kv_idx + {i}) % 64] > -2.0" for i in range(8))
SOURCE = f"""
variant one_read {{
    param t: tensor<f32>[kv_len];
    score = score + t[kv_idx];
    mask = kv_idx <= q_pos;
}}
variant eight_reads {{
    param t: tensor<f32>[64];
    score = score + {EIGHT_READS};
    mask = kv_idx <= q_pos;
}}
variant eight_terms {{
    param t: tensor<f32>[64];
    mask = kv_idx <= q_pos && {EIGHT_TERMS};
}}
"""
SHAPE = re.compile(r"PrefillSm90ShapeILi128ELi(\d)ELi(\d+)ELi(\d+)E")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("staged_keys")
    compiled, _ = compile_source(SOURCE, "staged.attn")
    tu = tmp / "staged.cu"
    tu.write_text(launcher_tu(compiled, "__nv_bfloat16", 128))
    log = nvcc_compile(tu, tmp / "staged.o")
    return log, dump_sass(tmp / "staged.o")


def _kernels(sass: dict[str, str], variant: str) -> dict[tuple[int, int, int], str]:
    out = {}
    for name, body in sass.items():
        if "prefill_sm90_kernel" in name and f"Variant_{variant}" in name:
            consumers, keys, key_bytes = SHAPE.search(name).groups()  # type: ignore[union-attr]
            out[(int(consumers), int(keys), int(key_bytes))] = body
    return out


@pytest.mark.parametrize("variant", ["one_read", "eight_reads"])  # eight reads: one sum a key
def test_one_value_a_key_is_staged_in_both_shapes(built, variant):
    _, sass = built
    kernels = _kernels(sass, variant)
    assert sorted(kernels) == [(2, 128, 4), (3, 80, 4)]
    for body in kernels.values():
        # pairs of keys read from shared memory; their L1 prefetch ahead of the producer's reads
        assert "LDS.64" in body and "CCTL.E.PF1" in body


def test_eight_values_a_key_do_not_fit_and_are_prefetched(built):
    _, sass = built
    kernels = _kernels(sass, "eight_terms")
    assert sorted(kernels) == [(2, 128, 0), (3, 80, 0)]
    for body in kernels.values():
        assert "CCTL.E.PF1" in body and "LDS.64" not in body


def test_staged_kernels_do_not_spill(built):
    log, _ = built
    rows = [r for r in sm90_kernel_resources(log) if "Variant_eight_terms" not in r[0]]
    assert len(rows) == 4 and all(r[1:] == (0, 0, 0) for r in rows), rows
