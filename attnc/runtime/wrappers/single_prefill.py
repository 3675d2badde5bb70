"""Owns: prefill of one request (``Variant.prefill``): its checks, the planned wrappers it
reuses per shape (each thread its own, per CUDA stream), and the ``attnc::single_prefill``
custom op ``torch.compile`` sees.

A param's way to the kernel: ``resolve_params`` checks the keyword arguments once, here;
the resolved values go straight to ``BatchPrefillWrapper._run_checked``, which packs them
once (``prefill_launch.pack_params``) for the launch. Under ``torch.compile`` the planning
(host work on concrete lengths) runs inside the custom op, so the traced graph holds one
op and no host code.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from attnc.compiler.numeric import F32_INT_LIMIT, F32_MAX, F32_MIN_NORMAL
from attnc.runtime.build.backends import check_backend
from attnc.runtime.checks import tensors
from attnc.runtime.checks.limits import check_single_request
from attnc.runtime.planning.mask_ranges import mask_bound_params
from attnc.runtime.planning.plan_params import variant_mask_reads
from attnc.runtime.planning.prefill_plan import MAX_MAP_ENTRIES
from attnc.runtime.planning.tile_map import map_entries
from attnc.runtime.planning.workspace import ITEM_INTS, aligned
from attnc.runtime.tracing import compiling
from attnc.runtime.variant import live_variant
from attnc.runtime.wrappers.cuda_stream import raw_stream
from attnc.runtime.wrappers.forward_only import forward_only
from attnc.runtime.wrappers.op_fakes import register_attention_fake
from attnc.runtime.wrappers.params_lists import join_params, split_params
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

if TYPE_CHECKING:
    from attnc.runtime.variant import Variant

SINGLE_PARTIAL_BYTES = 8 << 20  # split-KV partial states of one single-request plan
_SINGLE_PLANS = 8  # planned single-request wrappers kept per variant, thread and stream


class _OneRequestWrapper(BatchPrefillWrapper):
    """A planned wrapper of ``Variant.prefill``: it reaches its variant through a weak
    reference, so the variant, which holds its planned wrappers, is freed by reference
    counting when the caller drops it (with a strong one, only the cyclic collector freed the
    two, and the workspaces' device memory waited for it)."""

    @property
    def variant(self) -> Variant:
        """The variant planned for (alive while a call of it runs)."""
        variant = self._variant_ref()
        if variant is None:  # the variant's own plans go with it: no call reaches here
            raise RuntimeError("Variant.prefill: the variant of this plan is gone")
        return variant

    @variant.setter
    def variant(self, variant: Variant) -> None:
        self._variant_ref = weakref.ref(variant)


def thread_plans(variant: Variant) -> dict[tuple[object, ...], BatchPrefillWrapper]:
    """The calling thread's planned wrappers of ``variant``, by plan key (held by the
    variant's memo, ``variant_memo.ThreadPlans``)."""
    return variant.memo.prefill_plans.by_key


def _stream_of(device: torch.device) -> int:
    """The current stream of a CUDA ``device`` as an integer (0 on other devices): a
    wrapper's workspace is reused in the order of one stream only."""
    return raw_stream(device) if device.type == "cuda" else 0


@forward_only("Variant.prefill")
def single_prefill(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float | None = None,
    return_lse: bool = False,
    params: Mapping[str, object] | None = None,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One request: q ``[q_len, H_qo, D]``, k/v ``[kv_len, H_kv, D]`` -> O (and LSE).

    ``backend`` picks the prefill template (``"auto"``, ``"fa2"``, ``"sm90"``; see
    :mod:`attnc.runtime.build.backends`); under ``torch.compile`` the process default is used."""
    backend = check_backend(backend)
    q = tensors.check_data_tensor("q", q, (None, None, None))
    k = tensors.check_data_tensor("k", k, (None, None, q.shape[2]))
    tensors.check_same_kind("k", k, "q", q)
    values = variant.resolve_request(q, k, params or {})
    if compiling():
        # The checks eager runs before its launch, on the traced shapes and Python values.
        check_single_request(q.shape[0], k.shape[0])
        v = tensors.check_data_tensor("v", v, tuple(k.shape))
        tensors.check_same_kind("v", v, "k", k)
        if isinstance(sm_scale, torch.Tensor):
            raise ValueError(
                "sm_scale: under torch.compile give a Python float (a tensor would have to be "
                "read back to the host inside the graph)"
            )
        # Its kind, sign and an int's float32 range here, by comparisons a symbolic number
        # traces (dynamo makes a number that changed between calls symbolic; math.isfinite
        # cannot trace one, nor can float() of an int past float64's range); a float's float32
        # range in the op's body, where it is a number again.
        # Not tensors.check_sm_scale, which calls both and quotes the value: it runs in that
        # body (the plan) and in eager calls.
        if sm_scale is not None:
            if isinstance(sm_scale, bool) or not isinstance(sm_scale, int | float):
                kind = type(sm_scale).__name__
                raise ValueError(f"sm_scale: under torch.compile give a Python float, got {kind}")
            # An int's range first, by int comparisons: comparing a symbolic int with a float
            # converts it (an int past float64's range fails). No message shows the value: a
            # symbolic one cannot be formatted as it traces.
            if isinstance(sm_scale, int) and not sm_scale < F32_INT_LIMIT:
                raise ValueError(
                    f"sm_scale: an int from {F32_INT_LIMIT} on is inf as the kernels' float32 "
                    f"scale; give a number from {F32_MIN_NORMAL!r} to {F32_MAX!r}"
                )
            if not (sm_scale > 0 if isinstance(sm_scale, int) else 0.0 < sm_scale < math.inf):
                raise ValueError("sm_scale: must be a finite number > 0")
        ints, floats, tensor_params = split_params(variant.params, values)
        handle: int = variant.handle
        o, lse = single_prefill_op(
            handle, q, k, v, sm_scale, ints, floats, tensor_params, return_lse
        )
        return (o, lse) if return_lse else o
    # Eager: the resolved values go straight to the op's body.
    return run_one(variant, q, k, v, sm_scale, return_lse, values, backend)


def run_one(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float | None,
    return_lse: bool,
    values: Mapping[str, object],
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plan (or reuse the plan of this shape) and launch, with resolved param ``values``
    (the body of ``attnc::single_prefill``). The tensors' memory is checked here, on the
    real tensors (alignment, strides, apart from the workspace), as ``run()`` checks it."""
    mask_values = {name: values[name] for name in _mask_names(variant)}
    wrapper = _planned(variant, q, k, sm_scale, mask_values, backend)
    views = wrapper._kv_views((k, v))
    wrapper._check_memory(q, views, None, values)
    return wrapper._run_checked(q, views, None, return_lse, values)


def _mask_names(variant: Variant) -> tuple[str, ...]:
    """The params ``plan()`` is given: those the mask's bounds read (it sizes the tiles' KV
    ranges with them) and, for a mask that reads per-token tensors, every param the mask
    reads (they build the tile map, per call). Remembered in the variant's memo."""
    names = variant.memo.prefill_mask_names
    if names is None:
        analysis = variant.compiled.mask_analysis
        found = set(mask_bound_params(analysis))
        reads = variant_mask_reads(variant)
        if reads.needs_tile_map:
            found |= reads.params
        names = variant.memo.prefill_mask_names = tuple(sorted(found))
    return names


def _workspace_for(
    q_len: int, kv_len: int, heads: tuple[int, int], needs_map: bool, device: torch.device
) -> tuple[torch.Tensor, int | None]:
    """A workspace for one request of ``q_len`` tokens and its tile-map reserve (None: the
    mask needs no map, or no tile holds the GQA group, which the plan refuses): lists for
    1-token tiles of up to 16 KV heads, room for split-KV partial states and, for a mask that
    needs one, the map of the narrowest query tile the kernels take for these (query, KV)
    ``heads``, with room after it for the work list that the device cuts by the map (so the
    plan need not wait for it). The map's room stops at the most tiles the kernels index
    (``prefill_plan.MAX_MAP_ENTRIES``: a larger map is refused by the plan); a request whose
    map is past it even at the widest query tile is refused here, before anything is
    allocated."""
    lists = 6 * 256 + 16 * 32 * max(q_len, 1) + 1024
    group = heads[0] // max(heads[1], 1)
    if not needs_map or group > WIDEST_TILE_ROWS:
        return torch.empty(lists + SINGLE_PARTIAL_BYTES, dtype=torch.uint8, device=device), None
    queries, keys = max(q_len, 1), max(kv_len, 1)
    fewest = map_entries(queries, keys, WIDEST_TILE_ROWS // group)
    if fewest > MAX_MAP_ENTRIES:
        raise ValueError(
            f"q, k: the mask reads tensors, so {q_len} queries over {kv_len} keys need a tile "
            f"map of at least {fewest} tiles, past the {MAX_MAP_ENTRIES} the kernels step "
            "through with 32-bit ints; split the request"
        )
    tile = _narrowest_tile(group, queries)
    entries = min(map_entries(queries, keys, tile), MAX_MAP_ENTRIES)
    items = -(-queries // tile) * heads[1] + SINGLE_PARTIAL_BYTES // 256  # tiles x heads, splits
    reserve = aligned(entries) + aligned(4 * ITEM_INTS * items)
    total = max(lists + SINGLE_PARTIAL_BYTES + reserve, 2 * reserve)  # a reserve <= half
    return torch.empty(total, dtype=torch.uint8, device=device), reserve


# The most query rows (tokens x group) a prefill tile holds: the Hopper template's widest.
# It and _narrowest_tile repeat the templates' tiles (prefill_config.cuh, sm90/
# prefill_sm90_config.cuh): the workspace is sized before plan() chooses a module to ask.
# tests/codegen/test_selection_mirrors.py pins both against the headers.
WIDEST_TILE_ROWS = 192


def _narrowest_tile(group: int, q_len: int) -> int:
    """The fewest query tokens a prefill tile holds for a GQA group on a query of ``q_len``
    tokens: its rows over the group. The 16-row tile runs only where the whole query fits
    it; else every template's tile has 64 rows or more (FA2: 64 or its widest, 64 to 128;
    Hopper: 128 or 192)."""
    for rows in (16, 64):
        if group <= rows and (rows > 16 or q_len * group <= 16):
            return rows // group
    return 1


def _planned(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    sm_scale: float | None,
    mask_values: Mapping[str, object],
    backend: str = "auto",
) -> BatchPrefillWrapper:
    """A wrapper planned for one request of this shape and these mask params, reused while they
    repeat (a new plan allocates a workspace and copies the work list to the device). Tensor
    params (a tile map's, per-request bounds) are planned again on every call. Plans are
    found by the value of ``sm_scale`` (a tensor or numpy scale is read on every call).
    Each thread plans its own wrappers, one per current CUDA stream: another call never
    re-plans a wrapper between this call's plan and its launch, nor writes a workspace that
    a launch on another stream may still read."""
    check_single_request(q.shape[0], k.shape[0])  # before the int32 indptrs hold them
    if sm_scale is not None and type(sm_scale) is not float:
        sm_scale = tensors.sm_scale_value(sm_scale, q.shape[2])
    device = q.device
    key = (
        device,
        _stream_of(device),
        q.shape[0],
        k.shape[0],
        q.shape[1],
        k.shape[1],
        q.shape[2],
        q.dtype,
        sm_scale,
        backend,
    ) + tuple(
        (name, repr(value))
        for name, value in mask_values.items()
        if not isinstance(value, torch.Tensor)
    )
    with_tensors = any(isinstance(value, torch.Tensor) for value in mask_values.values())
    cache = thread_plans(variant)
    wrapper = cache.pop(key, None)
    if wrapper is None or with_tensors:
        indptr = torch.zeros(2, dtype=torch.int32, device="cpu")
        qo_indptr, kv_indptr = indptr.clone(), indptr.clone()
        qo_indptr[1], kv_indptr[1] = q.shape[0], k.shape[0]
        if wrapper is None:
            tensors.check_heads(q.shape[1], k.shape[1], q.shape[2])  # before the map's size
            needs_map = variant_mask_reads(variant).needs_tile_map
            heads = (q.shape[1], k.shape[1])
            workspace, reserve = _workspace_for(q.shape[0], k.shape[0], heads, needs_map, device)
            wrapper = _OneRequestWrapper(
                variant, workspace, backend=backend, max_tile_map_bytes=reserve
            )
            wrapper._checked_heads = (q.shape[1], k.shape[1], q.shape[2])  # checked above
        wrapper.plan(
            qo_indptr, kv_indptr, q.shape[1], k.shape[1], q.shape[2], sm_scale=sm_scale,
            dtype=q.dtype, params=mask_values,
        )  # fmt: skip
        while len(cache) >= _SINGLE_PLANS:
            cache.pop(next(iter(cache)))
    cache[key] = wrapper  # most recently used last
    return wrapper


@torch.library.custom_op("attnc::single_prefill", mutates_args=())
def single_prefill_op(
    variant_handle: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float | None,
    int_params: list[int],
    float_params: list[float],
    tensor_params: list[torch.Tensor],
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional one-request prefill of the variant ``variant_handle``: (O, LSE or empty)."""
    variant = live_variant(variant_handle)
    if variant is None:  # a graph (torch.export) that outlived its variant
        raise RuntimeError(
            f"attnc::single_prefill: variant handle {variant_handle} names no live variant; "
            "keep the Variant a graph calls alive while the graph is used"
        )
    values = join_params(variant.params, int_params, float_params, tensor_params)
    # The process default, as eager calls without a backend take it (ATTNC_PREFILL_BACKEND).
    result = run_one(variant, q, k, v, sm_scale, return_lse, values, check_backend(None))
    if isinstance(result, tuple):
        return result
    return result, torch.empty((0,), dtype=torch.float32, device=q.device)


register_attention_fake(single_prefill_op, q_index=1)
