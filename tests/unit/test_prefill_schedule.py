"""Prefill scheduler: tiles, split-KV chunks, heaviest-first order, partial rows, merge list."""

import numpy as np
import pytest
import torch
from mask_ranges_oracle import query_tiles, tile_kv_ranges

import attnc
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.planning.mask_ranges import tile_range_program
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _Recorder, cpu_run  # noqa: F401


def test_query_tiles():
    req, j, q0, q1 = query_tiles(np.array([5, 0, 9]), 4)
    assert req.tolist() == [0, 0, 2, 2, 2]
    assert j.tolist() == [0, 1, 0, 1, 2]
    assert q0.tolist() == [0, 4, 0, 4, 8]
    assert q1.tolist() == [4, 5, 4, 8, 9]
    with pytest.raises(ValueError, match="tile_q_tokens: must be positive"):
        query_tiles(np.array([1]), 0)


def test_tile_ranges_only_for_param_free_masks():
    for name, known in (("vanilla", False), ("sliding_window", False), ("causal", True)):
        analysis = attnc.load(f"stdlib:{name}").compiled.mask_analysis
        assert (tile_kv_ranges(analysis) is not None) is known, name
        assert (tile_range_program(analysis) is not None) is known, name  # rows iff ranges


MASKS = [
    "q_idx + kv_len - q_len >= kv_idx",  # causal
    "kv_idx < 100 || q_idx + kv_len - q_len >= kv_idx",  # prefix-LM with a fixed prefix
    "kv_idx <= q_idx + kv_len - q_len && q_idx + kv_len - q_len - kv_idx < 300",  # window
    "kv_idx >= kv_len - 64 || kv_idx < 8",  # union with a request-level bound
    "q_idx * 2 >= kv_idx",
]


@pytest.mark.parametrize("mask", MASKS)
def test_vectorised_tile_ranges_match_the_compiler(mask):
    from attnc.compiler import mask_tiles
    from attnc.compiler.pipeline import compile_source

    (compiled,), _ = compile_source(f"variant v {{\n mask = {mask};\n}}\n", "m.attn")
    analysis = compiled.mask_analysis
    ranges = tile_kv_ranges(analysis)
    assert ranges is not None, analysis.describe()
    rng = np.random.default_rng(1)
    q_lens = rng.integers(0, 700, 12)
    kv_lens = np.maximum(q_lens, rng.integers(0, 2000, 12))
    req, _, q0, q1 = query_tiles(q_lens, 37)
    begin, end = ranges(req, q0, q1, q_lens, kv_lens)
    for i in range(req.shape[0]):
        r = int(req[i])
        env = {"q_len": int(q_lens[r]), "kv_len": int(kv_lens[r])}
        want = mask_tiles.kv_range(analysis, int(q0[i]), int(q1[i]), env)
        assert (int(begin[i]), int(end[i])) == want, (i, env, int(q0[i]), int(q1[i]))


@pytest.mark.parametrize(
    "mask",
    [
        "kv_idx < prefix || q_idx + kv_len - q_len >= kv_idx",
        "kv_idx <= q_idx + kv_len - q_len && q_idx + kv_len - q_len - kv_idx < window",
        "kv_idx >= kv_len - window || kv_idx < prefix",
        "kv_idx + 3000 < q_len * prefix || q_idx + kv_len - q_len >= kv_idx",  # a product atom
    ],
)
def test_vectorised_tile_ranges_with_params_match_the_compiler(mask):
    from attnc.compiler import mask_tiles
    from attnc.compiler.pipeline import compile_source

    src = f"variant v {{\n param prefix: i32 = 0;\n param window: i32 = 1;\n mask = {mask};\n}}\n"
    (compiled,), _ = compile_source(src, "m.attn")
    analysis = compiled.mask_analysis
    params = {"prefix": 77, "window": 300}
    ranges = tile_kv_ranges(analysis, params)
    assert ranges is not None, analysis.describe()
    rng = np.random.default_rng(2)
    q_lens = rng.integers(0, 700, 12)
    kv_lens = np.maximum(q_lens, rng.integers(0, 2000, 12))
    req, _, q0, q1 = query_tiles(q_lens, 37)
    begin, end = ranges(req, q0, q1, q_lens, kv_lens)
    for i in range(req.shape[0]):
        r = int(req[i])
        env = {**params, "q_len": int(q_lens[r]), "kv_len": int(kv_lens[r])}
        want = mask_tiles.kv_range(analysis, int(q0[i]), int(q1[i]), env)
        assert (int(begin[i]), int(end[i])) == want, (i, env, int(q0[i]), int(q1[i]))


def test_plan_params_are_checked():
    from attnc.runtime.checks.params import check_plan_params

    decls = attnc.load("stdlib:alibi").params + attnc.load("stdlib:sliding_window").params
    assert check_plan_params(decls, {"window": 7}, variant_name="v") == {"window": 7}
    with pytest.raises(ValueError, match="variant 'v': unknown param 'windw'; did you mean"):
        check_plan_params(decls, {"windw": 7}, variant_name="v")
    with pytest.raises(ValueError, match="param 'window' \\(i32\\): expected an int, got float"):
        check_plan_params(decls, {"window": 7.0}, variant_name="v")
    with pytest.raises(ValueError, match="param 'slopes' .*plan\\(\\) takes scalar params only"):
        check_plan_params(decls, {"slopes": torch.zeros(4)}, variant_name="v")


def test_planned_mask_from_plan_params_and_the_run_check():
    from attnc.runtime.planning.mask_ranges import PlannedMask

    window = attnc.load("stdlib:sliding_window")
    planned = PlannedMask.from_plan_params(window, {"window": 1024})
    assert planned.program is not None and planned.values == {"window": 1024}
    planned.check_run("sliding_window", {"window": 1024})
    with pytest.raises(
        ValueError, match="param 'window' is 512 in run\\(\\), but plan\\(\\) was given 1024"
    ):
        planned.check_run("sliding_window", {"window": 512})
    unknown = PlannedMask.from_plan_params(window, {})  # the width is not known at plan time
    assert unknown.program is None and unknown.values == {}
    causal = PlannedMask.from_plan_params(attnc.load("stdlib:causal"), {})
    assert causal.program is not None and causal.values == {}  # bounds without params
    softcap = PlannedMask.from_plan_params(attnc.load("stdlib:softcap"), {"cap": 30.0})
    assert softcap.program is not None and softcap.values == {"cap": 30.0}  # run() must match
    with pytest.raises(ValueError, match="expected a float, got str"):
        PlannedMask.from_plan_params(attnc.load("stdlib:softcap"), {"cap": "30"})


def test_planned_mask_is_remembered_per_value_and_type():
    from attnc.runtime.planning.mask_ranges import PlannedMask

    window = attnc.load("stdlib:sliding_window")
    first = PlannedMask.from_plan_params(window, {"window": 64})
    assert PlannedMask.from_plan_params(window, {"window": 64}) is first
    assert PlannedMask.from_plan_params(window, {"window": 65}).values == {"window": 65}
    with pytest.raises(ValueError, match="expected an int, got float"):
        PlannedMask.from_plan_params(window, {"window": 64.0})  # equal value, other type
    with pytest.raises(ValueError, match="expected an int, got list"):
        PlannedMask.from_plan_params(window, {"window": [64]})  # unhashable: checked anyway


def test_closed_form_rows_are_remembered_per_value(monkeypatch):
    """Planned values without per-request tensors share one rows object per value (the decode
    fast path matches rows by identity), and values that leave the ranges unknown (None) are
    remembered too: the rows are built once per value."""
    from attnc.runtime.planning import mask_ranges
    from attnc.runtime.planning.mask_ranges import PlannedMask

    variant = attnc.load(
        source="variant remembered_rows { param window: i32 = 1; "
        "mask = kv_idx <= q_pos && q_pos - kv_idx < window; }"
    )
    built = []
    real = mask_ranges.tile_range_program
    monkeypatch.setattr(
        mask_ranges, "tile_range_program", lambda *a: built.append(a[1]) or real(*a)
    )
    first = PlannedMask.from_values(variant, {"window": 64}, {})
    assert first.program is not None and first.values == {"window": 64}
    again = PlannedMask.from_values(variant, {"window": 64}, {})
    assert again.program is first.program
    assert PlannedMask.from_values(variant, {"window": 65}, {}).program is not first.program
    for _ in range(2):
        unknown = PlannedMask.from_values(variant, {}, {})
        assert unknown.program is None and unknown.values == {}
    assert built == [{"window": 64}, {"window": 65}, {}]


def test_range_rows_hold_each_value_in_its_named_column():
    """Each row of ``tile_range_program`` holds the term, the coefficients, the constant's
    parts and the extra column where the ``PR_*`` names say (the planners' C++ reads them so).
    """
    from attnc.runtime.planning import host_planner_abi as pr

    analysis = attnc.load("stdlib:per_request_window").compiled.mask_analysis
    program = tile_range_program(analysis, {}, {"window": np.array([3, 5])})
    cols = (pr.PR_TERM, pr.PR_CQ, pr.PR_CK, pr.PR_C0, pr.PR_Q_LEN, pr.PR_KV_LEN, pr.PR_EXTRA)
    # q_idx + kv_len - q_len >= kv_idx, and q_idx + kv_len - q_len - kv_idx < window[batch]
    assert program.rows[:, cols].tolist() == [[0, 1, -1, 0, -1, 1, -1], [0, -1, 1, -1, 1, -1, 0]]
    assert program.rows.shape == (2, pr.PR_COLUMNS)
    assert program.extra(np.array([1, 1]), np.array([4, 4])).tolist() == [[3, 5]]


PARTLY_PLANNED = [
    ("(kv_idx + a) * 2 <= q_idx + b", ("a", "b")),
    ("(kv_idx <= q_pos && q_pos - kv_idx < a) || kv_idx < b + 4", ("b", "a")),
    ("kv_idx <= q_idx + kv_len - q_len && q_idx + kv_len - q_len - kv_idx < a * b", ("a", "b")),
]


@pytest.mark.parametrize(("mask", "names"), PARTLY_PLANNED)
@pytest.mark.parametrize("value", [5, 2**30, 2**31 - 1, -(2**31)])
def test_bounds_are_known_only_with_every_param_they_read(mask, names, value):
    """The bounds counted as known when they evaluated at q_len = kv_len = 1, and a wrap guard
    that fires there for the given value (2 * 2**30 wraps) returned before the constraint
    read the param not given: the rows' extra column then raised a bare KeyError in plan().
    Now the rows need every param the bounds read; with all given, they evaluate."""
    source = f"variant v {{ param a: i32; param b: i32; mask = {mask}; }}"
    analysis = attnc.load(source).compiled.mask_analysis
    first, second = names
    assert tile_range_program(analysis, {first: value}) is None
    program = tile_range_program(analysis, {first: value, second: 3})
    assert program is not None
    program.extra(np.array([4]), np.array([8]))  # a product of params: an extra column


def test_a_plan_given_part_of_the_bound_params_plans_whole_requests(cpu_run):  # noqa: F811
    """plan(params={"a": 2**30}) of a mask that also reads b raised KeyError: 'b'."""
    variant = attnc.load(
        "variant v { param a: i32; param b: i32; mask = (kv_idx + a) * 2 <= q_idx + b; }"
    )
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8))
    w._module_choice = lambda *a: PrefillChoice("fa2", _Recorder(variant), 16)
    indptr = torch.tensor([0, 5, 14], dtype=torch.int32)
    w.plan(indptr, indptr, HQ, HKV, D, params={"a": 2**30})
    assert w._planned_mask.program is None
