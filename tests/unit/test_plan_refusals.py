"""Plans the prefill planner cannot make, refused with what to change: a GQA group wider than
every query tile (it reached the planner as a 0-token tile: a generic refusal, or a division
by zero that killed the process in the tile-map sizing), and a workspace that the tile map's
reserve leaves too small for the work lists (the message gave a need below the size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prefill_plan_helpers import PlanShape, make_host_plan

import attnc
from attnc.runtime.build import backends
from attnc.runtime.planning.prefill_planner import PrefillPlanner

_WIDEST = {64: 128, 128: 128, 256: 64}  # the FA2 template's widest tile, in rows


class _Module:
    """The FA2 module's tile answer (prefill_config.cuh prefill_tile_q_tokens)."""

    def tile_q_tokens(self, head_dim: int, group: int, max_q_len: int) -> int:
        rows = _WIDEST[head_dim]
        for shape in (16, 64, rows):
            if shape >= group and (max_q_len * group <= shape or shape == rows):
                return shape // group
        return 0


class _HopperModule:
    """A Hopper module whose widest tile holds 192 rows."""

    def tile_q_tokens(self, head_dim: int, group: int, max_q_len: int) -> int:
        return 192 // group


@pytest.fixture
def fa2_stub(monkeypatch):
    monkeypatch.setattr(backends, "get_prefill_module", lambda *a, **k: _Module())
    monkeypatch.setattr(backends, "_arch_of", lambda device: "80")


def _choose(head_dim: int, group: int) -> backends.PrefillChoice:
    """The FA2 module choice for a 40-token causal request of this shape."""
    return backends.choose_prefill_module(
        attnc.load("stdlib:causal").ir,
        "fa2",
        dtype=torch.bfloat16,
        head_dim=head_dim,
        group=group,
        max_q_len=40,
        kv_layout="ragged",
        device=torch.device("cpu"),
    )


@pytest.mark.parametrize(("head_dim", "group"), [(128, 129), (128, 256), (256, 128), (64, 200)])
def test_group_wider_than_every_tile_is_refused_by_name(fa2_stub, head_dim, group) -> None:
    with pytest.raises(ValueError) as err:
        _choose(head_dim, group)
    text = str(err.value)
    assert text.startswith("num_qo_heads / num_kv_heads: a GQA group of")
    assert f"{group} query heads" in text
    assert f"FA2's widest: {_WIDEST[head_dim]} rows, at head_dim {head_dim}" in text
    assert "Hopper" not in text  # not asked for backend="fa2"


def test_a_group_refused_by_both_templates_names_both_widest_tiles(monkeypatch) -> None:
    """The Hopper template's widest tile was written in the message by hand; it now comes
    from the module asked, as FA2's does."""
    hopper = _HopperModule()
    monkeypatch.setattr(backends, "get_prefill_module", lambda *a, **k: _Module())
    monkeypatch.setattr(backends, "get_prefill_sm90_module", lambda *a, **k: hopper)
    monkeypatch.setattr(backends, "_sm90_refusal", lambda *a: None)
    monkeypatch.setattr(backends, "_arch_of", lambda device: "90a")
    with pytest.raises(ValueError) as err:
        backends.choose_prefill_module(
            attnc.load("stdlib:causal").ir, "auto", dtype=torch.bfloat16, head_dim=128,
            group=256, max_q_len=40, kv_layout="ragged", device=torch.device("cpu"),
        )  # fmt: skip
    assert f"FA2's widest: {_WIDEST[128]} rows, the Hopper template's: 192, at head_dim 128" in (
        str(err.value)
    )


@pytest.mark.parametrize(("head_dim", "group"), [(128, 128), (256, 64), (64, 1)])
def test_group_at_the_limit_is_planned(fa2_stub, head_dim, group) -> None:
    choice = _choose(head_dim, group)
    assert choice.backend == "fa2" and choice.tile_q_tokens >= 1


@pytest.mark.parametrize(("tile", "block"), [(0, 128), (4, 0), (-1, 128)])
def test_map_starts_refuses_a_tile_or_block_below_one(tile, block) -> None:
    """The library divides by both: a 0 killed the process (SIGFPE)."""
    planner = PrefillPlanner()
    ip = torch.tensor([0, 40], dtype=torch.int32)
    assert planner.check(ip, ip, None, None, 1)
    with pytest.raises(ValueError, match="must be at least 1"):
        planner.map_starts(tile, block)
    assert np.array_equal(planner.map_starts(16, 128), [0, 3])


def test_a_workspace_short_by_the_map_reserve_says_so() -> None:
    """The refusal said 'has 1048576 bytes, the work lists need 962048' when the lists fit the
    workspace but not what the tile map's reserve leaves of it."""
    ip = torch.tensor([0, 240000], dtype=torch.int32)
    shape = PlanShape(4, 2, 64, 16, 8, 1 << 20)
    make_host_plan(ip, ip, None, None, 1, shape)  # fits without a reserve
    with pytest.raises(ValueError) as err:
        make_host_plan(ip, ip, None, None, 1, shape, map_reserve=1 << 17)
    text = str(err.value)
    assert text.startswith("workspace_buffer: has 1048576 bytes, of which the last 131072 are")
    need = int(text.split("the work lists need ")[1].split(":")[0])
    assert 1048576 - 131072 < need <= 1048576


def test_a_tile_map_past_int32_is_refused() -> None:
    """A map of more than 2**31 - 1 tiles was planned: its starts wrapped to 32 bits (one
    6M-token request's map of 4394531250 tiles began its second request at 99563954) and
    the kernels classified and read the wrong tiles; the output was wrong with no error.
    The map kernel steps over entries by up to 2**18 with an int: a map within 2**18 of
    2**31 - 1 wrapped that step (and its block count overflowed at 2**31 - 3)."""
    from attnc.runtime.planning import prefill_plan

    limit = prefill_plan.MAX_MAP_ENTRIES
    assert limit + 2**18 <= 2**31 - 1
    n = 6_000_000
    ip = torch.tensor([0, n], dtype=torch.int32)
    shape = PlanShape(1, 1, 64, 128, 132, 1 << 36)
    with pytest.raises(ValueError, match="^qo_indptr, kv_indptr: these requests' tile map has "
                       f"4394531250 tiles, past the {limit}"):  # fmt: skip
        make_host_plan(ip, ip, None, None, 1, shape, map_reserve=1 << 35, map_on_device=True)
    for entries in (limit + 1, 2**31 - 1):
        with pytest.raises(ValueError, match="^qo_indptr, kv_indptr: "):
            prefill_plan.check_map_fits(entries, 1 << 40)
    prefill_plan.check_map_fits(limit, limit)


def test_single_prefill_refuses_a_map_past_int32_before_allocating() -> None:
    """Variant.prefill sized its workspace for the whole map (17.6 GB for one 6M-token
    request) and then the plan refused it; a map past the limit even at the widest tile
    is now refused first, and a map that may fit gets no more room than the limit."""
    from attnc.runtime.planning.prefill_plan import MAX_MAP_ENTRIES
    from attnc.runtime.wrappers import single_prefill

    meta = torch.device("meta")
    with pytest.raises(ValueError, match="^q, k: the mask reads tensors, so 6000000 queries "
                       "over 6000000 keys need a tile map of at least 2929687500 tiles"):  # fmt: skip
        single_prefill._workspace_for(6_000_000, 6_000_000, (1, 1), True, meta)
    _, reserve = single_prefill._workspace_for(4_000_000, 4_000_000, (1, 1), True, meta)
    assert reserve is not None and MAX_MAP_ENTRIES <= reserve < MAX_MAP_ENTRIES + (1 << 28)


@pytest.mark.parametrize(
    "q_len, kv_len, heads, numel, reserve",
    [(1, 1, (1, 1), 9440768, 1049088), (0, 0, (8, 1), 9440768, 1049088),
     (10, 1000, (4, 1), 9445376, 1049088), (300, 5000, (32, 8), 9599744, 1054976),
     (17, 129, (2, 1), 9448960, 1049088), (5000, 70000, (64, 1), 17629952, 6678784),
     (100, 100, (256, 1), 8442368, None)],
)  # fmt: skip
def test_single_prefill_workspace_sizes(q_len, kv_len, heads, numel, reserve) -> None:
    """The single-request workspace and its tile-map reserve, per request shape and heads."""
    from attnc.runtime.wrappers import single_prefill

    meta = torch.device("meta")
    found = single_prefill._workspace_for(q_len, kv_len, heads, True, meta)
    assert (found[0].numel(), found[1]) == (numel, reserve)


@pytest.mark.parametrize(
    "heads, head_dim, words",
    [((3, 2), 64, "^num_qo_heads: 3 is not a multiple of num_kv_heads 2"),
     ((4, 1), 96, r"^head_dim: must be one of \[64, 128, 256\], got 96")],
)  # fmt: skip
def test_single_prefill_checks_heads_before_the_map_size(heads, head_dim, words) -> None:
    """A long request with heads no kernel takes was told to split the request (the map's
    size was checked before the heads)."""
    from attnc.runtime.wrappers import single_prefill

    n, (hq, hkv) = 6_000_000, heads
    q = torch.zeros(1, hq, head_dim, dtype=torch.bfloat16).expand(n, hq, head_dim)
    k = torch.zeros(1, hkv, head_dim, dtype=torch.bfloat16).expand(n, hkv, head_dim)
    doc = torch.zeros(n, dtype=torch.int32)
    variant = attnc.load("stdlib:doc_causal")
    with pytest.raises(ValueError, match=words):
        single_prefill._planned(variant, q, k, None, {"doc": doc}, "fa2")
