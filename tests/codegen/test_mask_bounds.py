"""The generated ``mask_bounds`` (attnc/codegen/mask_bounds_cuda.py, attnc/mask_bounds.cuh):
the mask of a variant that reads per-token tensors, evaluated over a whole box in intervals,
lets the tile-map classifier call boxes EMPTY or FULL without scanning their pairs. Over
masks that use every operation the bounds follow (and some they do not), random token
tensors (sorted like packed documents, and unsorted) and random lengths and tiles, the map
built with the bounds equals the map of the exact scan of every pair (also with values at
the ends of the i32 range, where the mask's arithmetic wraps, and with queries before the
keys, whose tensor reads give 0), and on packed documents the bounds decide most boxes the
closed forms leave open."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import attnc
from tests.codegen.test_page_check_sass import sass_of

INCLUDE = Path(attnc.__file__).parent / "kernels" / "include"
FIXTURES = Path(__file__).parent / "fixtures" / "tile_map"

PARAMS = """    param doc: tensor<i32>[kv_len];
    param tag: tensor<i32>[q_len];
    param w: tensor<i32>[batch_size];
"""
MASKS = {
    "doc_causal": "kv_idx <= q_pos && doc[kv_idx] == doc[q_pos]",
    "doc_window": "kv_idx <= q_pos && q_pos - kv_idx < w[batch] && doc[kv_idx] == doc[q_pos]",
    "near_docs": "doc[kv_idx] <= doc[q_pos] + 1 && doc[q_pos] - 2 < doc[kv_idx]",
    "tag_or_far": "doc[kv_idx] != tag[q_idx] || kv_idx * 2 > q_pos + 3",
    "by_head": "!(doc[kv_idx] > 2) && "
    "(qo_head % 2 == 0 ? kv_idx <= q_pos : doc[kv_idx] - tag[q_idx] >= -1)",
    "products": "doc[kv_idx] * doc[q_pos] < 6 && kv_idx >= q_pos - 50 && "
    "max(doc[kv_idx], tag[q_idx]) > min(w[batch], 3) - 1",
    "float_part": "float(doc[kv_idx]) * 0.5 < 1.0 || kv_idx > q_pos - w[batch]",
    "division": "doc[kv_idx] / 2 == doc[q_pos] / 2 && kv_idx <= q_pos",
}


def source(name: str) -> str:
    return f"variant {name} {{\n{PARAMS}    mask = {MASKS[name]};\n}}"


@pytest.fixture(scope="module")
def binaries(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    out = tmp_path_factory.mktemp("mask_bounds")
    exes = {}
    for name in MASKS:
        code = attnc.load(source=source(name)).cuda_source
        assert "mask_bounds(" in code
        (out / f"{name}.cuh").write_text(code)
        struct = code.split("struct ", 1)[1].split(" ", 1)[0]
        src = out / f"{name}.cpp"
        src.write_text(
            f'#include "{name}.cuh"\n#define FUNCTOR {struct}\n'
            f"{struct}::Params make_params(const int* doc, const int* tag, const int* w) {{\n"
            f"  return {struct}::Params{{doc, tag, w}};\n}}\n"
            f'#include "{FIXTURES}/bounds_host_main.cpp"\n'
        )
        exe = out / name
        cmd = ["g++", "-O1", "-std=c++17", f"-I{INCLUDE}", str(src), "-o", str(exe)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        exes[name] = exe
    return exes


def maps(exe: Path, q_lens, kv_lens, doc, tag, w, tile, block, heads) -> list[str]:
    """The three map lines of bounds_host_main: as built, scan only, bounds alone."""
    numbers = [len(q_lens), tile, block, 4, 2, heads, *q_lens, *kv_lens, *doc, *tag, *w]
    done = subprocess.run(
        [str(exe)], input=" ".join(map(str, numbers)), capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def random_batch(rng: np.random.Generator, sorted_docs: bool):
    batch = int(rng.integers(1, 4))
    kv_lens = [int(x) for x in rng.integers(1, 300, batch)]
    q_lens = [int(rng.integers(1, k + 1)) for k in kv_lens]
    doc = []
    for k in kv_lens:
        if sorted_docs:
            cuts = np.sort(rng.integers(0, k, int(rng.integers(0, 5))))
            ids = np.zeros(k, dtype=np.int64)
            for c in cuts:
                ids[c:] += 1
        else:
            ids = rng.integers(-1, 5, k)
        doc += [int(x) for x in ids]
    tag = [int(x) for x in rng.integers(-1, 5, sum(q_lens))]
    w = [int(x) for x in rng.integers(1, 120, batch)]
    return q_lens, kv_lens, doc, tag, w


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("seed", range(4))
def test_bounds_never_change_the_map(binaries, name: str, seed: int) -> None:
    """A box the bounds call EMPTY or FULL is so for every pair: the built map equals the
    scan of every pair, for sorted and unsorted token values."""
    rng = np.random.default_rng(1000 * seed + len(name))
    for sorted_docs in (True, False):
        q_lens, kv_lens, doc, tag, w = random_batch(rng, sorted_docs)
        tile = int(rng.choice([1, 16, 37, 64, 128]))
        block = int(rng.choice([17, 32, 64, 128]))
        heads = 4 if name == "by_head" else 1
        built, scanned, bounds = maps(
            binaries[name], q_lens, kv_lens, doc, tag, w, tile, block, heads
        )
        assert built == scanned
        decided = [i for i, c in enumerate(bounds) if c != "2"]
        assert all(bounds[i] == scanned[i] for i in decided)


def test_bounds_decide_packed_document_boxes(binaries) -> None:
    """Packed documents (8 of random lengths in 2048 tokens): every box inside one
    document's causal triangle or between two documents is decided by the bounds, leaving
    only boxes that hold a document boundary or the diagonal to the scan."""
    rng = np.random.default_rng(7)
    cuts = np.sort(rng.choice(np.arange(1, 2048), 7, replace=False))
    doc = np.zeros(2048, dtype=np.int64)
    for c in cuts:
        doc[c:] += 1
    args = ([2048], [2048], [int(x) for x in doc], [0] * 2048, [1], 64, 64, 1)
    built, scanned, bounds = maps(binaries["doc_causal"], *args)
    assert built == scanned
    undecided = [i for i, c in enumerate(bounds) if c == "2"]
    assert all(scanned[i] == "2" for i in undecided), "a box the bounds left open is exact"
    assert len(undecided) <= 32 + 2 * 7 * 32  # the diagonal, and a row and a column per cut
    assert bounds.count("1") > 0 and bounds.count("0") > 0


def test_what_the_bounds_do_not_follow_stays_open(binaries) -> None:
    """f32 and i32 division parts are unknown: boxes whose class hangs on them are left to
    the scan, never guessed."""
    q_lens, kv_lens = [64], [64]
    doc, tag, w = [0] * 64, [0] * 64, [1]
    for name in ("float_part", "division"):
        built, scanned, bounds = maps(binaries[name], q_lens, kv_lens, doc, tag, w, 64, 64, 1)
        assert built == scanned
    # float_part: float(0) * 0.5 < 1.0 holds everywhere (the box is FULL), but the bounds
    # cannot know it, and kv_idx > q_pos - 1 holds on part of the box only.
    built, _, bounds = maps(binaries["float_part"], q_lens, kv_lens, doc, tag, w, 64, 64, 1)
    assert (built, bounds) == ("1", "2")


NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "arch", [["-arch=sm_80"], ["-gencode=arch=compute_90a,code=sm_90a"]], ids=["sm80", "sm90a"]
)
@pytest.mark.parametrize("name", ["doc_window", "by_head"])
def test_classifier_with_bounds_compiles_without_local_memory(tmp_path, arch, name) -> None:
    """The map kernel over a generated functor (warp-split tensor reads, shuffled minima and
    maxima) compiles for sm_80 and sm_90a with no local memory."""
    if not Path(NVCC).exists():
        pytest.skip("needs nvcc")
    code = attnc.load(source=source(name)).cuda_source
    struct = code.split("struct ", 1)[1].split(" ", 1)[0]
    src = tmp_path / "map.cu"
    src.write_text(
        f'#include "attnc/tile_map_builder.cuh"\n{code}\nATTNC_DEFINE_TILE_MAP_BUILDER({struct})\n'
    )
    cubin = tmp_path / "map.cubin"
    cmd = [NVCC, "-cubin", "-O3", "-std=c++17", *arch, f"-I{INCLUDE}", str(src), "-o", str(cubin)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    sass = sass_of(cubin)
    assert "tile_map_kernel" in sass and "SHFL.BFLY" in sass
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.parametrize("name", ["near_docs", "products", "tag_or_far", "doc_window"])
def test_values_at_the_i32_limits(binaries, name: str) -> None:
    """Token values at the ends of the i32 range, where the mask's arithmetic wraps
    (``doc[q_pos] + 1``, products): the bounds give up there instead of deciding from a
    range that the wrapped values leave; the map equals the scan of every pair."""
    rng = np.random.default_rng(5)
    extremes = np.array([-(2**31), -(2**31) + 1, -1, 0, 1, 2**31 - 2, 2**31 - 1])
    for _ in range(3):
        q_lens, kv_lens = [int(rng.integers(20, 200))], [0]
        kv_lens[0] = q_lens[0] + int(rng.integers(0, 60))
        doc = [int(x) for x in rng.choice(extremes, kv_lens[0])]
        tag = [int(x) for x in rng.choice(extremes, q_lens[0])]
        w = [int(rng.choice([1, 2**31 - 1]))]
        built, scanned, _ = maps(binaries[name], q_lens, kv_lens, doc, tag, w, 16, 32, 1)
        assert built == scanned
        # Runs of one extreme value: boxes the bounds decide, next to ones they cannot.
        doc = [int(extremes[i * len(extremes) // kv_lens[0]]) for i in range(kv_lens[0])]
        built, scanned, _ = maps(binaries[name], q_lens, kv_lens, doc, tag, w, 16, 32, 1)
        assert built == scanned


@pytest.mark.parametrize("name", ["near_docs", "tag_or_far", "products"])
def test_queries_before_the_keys_read_zero(binaries, name: str) -> None:
    """q_len > kv_len: the first rows' q_pos is negative and a kv_len tensor read there is 0
    (in the kernels and the reference); the bounds take that 0 into the query tile's span."""
    rng = np.random.default_rng(11)
    for kv_len in (5, 40, 100):
        q_len = kv_len + int(rng.integers(1, 90))
        for values in ([5] * kv_len, [int(x) for x in rng.integers(-3, 7, kv_len)]):
            tag = [int(x) for x in rng.integers(-1, 5, q_len)]
            built, scanned, _ = maps(binaries[name], [q_len], [kv_len], values, tag, [3], 16, 32, 1)
            assert built == scanned
