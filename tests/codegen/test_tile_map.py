"""The tile map classifier (attnc/tile_map.cuh): the CPU build of the same per-box scan the
kernel runs gives, for random documents, lengths, tile sizes and heads, exactly the brute-force
class of every (query tile, KV block) box (EMPTY: no visible pair, FULL: all visible); the
kernel compiles for sm_80 and sm_90a without local-memory spills."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import attnc
from tests.codegen.test_page_check_sass import sass_of

INCLUDE = Path(attnc.__file__).parent / "kernels" / "include"
FIXTURES = Path(__file__).parent / "fixtures" / "tile_map"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@pytest.fixture(scope="module")
def host_map_binary(tmp_path_factory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    out = tmp_path_factory.mktemp("tile_map")
    src = out / "main.cpp"
    src.write_text(
        '#include "token_mask_functor.h"\n#define FUNCTOR TokenMaskFunctor\n'
        "TokenMaskFunctor::Params make_params(const int* doc, int window, int by_head) {\n"
        "  return TokenMaskFunctor::Params{doc, window, by_head};\n}\n"
        '#include "tile_map_host_main.cpp"\n'
    )
    return _build_host(src, out / "tile_map_host")


def _build_host(src: Path, exe: Path) -> Path:
    cmd = ["g++", "-O2", "-std=c++17", f"-I{INCLUDE}", f"-I{FIXTURES}", str(src), "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return exe


DOC_CAUSAL = """variant doc_causal {
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}"""


@pytest.fixture(scope="module")
def generated_map_binary(tmp_path_factory) -> Path:
    """The host map over the functor generated for ``doc_causal``."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    variant = attnc.load(source=DOC_CAUSAL)
    out = tmp_path_factory.mktemp("tile_map_generated")
    (out / "doc_causal.cuh").write_text(variant.cuda_source)
    name = variant.cuda_source.split("struct ", 1)[1].split(" ", 1)[0]
    src = out / "main.cpp"
    src.write_text(
        f'#include "doc_causal.cuh"\n#define FUNCTOR {name}\n'
        f"{name}::Params make_params(const int* doc, int, int) "
        f"{{ return {name}::Params{{doc}}; }}\n"
        f'#include "{FIXTURES}/tile_map_host_main.cpp"\n'
    )
    return _build_host(src, out / "tile_map_host")


@pytest.mark.parametrize("seed", range(6))
def test_generated_functor_map_matches_brute_force(generated_map_binary: Path, seed: int) -> None:
    """The classifier over the generated doc_causal functor (the one the module exports)."""
    rng = np.random.default_rng(100 + seed)
    q_lens, kv_lens, doc = random_case(rng)
    tile = int(rng.choice([16, 64, 128, 37]))
    got = host_map(generated_map_binary, q_lens, kv_lens, doc, tile, 64, 4, 1, 1, 0, 0)
    assert got == brute_force_map(q_lens, kv_lens, doc, tile, 64, 1, 0, 0)


def brute_force_map(q_lens, kv_lens, doc, tile, block, heads, window, by_head) -> str:
    """The class digit of every box, from the mask evaluated on every pair (numpy)."""
    out: list[str] = []
    kv_start = np.concatenate([[0], np.cumsum(kv_lens)])
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens, strict=True)):
        d = doc[kv_start[b] : kv_start[b] + kl]
        q_pos = np.arange(ql) + kl - ql
        kv = np.arange(kl)
        visible = (kv[None, :] <= q_pos[:, None]) & (
            d[None, :] == d[np.clip(q_pos, 0, None)][:, None]
        )
        if window > 0:
            visible &= q_pos[:, None] - kv[None, :] < window
        per_head = np.stack(
            [visible & (((kv[None, :] + h) % 5 != 0) if by_head else True) for h in range(heads)]
        )
        for q0 in range(0, ql, tile):
            for k0 in range(0, kl, block):
                box = per_head[:, q0 : q0 + tile, k0 : k0 + block]
                out.append("0" if not box.any() else ("1" if box.all() else "2"))
    return "".join(out)


def host_map(
    exe: Path, q_lens, kv_lens, doc, tile, block, hq, hkv, heads, window, by_head, mode=""
) -> str:
    numbers = [len(q_lens), tile, block, hq, hkv, heads, window, by_head]
    numbers += list(q_lens) + list(kv_lens) + [int(x) for x in doc]
    done = subprocess.run(
        [str(exe), *([mode] if mode else [])],
        input=" ".join(map(str, numbers)),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def random_case(rng: np.random.Generator):
    batch = int(rng.integers(1, 4))
    kv_lens = rng.integers(0, 300, batch)
    q_lens = np.array([int(rng.integers(0, k + 1)) for k in kv_lens])
    docs = []
    for k in kv_lens:
        cuts = np.sort(rng.integers(0, max(int(k), 1), int(rng.integers(0, 5))))
        ids = np.zeros(int(k), dtype=np.int64)
        for c in cuts:
            ids[c:] += 1
        docs.append(ids)
    doc = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int64)
    return q_lens, kv_lens, doc


@pytest.mark.parametrize("seed", range(12))
def test_host_map_matches_brute_force(host_map_binary: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q_lens, kv_lens, doc = random_case(rng)
    tile = int(rng.choice([1, 16, 64, 128, 37]))
    block = int(rng.choice([64, 32, 17]))
    window = int(rng.choice([0, 0, 50]))
    by_head = int(seed % 3 == 0)
    hq, hkv = 4, 2
    heads = hq if by_head else 1
    got = host_map(
        host_map_binary, q_lens, kv_lens, doc, tile, block, hq, hkv, heads, window, by_head
    )
    want = brute_force_map(q_lens, kv_lens, doc, tile, block, heads, window, by_head)
    assert got == want


@pytest.mark.parametrize("seed", range(12, 24))
def test_kernel_split_of_the_scan_matches_brute_force(host_map_binary: Path, seed: int) -> None:
    """The device kernel's split of a box over 128 threads (scan_box_pairs stepping its pair
    index by 128 without dividing) votes the same classes as brute force."""
    rng = np.random.default_rng(seed)
    q_lens, kv_lens, doc = random_case(rng)
    tile = int(rng.choice([1, 16, 32, 37, 128]))
    block = int(rng.choice([64, 32, 17, 128, 200]))
    window = int(rng.choice([0, 50]))
    by_head = int(seed % 2)
    hq, hkv = 4, 2
    heads = hq if by_head else 1
    args = (q_lens, kv_lens, doc, tile, block, hq, hkv, heads, window, by_head)
    got = host_map(host_map_binary, *args, mode="strided")
    assert got == brute_force_map(q_lens, kv_lens, doc, tile, block, heads, window, by_head)


def test_ragged_tails_and_full_boxes(host_map_binary: Path) -> None:
    """One document, no causal cut inside a box: boxes below the diagonal are FULL, the tails
    (q_len 100 with 64-row tiles, kv_len 130 with 64-key blocks) are classified on what exists."""
    q_lens, kv_lens = [100], [130]
    doc = np.zeros(130, dtype=np.int64)
    got = host_map(host_map_binary, q_lens, kv_lens, doc, 64, 64, 2, 2, 1, 0, 0)
    assert got == brute_force_map(q_lens, kv_lens, doc, 64, 64, 1, 0, 0)
    assert "1" in got and "2" in got


def _compile_kernel(tmp_path: Path, arch: list[str]) -> Path:
    src = tmp_path / "tile_map_module.cu"
    src.write_text(
        '#include "attnc/tile_map_builder.cuh"\n#include "token_mask_functor.h"\n'
        "ATTNC_DEFINE_TILE_MAP_BUILDER(TokenMaskFunctor)\n"
    )
    cubin = tmp_path / "tile_map.cubin"
    cmd = [NVCC, "-cubin", "-O3", "-std=c++17", *arch, f"-I{INCLUDE}", f"-I{FIXTURES}"]
    subprocess.run([*cmd, str(src), "-o", str(cubin)], check=True, capture_output=True, text=True)
    return cubin


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "arch", [["-arch=sm_80"], ["-gencode=arch=compute_90a,code=sm_90a"]], ids=["sm80", "sm90a"]
)
def test_kernel_compiles_without_spills(tmp_path: Path, arch: list[str]) -> None:
    if not Path(NVCC).exists():
        pytest.skip("needs nvcc")
    cubin = _compile_kernel(tmp_path, arch)
    sass = sass_of(cubin)
    assert "tile_map_kernel" in sass
    # the two kernels of the step of plans that do not wait for the map
    assert "item_map_cost_kernel" in sass and "item_map_order_kernel" in sass
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.nvcc
def test_jit_module_exports_the_map_builder(tmp_path, monkeypatch) -> None:
    """The JIT-built FA2 module of stdlib doc_causal exports attnc_build_tile_map (default
    visibility under -fvisibility=hidden) with the ABI version the runtime expects."""
    if not Path(NVCC).exists():
        pytest.skip("needs nvcc")
    from attnc.runtime.build.modules import get_prefill_module
    from attnc.runtime.planning.tile_map import TILE_MAP_ABI_VERSION

    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    module = get_prefill_module(attnc.load("stdlib:doc_causal").ir, "bfloat16", 64, arch="80")
    lib = module.lib  # type: ignore[attr-defined]
    assert hasattr(lib, "attnc_build_tile_map")
    # The queued step refuses bad arguments before any CUDA call (so this runs without a GPU).
    from attnc.runtime.planning.tile_map import (
        AttncItemOrderArgs,
        AttncPlanUpload,
        AttncTileMapArgs,
    )

    queue = lib.attnc_queue_tile_map
    queue.argtypes = [
        ctypes.POINTER(AttncTileMapArgs),
        ctypes.POINTER(AttncItemOrderArgs),
        ctypes.POINTER(AttncPlanUpload),
        ctypes.c_void_p,
    ]
    queue.restype = ctypes.c_int
    bad_layout = 10003  # ATTNC_E_BAD_LAYOUT
    map_args = ctypes.byref(AttncTileMapArgs())
    upload = AttncPlanUpload(host=8, device=8, bytes=64)
    fine = dict(items=8, scratch=8, tile_map=8, tile_map_start=8, kv_token_start=8)
    order = AttncItemOrderArgs(**fine, num_items=3, batch_size=1, kv_block=64)
    assert queue(None, ctypes.byref(order), ctypes.byref(upload), None) == bad_layout
    assert queue(map_args, None, ctypes.byref(upload), None) == bad_layout
    assert queue(map_args, ctypes.byref(order), None, None) == bad_layout
    for broken_upload in ({"bytes": 0}, {"host": None}, {"device": None}):
        bad = AttncPlanUpload(**{"host": 8, "device": 8, "bytes": 64, **broken_upload})
        assert queue(map_args, ctypes.byref(order), ctypes.byref(bad), None) == bad_layout
    for broken in (
        {"num_items": -1, "batch_size": 1, "kv_block": 64},
        {"num_items": 3, "batch_size": 1, "kv_block": 0},
        {"num_items": 3, "batch_size": 0, "kv_block": 64},
        {"num_items": 3, "batch_size": 1, "kv_block": 64, "scratch": None},
    ):
        args = AttncItemOrderArgs(**{**fine, **broken})
        assert queue(map_args, ctypes.byref(args), ctypes.byref(upload), None) == bad_layout
    lib.attnc_tile_map_abi_version.restype = ctypes.c_int
    assert lib.attnc_tile_map_abi_version() == TILE_MAP_ABI_VERSION


@pytest.mark.parametrize("struct", ["AttncTileMapArgs", "AttncItemOrderArgs", "AttncPlanUpload"])
def test_args_struct_matches_the_ctypes_mirror(tmp_path: Path, struct: str) -> None:
    """The C argument structs: size and every field offset equal the runtime's ctypes mirror."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    from attnc.runtime.planning import tile_map

    mirror = getattr(tile_map, struct)
    names = [name for name, _ in mirror._fields_]
    lines = "\n".join(f'  std::printf("%zu\\n", offsetof({struct}, {n}));' for n in names)
    src = tmp_path / "layout.cpp"
    src.write_text(
        '#include <cstddef>\n#include <cstdio>\n#include "attnc/tile_map_builder.cuh"\n'
        "int main() {\n"
        f'{lines}\n  std::printf("%zu\\n", sizeof({struct}));\n  return 0;\n}}\n'
    )
    exe = _build_host(src, tmp_path / "layout")
    out = [
        int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()
    ]
    want = [getattr(mirror, n).offset for n in names] + [ctypes.sizeof(mirror)]
    assert out == want
