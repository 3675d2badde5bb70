"""The decode step's mask spans, evaluated from the mask's range rows by the one host evaluation
(attnc/kernels/host/mask_range_rows.h through decode_step.h decode_spans; the rows from
mask_ranges.tile_range_program, the same the prefill planner reads) against the numpy reference
tests/mask_ranges_oracle.py (tile_kv_ranges + decode_spans), on the CPU: stdlib masks with plan-time
params, masks whose i32 arithmetic may wrap (wrap guards) with extreme params and KV lengths, random
linear and union masks, per-request window tensors (the rows' extra columns), malformed rows; and
BatchDecodeWrapper.plan() with a per-request window against the oracle."""

from __future__ import annotations

import random

import decode_plan_harness as h
import decode_schedule_oracle as oracle
import numpy as np
import pytest
import torch
from mask_ranges_oracle import decode_spans, tile_kv_ranges
from test_decode_plan_step import DIM, HKV, HQ, _outcome, cpu, lib, make_wrapper, page_table

import attnc
from attnc.compiler.pipeline import compile_source
from attnc.runtime.planning.mask_ranges import RangeProgram, tile_range_program

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

__all__ = ["cpu", "lib"]  # fixtures of test_decode_plan_step used here

I32_MAX = 2**31 - 1
WINDOWS = [0, 1, 7, 300, 1024, -5, 2**30, I32_MAX - 3, I32_MAX, -(2**31)]
CUSTOM = [
    "window + kv_idx <= q_pos",
    "kv_idx - window >= q_pos",
    "q_pos - kv_idx < window * 3",
    "abs(q_pos - kv_idx + window) <= 3",
    "kv_idx <= q_pos && q_pos - kv_idx < window + 5",
    "kv_idx < window || q_pos - kv_idx < 3",
    "kv_idx < window * window",  # an atom of params only: an extra column
    "kv_idx < q_len * q_len + window",  # an atom reading q_len: an extra column
]
PER_REQUEST = [
    "q_pos - kv_idx < window[batch] && kv_idx <= q_pos",
    "kv_idx * 2 + window[batch] <= q_pos * 3 || kv_idx < 5",
    "q_pos - kv_idx < max(window[batch], 3)",
    "q_pos - kv_idx < kv_len * window[batch] && kv_idx <= q_pos",  # reads kv_len, may wrap
    "abs(q_pos - kv_idx + window[batch]) <= 3",
]


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    yield from h.fresh_library(tmp_path_factory)


def _analysis_of(source: str, param: str = "param window: i32 = 4;"):
    if source.startswith("stdlib:"):
        return attnc.load(source).compiled.mask_analysis
    compiled, _ = compile_source(f"variant v {{ {param} mask = {source}; }}", "v.attn")
    return compiled[0].mask_analysis


def _kv_lens(rng: np.random.Generator, n: int = 40) -> np.ndarray:
    edges = [0, 1, 2, 63, 64, 65, 1023, 1024, 4096, 70000, I32_MAX - 1, I32_MAX]
    return np.array(edges + rng.integers(0, 100_000, n).tolist(), dtype=np.int64)


def _compare(p, analysis, params, per_req, kv, q_len, tile, what) -> None:
    """The step's spans of ``kv`` against the numpy reference's."""
    ranges = tile_kv_ranges(analysis, params, per_req)
    program = tile_range_program(analysis, params, per_req)
    assert (ranges is None) == (program is None), what
    if ranges is None:
        return
    q_all = np.full(kv.shape, q_len, dtype=np.int64)
    extra = program.extra(q_all, kv)
    want = decode_spans(ranges, kv, q_len, tile)
    got = p.spans(program, kv, q_len, tile, extra)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=f"{what} q{q_len} tile {tile}")


CASES = [
    ("stdlib:sliding_window", "window"),
    ("stdlib:gpt_oss_local", "window"),
    ("stdlib:prefix_lm", "prefix_len"),
    ("stdlib:causal", None),
    *((text, "window") for text in CUSTOM),
]


@pytest.mark.parametrize(("source", "param"), CASES)
def test_step_spans_match_decode_spans(planner, source, param):
    p, _, _ = h.planner(8, 8, 8)
    analysis = _analysis_of(source)
    rng = np.random.default_rng(len(source))
    for value in WINDOWS if param else [None]:
        params = {} if param is None else {param: value}
        assert tile_range_program(analysis, params) is not None, analysis.describe()
        for q_len in (1, 2, 5, 8):
            for tile in (16, 64, 128):
                _compare(p, analysis, params, None, _kv_lens(rng), q_len, tile, (source, value))


def _random_side(rng: random.Random) -> str:
    parts = []
    for name in ("q_pos", "q_idx", "kv_idx", "window", "kv_len", "q_len"):
        coef = rng.choice([0, 0, 1, 1, -1, 2, 3])
        if coef:
            parts.append(f"{coef} * {name}")
    parts.append(str(rng.randint(-9, 9)))
    return " + ".join(parts)


def _random_mask(rng: random.Random) -> str:
    def atom() -> str:
        op = rng.choice(["<", "<=", ">", ">=", "=="])
        text = f"{_random_side(rng)} {op} {_random_side(rng)}"
        return f"abs({_random_side(rng)}) <= {rng.randint(0, 40)}" if rng.random() < 0.15 else text

    conj = lambda: " && ".join(atom() for _ in range(rng.randint(1, 3)))  # noqa: E731
    return " || ".join(f"({conj()})" for _ in range(rng.randint(1, 3)))


def test_random_masks_match_decode_spans(planner):
    """Random linear and union masks of q_pos, q_idx, kv_idx, the lengths and a window (wrap
    guards where a window near the i32 limits may wrap them)."""
    p, _, _ = h.planner(8, 8, 8)
    rng, nrng = random.Random(11), np.random.default_rng(11)
    kinds, guarded, compared = set(), 0, 0
    while compared < 120:
        text = _random_mask(rng)
        analysis = _analysis_of(text)
        if analysis.kind not in ("linear", "union"):
            continue
        kinds.add(analysis.kind)
        guarded += bool(analysis.wrap_guards)
        window = rng.choice(WINDOWS + [rng.randint(-5000, 5000)])
        kv = _kv_lens(nrng, 20)
        _compare(p, analysis, {"window": window}, None, kv, rng.randint(1, 8),
                 rng.choice([16, 64]), (text, window))  # fmt: skip
        compared += 1
    assert kinds == {"linear", "union"} and guarded >= 5, (kinds, guarded)


@pytest.mark.parametrize("source", PER_REQUEST)
def test_per_request_windows_match_decode_spans(planner, source):
    """window[batch]: the rows take each request's value from an extra column."""
    p, _, _ = h.planner(8, 8, 8)
    analysis = _analysis_of(source, "param window: tensor<i32>[batch_size];")
    rng = np.random.default_rng(len(source))
    for trial in range(12):
        kv = _kv_lens(rng, 30)
        pool = np.array(WINDOWS + [3, 64, 999], dtype=np.int64)
        window = (
            rng.choice(pool, kv.shape[0]) if trial % 2 else rng.integers(-50, 3000, kv.shape[0])
        )
        per_req = {"window": window.astype(np.int64)}
        program = tile_range_program(analysis, {}, per_req)
        assert program is not None and program.by_request, analysis.describe()
        _compare(p, analysis, {}, per_req, kv, 1 + trial % 8, (16, 64)[trial % 2], source)


def test_rows_layout_and_malformed_rows(planner):
    p, _, _ = h.planner(8, 8, 8)
    window = attnc.load("stdlib:sliding_window").compiled.mask_analysis
    program = tile_range_program(window, {"window": 100})
    # one term of two rows, no guards: q - k + kv - q_len >= 0, -q + k - kv + q_len + 99 >= 0
    assert program.rows.tolist() == [[0, 1, -1, 0, -1, 1, -1], [0, -1, 1, 99, 1, -1, -1]]
    kv = np.array([0, 5, 1000], dtype=np.int64)
    offset, length = p.spans(program, kv, 2, 64)
    assert offset.tolist() == [0, 0, 896] and length.tolist() == [0, 5, 104]  # keys 899..
    good = program.rows
    bad_rows = [
        (good.copy(), 0, None),  # no terms
        (np.where(np.arange(7) == 0, 1, good), 1, None),  # a term beyond num_terms
        (np.where(np.arange(7) == 0, -2, good), 1, None),  # a term below -1
        (np.where(np.arange(7) == 6, 0, good), 1, None),  # an extra column that is not there
        (np.where(np.arange(7) == 6, 0, good), 1, np.zeros((1, 2), np.int64)),  # short extra
    ]
    for rows, terms, extra in bad_rows:
        bad = RangeProgram(np.ascontiguousarray(rows, dtype=np.int64), terms, (), {}, {})
        with pytest.raises(ValueError, match="malformed range rows"):
            p.spans(bad, kv, 2, 64, extra)
    for q_len, tile in ((2, 0), (0, 64)):  # kv_tile and q_len must be positive
        with pytest.raises(ValueError, match="malformed range rows"):
            p.spans(program, kv, q_len, tile)


def test_wrapper_plans_per_request_windows_as_the_oracle(cpu):
    """BatchDecodeWrapper.plan(params={"window": tensor}): the step computes the spans from the
    rows and the windows' extra column and writes what the oracle writes from the numpy
    spans; every plan takes the checked path (the tensor's values may change)."""
    variant = attnc.load("stdlib:per_request_window")
    w = make_wrapper(name="per_request_window")
    w._device = torch.device("cpu")  # the window tensor lives with the (host) workspace
    ref_buf = np.zeros_like(w._pinned_np)
    rng = np.random.default_rng(3)
    narrowed = 0
    for trial in range(40):
        args = page_table(rng, int(rng.integers(1, 40)), max_len=int(rng.choice([3000, 70000])))
        batch = args[0].shape[0] - 1
        window = torch.from_numpy(rng.integers(1, 3000, batch).astype(np.int32))
        q_len = 1 + trial % 3
        got = _outcome(w, *args, q_len_per_request=q_len, params={"window": window})
        kv, _ = oracle.check_page_table(args[0].numpy(), args[2].numpy(), 16, w.layout,
                                        args[1].numpy(), False)  # fmt: skip
        if kv is None or isinstance(got[0], type):
            continue
        ranges = tile_kv_ranges(variant.compiled.mask_analysis, {}, {"window": window.numpy()})
        spans = decode_spans(ranges, kv, q_len, 64)
        sched = oracle.schedule(
            kv, q_len, HQ, HKV, -(-q_len * (HQ // HKV) // 16), 264, 64,
            w.layout.max_part_rows(DIM), max_items=w.layout.max_items, spans=spans,
        )  # fmt: skip
        n = oracle.write_work_region(ref_buf, w.layout, sched, q_len, args[0].numpy()[:-1], kv)
        assert got[0] == ref_buf[:n].tobytes(), trial
        assert w._fast is None  # extra columns: never the fast path
        narrowed += bool((w.last_schedule.items[:, 3] > 0).any())
    assert narrowed > 10, narrowed
