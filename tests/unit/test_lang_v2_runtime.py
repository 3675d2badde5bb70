"""The runtime side of language v2 on the CPU: batch-sized tensor params checked against the
batch, per-request bounds (``window[batch]``) in the plan-time KV ranges, the numpy oracle of
the tile-map summary the planner ranges and costs tiles by (tests/tile_map_oracle.py; the
planner's own is tested against it in tests/codegen/test_prefill_plan_native.py), and the
planned-tensor check of run()."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mask_ranges_oracle import query_tiles, tile_kv_ranges
from tile_map_oracle import map_starts, summarize

import attnc
from attnc.compiler import mask_tiles
from attnc.runtime.checks.params import resolve_params, token_sizes
from attnc.runtime.planning.mask_ranges import PlannedMask
from attnc.runtime.planning.plan_params import mask_reads, split_plan_params
from attnc.runtime.planning.tensor_stamps import TensorStamp, check_planned_tensors

DOC_CAUSAL = """variant doc_causal {
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}"""
PER_REQUEST_WINDOW = """variant per_request_window {
    param window: tensor<i32>[batch_size];
    mask = kv_idx <= q_pos && q_pos - kv_idx < window[batch];
}"""
Q_TOKENS = """variant q_token_bias {
    param bias: tensor<f32>[q_len];
    score = score + bias[q_idx];
}"""

HEADS = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64}


def _resolve(variant, params, sizes):
    return resolve_params(
        variant.params, params, variant_name=variant.name, batch_sizes=sizes, **HEADS
    )


@pytest.mark.parametrize(
    ("source", "name", "good", "bad", "why"),
    [
        (DOC_CAUSAL, "doc", (30,), (29,), "kv_len = sum of kv_len over the batch"),
        (Q_TOKENS, "bias", (8,), (30,), "q_len = sum of q_len over the batch"),
        (PER_REQUEST_WINDOW, "window", (3,), (1,), "batch_size = requests in the batch"),
    ],
)
def test_batch_sized_tensors_are_checked_against_the_batch(source, name, good, bad, why):
    variant = attnc.load(source=source)
    sizes = token_sizes(total_q=8, total_kv=30, batch=3)
    dtype = torch.float32 if name == "bias" else torch.int32
    assert _resolve(variant, {name: torch.zeros(good, dtype=dtype)}, sizes)[name].shape == good
    with pytest.raises(ValueError) as err:
        _resolve(variant, {name: torch.zeros(bad, dtype=dtype)}, sizes)
    dims = {"doc": "kv_len", "bias": "q_len", "window": "batch_size"}[name]
    decl = f"tensor<{'f32' if name == 'bias' else 'i32'}>[{dims}]"
    assert str(err.value) == (
        f"variant '{variant.name}': param '{name}' ({decl}): expected shape {list(good)} "
        f"({why}), got {list(bad)}"
    )


def test_batch_sized_tensor_without_the_batch_is_refused():
    variant = attnc.load(source=DOC_CAUSAL)
    with pytest.raises(ValueError, match="param 'doc'.*comes from the batch"):
        _resolve(variant, {"doc": torch.zeros(3, dtype=torch.int32)}, None)


def test_split_plan_params_checks_tensors_and_keeps_scalars():
    variant = attnc.load(source=PER_REQUEST_WINDOW)
    sizes = {**HEADS, **token_sizes(5, 9, 2)}
    window = torch.tensor([3, 4], dtype=torch.int32)
    scalars, tensors = split_plan_params(
        variant, {"window": window}, sizes=sizes, device=torch.device("cpu")
    )
    assert scalars == {} and tensors["window"] is window
    with pytest.raises(ValueError, match=r"param 'window'.*expected shape \[2\]"):
        split_plan_params(
            variant, {"window": torch.zeros(3, dtype=torch.int32)}, sizes=sizes,
            device=torch.device("cpu"),
        )  # fmt: skip


def test_split_plan_params_names_a_size_it_was_not_given():
    variant = attnc.load(source=PER_REQUEST_WINDOW)
    window = torch.tensor([3, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"param 'window'.*\(batch_size\) comes from the batch"):
        split_plan_params(variant, {"window": window}, sizes=HEADS, device=torch.device("cpu"))


def test_mask_reads():
    assert mask_reads(attnc.load(source=DOC_CAUSAL).ir).token_tensors == ("doc",)
    window = mask_reads(attnc.load(source=PER_REQUEST_WINDOW).ir)
    assert not window.needs_tile_map and window.params == {"window"}
    assert not mask_reads(attnc.load("stdlib:causal").ir).needs_tile_map


def test_per_request_window_ranges_match_scalar_windows():
    """``window[batch]`` in the bounds: every tile's range equals the range with request b's
    window as a scalar (the compiler's one-tile answer)."""
    variant = attnc.load(source=PER_REQUEST_WINDOW)
    scalar = attnc.load("stdlib:sliding_window")
    rng = np.random.default_rng(0)
    q_lens = rng.integers(1, 300, 5)
    kv_lens = q_lens + rng.integers(0, 300, 5)
    windows = rng.integers(1, 200, 5)
    ranges = tile_kv_ranges(variant.compiled.mask_analysis, {}, {"window": windows})
    assert ranges is not None
    req, _, q0, q1 = query_tiles(q_lens, 64)
    begin, end = ranges(req, q0, q1, q_lens, kv_lens)
    for t in range(req.shape[0]):
        b = int(req[t])
        env = {"window": int(windows[b]), "q_len": int(q_lens[b]), "kv_len": int(kv_lens[b])}
        want = mask_tiles.kv_range(scalar.compiled.mask_analysis, int(q0[t]), int(q1[t]), env)
        assert (begin[t], end[t]) == tuple(want)


def test_planned_mask_from_values_stamps_the_tensors_the_mask_reads():
    variant = attnc.load(source=PER_REQUEST_WINDOW)
    window = torch.tensor([3, 4], dtype=torch.int32)
    planned = PlannedMask.from_values(variant, {}, {"window": window})
    assert planned.program is not None and set(planned.tensors) == {"window"}
    assert planned.program.by_request  # the window per request: an extra column of the rows
    planned.check_run(variant.name, {"window": window})
    with pytest.raises(ValueError, match="param 'window': run\\(\\) was given another tensor"):
        planned.check_run(variant.name, {"window": window.clone()})
    window.add_(1)
    written = "param 'window': run\\(\\) was given the planned tensor, written since plan"
    with pytest.raises(ValueError, match=written):
        planned.check_run(variant.name, {"window": window})


def test_planned_tensor_with_other_storage_is_refused():
    t = torch.zeros(4, dtype=torch.int32)
    stamps = {"doc": TensorStamp.of(t)}
    t.set_(torch.zeros(4, dtype=torch.int32).untyped_storage())
    with pytest.raises(ValueError, match="param 'doc'.*other storage"):
        check_planned_tensors("v", stamps, {"doc": t})


def _random_map(rng, q_lens, kv_lens, tile):
    starts = map_starts(q_lens, kv_lens, tile)
    return rng.choice([0, 0, 1, 2], size=int(starts[-1])).astype(np.uint8), starts


@pytest.mark.parametrize("seed", range(5))
def test_summary_matches_the_map(seed):
    rng = np.random.default_rng(seed)
    q_lens, kv_lens, tile = rng.integers(0, 400, 4), rng.integers(0, 700, 4), 64
    m, starts = _random_map(rng, q_lens, kv_lens, tile)
    s = summarize(m, q_lens, kv_lens, tile)
    req, j, _, _ = query_tiles(q_lens, tile)
    for t in range(req.shape[0]):
        cols = -(-int(kv_lens[req[t]]) // 64)
        row = m[starts[req[t]] + j[t] * cols : starts[req[t]] + (j[t] + 1) * cols]
        hit = np.flatnonzero(row)
        assert (s.first[t], s.end[t]) == ((hit[0], hit[-1] + 1) if hit.size else (0, 0))
        b, e = sorted(rng.integers(0, int(kv_lens[req[t]]) + 1, 2))
        in_range = [c for c in hit if c * 64 < e and (c + 1) * 64 > b] if e > b else []
        assert s.visible_tokens(np.array([t]), np.array([b]), np.array([e]))[0] == 64 * len(
            in_range
        )


def test_a_head_tensor_given_to_plan_is_not_a_per_request_bound():
    """Only ``tensor[batch_size]`` reads ``t[batch]`` feed per-request ranges; a head-shaped
    tensor in the mask leaves the closed-form (causal) range and is stamped for run()."""
    variant = attnc.load(
        source="""variant head_window {
            param w: tensor<i32>[num_qo_heads];
            mask = kv_idx <= q_pos && q_pos - kv_idx < w[qo_head];
        }"""
    )
    w = torch.ones(4, dtype=torch.int32)
    planned = PlannedMask.from_values(variant, {}, {"w": w})
    assert list(planned.tensors) == ["w"] and planned.program is not None
    assert not planned.program.by_request  # the closed form: no per-request column
    ranges = tile_kv_ranges(variant.compiled.mask_analysis, planned.values)
    assert ranges is not None
    req, _, q0, q1 = query_tiles(np.array([100]), 64)
    begin, end = ranges(req, q0, q1, np.array([100]), np.array([100]))
    assert begin.tolist() == [0, 0] and end.tolist() == [64, 100]


def test_map_values_fill_placeholders_and_need_what_the_mask_reads():
    from attnc.runtime.wrappers.prefill_tile_map import default_map_reserve, map_values

    variant = attnc.load(
        source="""variant doc_bias {
            param doc: tensor<i32>[kv_len];
            param bias: tensor<f32>[q_len];
            param scale: f32;
            score = score * scale + bias[q_idx];
            mask = doc[kv_idx] == doc[q_pos];
        }"""
    )
    reads = mask_reads(variant.ir)
    sizes = {**HEADS, **token_sizes(5, 9, 1)}
    doc = torch.zeros(9, dtype=torch.int32)
    values = map_values(variant, reads, {}, {"doc": doc}, sizes, torch.device("cpu"))
    assert values is not None and values["doc"] is doc and values["scale"] == 0.0
    assert values["bias"].shape == (5,) and not values["bias"].any()
    assert map_values(variant, reads, {}, {}, sizes, torch.device("cpu")) is None
    assert default_map_reserve(1 << 20, reads) == (1 << 20) // 8
    assert default_map_reserve(1 << 20, mask_reads(attnc.load("stdlib:causal").ir)) == 0
