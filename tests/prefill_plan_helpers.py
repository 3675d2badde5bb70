"""Test helpers of the prefill plan: a host plan from index tensors with a planner of its own
(``make_host_plan``, shaped by ``PlanShape``), and the per-request lengths and first KV tokens
by torch (what the C++ planner's lengths are checked against). Not used by the runtime.
Importable from every test tier as ``import prefill_plan_helpers`` (pytest puts tests/, the
folder of tests/conftest.py, on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnc.runtime.abi import TILE_MAP_KV_BLOCK as KV_BLOCK
from attnc.runtime.planning.mask_ranges import RangeProgram
from attnc.runtime.planning.prefill_plan import HostPlan, host_plan
from attnc.runtime.planning.prefill_planner import PrefillPlanner


def kv_lengths_paged(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Tokens per request of a paged cache: ``(pages - 1) * page_size + last``, 0 without pages."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    lengths = (pages - 1) * page_size + kv_last_page_len
    return torch.where(pages > 0, lengths, torch.zeros_like(lengths))


def lengths(indptr: torch.Tensor) -> torch.Tensor:
    """Per-request sizes of a token indptr."""
    return indptr[1:] - indptr[:-1]


def kv_token_starts(kv_lens: torch.Tensor) -> torch.Tensor:
    """int64 ``[batch + 1]``: request b's first flattened KV token (prefix sums of kv_len;
    for ragged KV this is kv_indptr)."""
    out = torch.zeros(kv_lens.numel() + 1, dtype=torch.int64, device="cpu")
    torch.cumsum(kv_lens.to(torch.int64), 0, out=out[1:])
    return out


def plan_kv_lengths(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor | None, page_size: int
) -> torch.Tensor:
    """KV tokens per request: from the page counts and last-page lengths (paged, when
    ``kv_last_page_len`` is given) or the token indptr (ragged)."""
    if kv_last_page_len is not None:
        return kv_lengths_paged(kv_indptr, kv_last_page_len, page_size)
    return lengths(kv_indptr)


@dataclass(frozen=True)
class PlanShape:
    """What the planner needs to know about heads, the kernel and the workspace."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    tile_q_tokens: int
    num_ctas: int  # CTAs the device holds at once (SMs x CTAs per SM)
    workspace_bytes: int
    kv_align: int = 128
    walk_ctas: int = 0  # > 0: items placed for the Hopper kernel's walk (PrefillPlanner.configure)


def make_host_plan(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor | None,
    kv_last_page_len: torch.Tensor | None,
    page_size: int,
    shape: PlanShape,
    tile_ranges: RangeProgram | None = None,
    tile_map: np.ndarray | None = None,
    map_reserve: int = 0,
    map_on_device: bool = False,
) -> HostPlan:
    """Schedule and workspace layout from checked host index tensors (CPU), with a planner
    of its own (the plan owns its buffers); see ``prefill_plan.host_plan``."""
    planner = PrefillPlanner()
    paged = kv_indices is not None and kv_last_page_len is not None
    tables = [
        None if t is None else t.to(torch.int32).contiguous()
        for t in (qo_indptr, kv_indptr, kv_indices, kv_last_page_len)
    ]
    if not paged:
        tables[2] = tables[3] = None
    qo, kv, ids, last = tables
    if not planner.check(qo, kv, ids, last, page_size):  # type: ignore[arg-type]
        raise ValueError("make_host_plan: the index tensors do not pass the plan() checks")
    planner.configure(
        shape.num_qo_heads, shape.num_kv_heads, shape.head_dim, shape.tile_q_tokens,
        shape.num_ctas, shape.workspace_bytes, map_reserve, shape.kv_align, KV_BLOCK,
        shape.walk_ctas,
    )  # fmt: skip
    host_map = None if tile_map is None else np.ascontiguousarray(tile_map, dtype=np.uint8)
    return host_plan(planner, shape.head_dim, tile_ranges, host_map, map_on_device)
