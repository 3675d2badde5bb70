"""The C++ prefill planner (attnc/kernels/host/prefill_plan*) against its numpy oracle
(prefill_schedule_oracle.py): the same packed lists, byte for byte, the same offsets, partial
rows, chunk sizes and costs, on random ragged and paged batches with GQA groups, closed-form
mask ranges (params, per-request tensors, unions, wrap guards), tile maps and split KV; the
same workspace errors; and plan()'s index checks, which keep the Python checks' words."""

from __future__ import annotations

import re

import numpy as np
import prefill_schedule_oracle as oracle
import pytest
import torch
from mask_ranges_oracle import tile_kv_ranges
from prefill_plan_helpers import PlanShape, make_host_plan, plan_kv_lengths
from tile_map_oracle import map_starts, summarize

import attnc
from attnc.runtime.build import toolchain
from attnc.runtime.planning import tile_map
from attnc.runtime.planning.mask_ranges import tile_range_program
from attnc.runtime.planning.prefill_planner import PrefillPlanner
from attnc.runtime.wrappers import prefill_batch

pytestmark = pytest.mark.nvcc

try:
    toolchain.find_nvcc()
except toolchain.ToolNotFound:
    pytest.skip("nvcc not found", allow_module_level=True)

MASKS = [
    ("", {}),
    ("mask = kv_idx <= q_pos;", {}),
    ("mask = kv_idx < 100 || q_idx + kv_len - q_len >= kv_idx;", {}),
    ("mask = kv_idx >= kv_len - 64 || kv_idx < 8;", {}),
    ("mask = q_idx * 2 >= kv_idx;", {}),
    ("mask = kv_idx <= q_pos && q_pos - kv_idx < window;", {"window": 300}),
    ("mask = kv_idx < prefix || q_idx + kv_len - q_len >= kv_idx;", {"prefix": 77}),
    ("mask = kv_idx + 3000 < q_len * prefix || q_pos >= kv_idx;", {"prefix": 5}),
    ("mask = kv_idx >= kv_len - window || kv_idx < prefix;", {"prefix": 3, "window": 90}),
    ("mask = q_pos - kv_idx < window * 1000000;", {"window": 5000}),  # a wrap guard
    ("mask = kv_idx <= q_pos && q_pos - kv_idx < wins[batch];", "per_request"),
]
HEADS = [(4, 4), (8, 2), (32, 8), (6, 1)]


def _analysis(body: str, params: object):
    decls = "param window: i32 = 1;\n param prefix: i32 = 0;\n"
    if params == "per_request":
        decls = "param wins: tensor<i32>[batch_size];\n"
    return attnc.load(source=f"variant v {{\n {decls} {body}\n}}").compiled.mask_analysis


def _batch(rng):
    batch = int(rng.integers(1, 10))
    q = rng.integers(0, 700, batch) * (rng.random(batch) < 0.9)
    kv = q + rng.integers(0, 1500, batch) if rng.random() < 0.7 else rng.integers(0, 2500, batch)
    return q.astype(np.int64), kv.astype(np.int64)


def _indices(rng, q, kv):
    """(qo, kv_indptr, kv_indices, last, page_size) int64 tensors, paged half of the time."""
    qo = torch.from_numpy(np.concatenate([[0], np.cumsum(q)]))
    if rng.random() < 0.5:
        return qo, torch.from_numpy(np.concatenate([[0], np.cumsum(kv)])), None, None, 1
    page = int(rng.choice([1, 5, 16]))
    pages = -(-kv // page)
    last = np.where(pages > 0, kv - (pages - 1) * page, 1)
    indptr = np.concatenate([[0], np.cumsum(pages)])
    ids = rng.permutation(int(indptr[-1]) + 7)[: int(indptr[-1])]
    return qo, torch.from_numpy(indptr), torch.from_numpy(ids), torch.from_numpy(last), page


def _case(seed: int):
    rng = np.random.default_rng(seed)
    q, kv = _batch(rng)
    hq, hkv = HEADS[seed % len(HEADS)]
    tile = int(rng.choice([16, 32, 64, 128]))
    body, params = MASKS[seed % len(MASKS)]
    analysis = _analysis(body, params)
    if params == "per_request":
        per_req = {"wins": rng.integers(1, 400, q.shape[0])}
        ranges, program = (
            tile_kv_ranges(analysis, {}, per_req), tile_range_program(analysis, {}, per_req)
        )  # fmt: skip
    else:
        ranges, program = tile_kv_ranges(analysis, params), tile_range_program(analysis, params)
    assert (ranges is None) == (program is None)
    use_map = rng.random() < 0.4
    host_map = summary = None
    reserve = 0
    if use_map:
        entries = int(map_starts(q, kv, tile)[-1])
        host_map = rng.choice([0, 0, 0, 1, 2], size=entries).astype(np.uint8)
        host_map[: entries // 3] *= rng.random() < 0.5  # empty rows now and then
        summary = summarize(host_map, q, kv, tile)
        reserve = entries + int(rng.integers(0, 4096))
    lists = 4 * 4 * (q.shape[0] + 64) + 32 * hkv * int((-(-q // tile)).sum()) + 8192
    small = rng.random() < 0.4  # partial states that do not fit: the chunk doubles
    extra = int(np.exp(rng.uniform(np.log(1e3), np.log(4e6)))) if small else 1 << 26
    ws = lists + reserve + extra
    ctas = int(rng.choice([1, 4, 132, 264]))
    walk = ctas if seed % 3 == 0 else 0  # a third of the plans placed for the Hopper walk
    shape = PlanShape(hq, hkv, int(rng.choice([64, 128])), tile, ctas, ws, walk_ctas=walk)
    return _indices(rng, q, kv), shape, ranges, program, host_map, summary, reserve


@pytest.mark.parametrize("seed", range(400))
def test_random_plans_identical(seed):
    (qo, kv, idx, last, page), shape, ranges, program, host_map, summary, reserve = _case(seed)
    try:
        want = oracle.oracle_plan(qo, kv, idx, last, page, shape, ranges, summary, reserve)
    except ValueError as err:
        with pytest.raises(ValueError, match=re.escape(str(err))):
            make_host_plan(qo, kv, idx, last, page, shape, program, host_map, reserve)
        return
    got = make_host_plan(qo, kv, idx, last, page, shape, program, host_map, reserve)
    assert got.layout == want.layout
    assert np.array_equal(got.buffer, want.packed)
    assert (got.part_o_offset, got.part_lse_offset) == (want.part_o_offset, want.part_lse_offset)
    s, w = got.schedule, want.schedule
    assert (s.part_rows, s.chunk_size) == (w.part_rows, w.chunk_size)
    assert np.array_equal(s.items, w.items) and np.array_equal(s.merge_items, w.merge_items)
    assert np.array_equal(s.cost, w.cost)
    assert got.kv_lens.tolist() == plan_kv_lengths(kv, last, page).tolist()


def test_some_random_plans_split_and_some_stop_splitting(monkeypatch):
    """The random cases reach the paths the comparison is meant to cover: split tiles, a
    chunk doubled because the partial states did not fit, workspaces too small, tile maps."""
    doublings = []
    chunking = oracle._chunking

    def counting(*args, **kwargs):
        doublings.append(args[1])
        return chunking(*args, **kwargs)

    monkeypatch.setattr(oracle, "_chunking", counting)
    split = doubled = doubled_split = refused = mapped = 0
    for seed in range(400):
        (qo, kv, idx, last, page), shape, ranges, _, _, summary, reserve = _case(seed)
        doublings.clear()
        try:
            want = oracle.oracle_plan(qo, kv, idx, last, page, shape, ranges, summary, reserve)
        except ValueError:
            refused += 1
            continue
        split += want.schedule.num_merge > 0
        doubled += len(doublings) > 1
        doubled_split += len(doublings) > 1 and want.schedule.num_merge > 0
        mapped += summary is not None and want.schedule.num_merge > 0
    counts = (split, doubled, doubled_split, refused, mapped)
    assert split > 40 and doubled > 20 and doubled_split > 0 and refused > 0 and mapped > 5, counts


@pytest.mark.parametrize(
    ("qo", "kv", "idx", "last", "page"),
    [
        ([0, 5, 3], [0, 1, 2], None, None, None),
        ([1, 5], [0, 1], None, None, None),
        ([0, 5], [0, 1, 2], None, None, None),
        ([], [], None, None, None),
        ([0, 5], [0, 2], [1], [3], 4),
        ([0, 5], [0, 2], [1, -2], [3], 4),
        ([0, 5], [0, 2], [1, 2], [5], 4),
        ([0, 5], [0, 2], [1, 2], [0], 4),
        ([0, 5], [0, 2], [1, 2], [1, 1], 4),
        ([0, 5], [0, 2], [1, 2], [1], 2**31 - 1),
        ([0, 5], [0, 2], [1, 2], None, 4),
        ([0, 5], [0, 2], [1, 2], [1], None),
        ([0, 5], [0, 2], None, [1], None),
        # a request past the kernels' token limit (int32 less a margin; dsl/limits.py)
        ([0, 1], [0, 2**15], list(range(2**15)), [65535], 65536),
        ([0, 1], [0, 2**31 - 2**16 + 1], None, None, None),
        ([0, 2**31 - 2**16 + 1], [0, 5], None, None, None),
        ([0, 1, 2**31 - 2**16 + 2], [0, 5, 5], None, None, None),
    ],
)
def test_index_errors_keep_the_python_words(qo, kv, idx, last, page):
    def i32(v):
        return None if v is None else torch.tensor(v, dtype=torch.int32)

    args = (i32(qo), i32(kv), i32(idx), i32(last), page)
    with pytest.raises(ValueError) as want:
        prefill_batch.check_indices(*args)
    planner = PrefillPlanner()
    with pytest.raises(ValueError, match=None) as got:
        prefill_batch.checked_batch(planner, *args)
    assert str(got.value) == str(want.value)


def test_requests_at_the_token_limit_pass():
    """The limits themselves (MAX_KV_TOKENS, MAX_QUERY_TOKENS) are accepted, ragged and
    paged, by both the Python checks and the host planner."""
    limit = 2**31 - 2**16
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    cases = [
        (i32([0, limit]), i32([0, limit]), None, None, None),
        (i32([0, 1]), i32([0, 2**15 - 1]), i32(list(range(2**15 - 1))), i32([65536]), 65536),
    ]
    for args in cases:
        prefill_batch.check_indices(*args)
        prefill_batch.checked_batch(PrefillPlanner(), *args)


def test_wrong_dtype_keeps_the_python_words():
    planner = PrefillPlanner()
    qo = torch.tensor([0, 3], dtype=torch.int64)
    with pytest.raises(ValueError, match="qo_indptr: dtype must be torch.int32"):
        prefill_batch.checked_batch(planner, qo, qo.int(), None, None, None)


def test_short_map_is_refused():
    qo = torch.tensor([0, 100])
    shape = PlanShape(4, 2, 64, 32, 4, 1 << 20)
    with pytest.raises(ValueError, match="beyond the planner's limits"):
        make_host_plan(qo, qo, None, None, 1, shape, None, np.zeros(3, np.uint8), 64)


@pytest.mark.parametrize("seed", range(40))
def test_the_planners_map_summary_is_the_oracles(seed):
    """tile_map.summarize (the planner's summarize_map, which BatchPrefillWrapper.tile_map
    returns) and PrefillPlanner.map_starts against the numpy oracles: empty requests, keys
    without queries and rows all EMPTY included; a map longer than the batch needs reads its
    first entries only."""
    rng = np.random.default_rng(seed)
    batch = int(rng.integers(0, 6))
    q = rng.integers(0, 300, batch) * (rng.random(batch) < 0.8)
    kv = np.maximum(q, rng.integers(0, 700, batch) * (rng.random(batch) < 0.9))
    tile, block = int(rng.choice([16, 64, 128])), int(rng.choice([64, 100]))
    starts = map_starts(q, kv, tile, block)
    host_map = rng.choice([0, 0, 0, 1, 2], size=int(starts[-1]) + int(rng.integers(0, 3)))
    host_map = host_map.astype(np.uint8)
    host_map[: host_map.shape[0] // 3] *= rng.random() < 0.5  # empty rows now and then
    got, want = (
        tile_map.summarize(host_map, q, kv, tile, block),
        summarize(host_map, q, kv, tile, block),
    )
    assert got.kv_block == want.kv_block == block
    for field in ("row_start", "first", "end", "cumulative"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    planner = PrefillPlanner()
    qo = torch.tensor(np.concatenate([[0], np.cumsum(q)]), dtype=torch.int32)
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(kv)]), dtype=torch.int32)
    assert planner.check(qo, kv_indptr, None, None, 1)
    assert np.array_equal(planner.map_starts(tile, block), starts)


def test_the_map_summary_refuses_a_short_map():
    q = np.array([100])
    with pytest.raises(ValueError, match="the map as long as the batch needs"):
        tile_map.summarize(np.zeros(3, np.uint8), q, q, 64)
    with pytest.raises(ValueError, match=r"tile_q_tokens: must be in \[1, 2147483647\], got 0"):
        tile_map.summarize(np.zeros(4, np.uint8), q, q, 0)
    with pytest.raises(ValueError, match="kv_block: expected an int, got float 64.0"):
        tile_map.summarize(np.zeros(4, np.uint8), q, q, 64, 64.0)
    with pytest.raises(ValueError, match="the lengths must be from 0 to 2147418112"):
        tile_map.summarize(np.zeros(4, np.uint8), q, -q, 64)
    with pytest.raises(ValueError, match="expected 1-D"):
        tile_map.summarize(np.zeros(4, np.uint8), q, np.array([100, 1]), 64)


def test_build_failure_is_reported(monkeypatch):
    """No silent fallback: plan() raises the build error (nvcc command and output), on every
    call, without a second build attempt."""
    from attnc.runtime.build import jit
    from attnc.runtime.planning import prefill_plan_library
    from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

    calls = []

    def fail(*args, **kwargs):
        calls.append(1)
        raise jit.BuildError("attnc: nvcc failed\n  command: nvcc -o prefill_plan.so\nlog: boom")

    monkeypatch.setattr(jit, "build_module", fail)
    monkeypatch.setattr(prefill_plan_library.ONCE, "lib", None)
    monkeypatch.setattr(prefill_plan_library.ONCE, "failure", None)
    w = BatchPrefillWrapper(attnc.load("stdlib:causal"), torch.empty(1 << 20, dtype=torch.uint8))
    qo = torch.tensor([0, 64], dtype=torch.int32)
    for _ in range(2):
        with pytest.raises(prefill_plan_library.PlannerUnavailable) as info:
            w.plan(qo, qo, 4, 2, 64)
        text = str(info.value)
        assert "prefill_plan.cpp" in text and "command: nvcc -o prefill_plan.so" in text
        assert "BuildError" in text and "boom" in text
    assert calls == [1]


def test_struct_mirrors_match_the_library():
    """The ctypes mirrors have the C structs' sizes (checked on load) and the field names the
    header declares, in its order."""
    import re

    from attnc.runtime.planning import prefill_plan_library as lib

    lib.library()
    text = (lib.HOST_DIR / "prefill_plan_abi.h").read_text()
    for struct in lib.STRUCTS:
        c_name = "Attnc" + struct.__name__
        body = text[text.index(f"typedef struct {c_name} {{") : text.index(f"}} {c_name};")]
        fields = re.findall(r"^\s+[\w\s\*]+?\**(\w+)(?:\[\w+\])?;", body, flags=re.M)
        assert fields == [f[0] for f in struct._fields_], struct.__name__


def test_the_planners_token_limits_are_the_languages():
    """The host planners' request limit (one C++ constant, page_table_check.h, for both) is
    dsl/limits.py's number."""
    from pathlib import Path

    from attnc.dsl.limits import MAX_KV_TOKENS, MAX_QUERY_TOKENS

    host = Path(attnc.__file__).parent / "kernels" / "host"
    shared = (host / "page_table_check.h").read_text()
    assert "constexpr int64_t kMaxRequestTokens = INT32_MAX - 65535;" in shared
    for path in host.iterdir():
        text = path.read_text()
        assert "kMaxKvLen" not in text, path.name
        assert path.name == "page_table_check.h" or "kMaxRequestTokens =" not in text, path.name
    assert MAX_KV_TOKENS == MAX_QUERY_TOKENS == (1 << 31) - (1 << 16) == 2**31 - 1 - 65535
