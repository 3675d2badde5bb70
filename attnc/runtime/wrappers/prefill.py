"""Owns: the batch prefill API, ``BatchPrefillWrapper`` (plan once per step, run per layer).

This file holds ``plan()`` and what it prepares; ``run()`` lives in ``prefill_run.py`` (with
the plan's call memo in ``prefill_calls.py``). One-request prefill (``Variant.prefill``) lives
in ``single_prefill.py``; the ctypes launch and the ``attnc::prefill`` custom op in
``prefill_launch.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnc.runtime import abi
from attnc.runtime.build.backends import (
    PrefillChoice,
    check_backend,
    choose_prefill_module,
    prebuild_prefill_module,
)
from attnc.runtime.build.modules import PrefillModule
from attnc.runtime.checks import tensors
from attnc.runtime.checks.page_status import PageStatus, debug_checks_enabled
from attnc.runtime.checks.params import check_params_arg, check_variant, token_sizes
from attnc.runtime.planning import prefill_plan_library, workspace_owner
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK, PlannedMask
from attnc.runtime.planning.plan_params import (
    params_keys,
    split_plan_params,
    variant_mask_reads,
)
from attnc.runtime.planning.prefill_plan import HostPlan, host_plan
from attnc.runtime.planning.prefill_planner import PrefillPlanner
from attnc.runtime.planning.tensor_stamps import own_write
from attnc.runtime.planning.tile_map import TileMapSummary, summarize
from attnc.runtime.wrappers import (
    prefill_batch,
    prefill_calls,
    prefill_ctas,
    prefill_launch,
    prefill_tile_map,
)
from attnc.runtime.wrappers.plan_guard import one_plan_at_a_time
from attnc.runtime.wrappers.prefill_run import PrefillRunner

if TYPE_CHECKING:
    from attnc.runtime.variant import Variant


class BatchPrefillWrapper(PrefillRunner):
    """Prefill over a batch of requests with ragged or paged KV.

    ``plan()`` runs on the CPU once per batch step (checks the index tensors, builds the work
    list and copies it into ``workspace_buffer``); ``run()`` checks the tensors and launches.
    The paged kernels also check every page id they read against the cache (a corrupted or
    device-updated copy of the page table): ``check()`` reports one.

    A mask that reads per-token tensors (``tensor<...>[kv_len]`` / ``[q_len]``) gets a tile
    map when ``plan(params=...)`` is given them: it lives in the last ``max_tile_map_bytes``
    of the workspace (default: an eighth, at most 64 MiB), a place fixed for the wrapper.
    By default (``wait_for_tile_map=False``) ``plan()`` on a CUDA workspace does not wait
    for it: tiles are planned by the mask's closed form, and the plan's copy, the map's
    classifier and a step that cuts each work item to its map row and orders the items by
    it are queued on the stream (``tile_map`` is then None; the map and the cut work list
    must fit in ``max_tile_map_bytes``, else that plan waits). With
    ``wait_for_tile_map=True``, and always on a CPU workspace, ``plan()`` builds the map and
    waits for it, then ranges and costs tiles by it (``tile_map`` summarises it). A CPU
    workspace plans on the host but still builds its kernel for the host's GPU, so it needs one.
    """

    _map_builder: prefill_tile_map.HostMapBuilder | None = None  # tests: a CPU-built map

    _debug_checks = False  # ATTNC_DEBUG_CHECKS: run() synchronises and reads the page status

    def __init__(
        self,
        variant: Variant,
        workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        backend: str | None = None,
        max_tile_map_bytes: int | None = None,
        wait_for_tile_map: bool = False,
    ):
        check_variant(variant)
        kv_layout = tensors.check_kv_layout(kv_layout)
        self._wait_for_map = tensors.check_flag("wait_for_tile_map", wait_for_tile_map)
        self.backend = check_backend(backend)
        self.variant = variant
        self.kv_layout = kv_layout
        self._workspace = tensors.workspace_bytes(workspace_buffer)
        self._workspace_range = tensors.byte_range(self._workspace)
        self._workspace_key = workspace_owner.workspace_key(self._workspace, self._workspace_range)
        self._page_status = PageStatus(self._workspace.device)
        self._debug_checks = debug_checks_enabled()
        self._plan: HostPlan | None = None
        self._map_written = False  # this plan() has written its tile map into the workspace
        self._no_plan_why = "called before plan()"
        self._planner: PrefillPlanner | None = None  # made at the first plan()
        self._copied: torch.cuda.Event | None = None  # after the last copy of the lists
        self._map_staging = prefill_tile_map.PinnedStaging()
        cpu = self._workspace.device.type == "cpu"
        self._host_workspace = self._workspace.numpy() if cpu else None
        self._map_host: tuple[np.ndarray, int] | None = None  # the plan's map and tile
        self._checked_heads: tuple[int, ...] = ()  # the last heads check_heads passed
        self._params_seen: tuple[object, object] = (None, None)  # _plan_params' last answer
        # and its last checks: (what they read, (scalars, names of the tensors))
        self._params_checked: tuple[object, tuple[dict[str, object], tuple[str, ...]]] = (
            None,
            ({}, ()),
        )
        # (total_q, total_kv, requests) of the last checked batch and its token_sizes
        self._sizes_of: tuple[tuple[int, ...], dict[str, int]] = ((), {})
        self._choices: dict[tuple[object, ...], PrefillChoice] = {}  # _module_choice's
        self._copy_event: torch.cuda.Event | None = None
        self._map_summary: TileMapSummary | None = None
        self._planned_mask = NO_PLANNED_MASK
        # The template serving the last successful plan: "sm90" or "fa2"; None before one.
        self.planned_backend: str | None = None
        self._reads = variant_mask_reads(variant)
        if max_tile_map_bytes is None:
            reserve = prefill_tile_map.default_map_reserve(self._workspace.numel(), self._reads)
        else:
            reserve = tensors.check_int(
                "max_tile_map_bytes", max_tile_map_bytes, 0, self._workspace.numel() // 2
            )
        self._map_reserve = reserve
        self._batch_sizes: dict[str, int] = {}  # token_sizes of the plan
        self._memo: dict[tuple[object, ...], prefill_calls.MemoCall] = {}  # run()'s, this plan's

    @one_plan_at_a_time
    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        kv_indices: torch.Tensor | None = None,
        kv_last_page_len: torch.Tensor | None = None,
        page_size: int | None = None,
        sm_scale: float | None = None,
        dtype: torch.dtype = torch.bfloat16,
        params: Mapping[str, object] | None = None,
    ) -> None:
        """Check the batch description and prepare the work list (paged if ``kv_indices``).

        ``params`` optionally gives param values now. Scalars and per-request tensors
        (``tensor<i32>[batch_size]``) the mask's bounds read (a sliding window's width, a
        prefix length, ``window[batch]``) let the scheduler size each query tile's KV range,
        so the heaviest tiles start first and long ones are split; without them it assumes
        every tile sees the whole KV. Per-token tensors the mask reads (``doc[kv_idx]``)
        build the tile map: EMPTY blocks are neither loaded nor costed, FULL ones run
        unmasked. ``run()`` must then be given the same values (tensors: the same tensor,
        unchanged). Tensors are checked against the batch: a ``kv_len`` tensor has
        sum(kv_len) entries, a ``q_len`` one sum(q_len), a ``batch_size`` one batch.
        """
        heads, sm = self._plan_scalars(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale)
        num_qo_heads, num_kv_heads, head_dim = heads
        if self._planner is None:
            self._first_builds(dtype, head_dim, paged=kv_indices is not None)
        planner = self._planner if self._planner is not None else self._host_planner()
        qo_t, kv_t, paged = prefill_batch.checked_batch(
            planner, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size
        )
        checked = planner.result
        batch = (checked.total_q, checked.total_kv, planner.batch)
        scalars, plan_tensors, planned_mask = self._plan_params(
            check_params_arg(params), heads, batch
        )
        group, max_q = num_qo_heads // num_kv_heads, max(checked.max_q, 1)
        choice = self._module_choice(dtype, head_dim, group, max_q, paged)
        self._map_written = False
        try:
            host, host_map = self._plan_lists(
                choice,
                planner,
                (num_qo_heads, num_kv_heads, head_dim, group, max_q),
                (scalars, plan_tensors, planned_mask, qo_t, kv_t, sm),
            )
        except BaseException:
            if self._map_written:  # over the map of the plan in force: that plan is gone
                self._forget_plan()
            raise
        self._keep_plan(choice, host, host_map, planned_mask)
        self._keep_launch(host, heads, dtype, sm)

    def _plan_scalars(
        self,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        sm_scale: float | None,
    ) -> tuple[tuple[int, int, int], float]:
        """The plan's heads as ints (checked unless they are the plain ints last checked),
        then its dtype checked, and the scale the kernels take."""
        heads = (num_qo_heads, num_kv_heads, head_dim)
        # Types first: comparing a numpy array to the checked heads is ambiguous.
        if not _plain_ints(num_qo_heads, num_kv_heads, head_dim) or heads != self._checked_heads:
            tensors.check_heads(num_qo_heads, num_kv_heads, head_dim)
            heads = (int(num_qo_heads), int(num_kv_heads), int(head_dim))
            self._checked_heads = heads
        if type(dtype) is not torch.dtype or dtype not in tensors.KV_DTYPES:
            tensors.check_dtype_arg(dtype)
        return heads, tensors.check_sm_scale(sm_scale, heads[2])

    def _keep_plan(
        self,
        choice: PrefillChoice,
        host: HostPlan,
        host_map: np.ndarray | None,
        planned_mask: PlannedMask,
    ) -> None:
        """A successful plan's lists, module, tile map and mask become the plan in force (its
        calls' memo starts empty)."""
        self._planned_mask = planned_mask
        self.planned_backend = choice.backend
        self._map_host = None if host_map is None else (host_map, choice.tile_q_tokens)
        self._map_summary = None
        self._plan, self._module = host, choice.module
        self._memo = {}

    def _keep_launch(
        self, host: HostPlan, heads: tuple[int, int, int], dtype: torch.dtype, sm: float
    ) -> None:
        """What ``run()`` reads of the plan in force, as plain values (``run()`` reads no host
        tensor: ``torch.compile`` traces it), and the launch's ``meta``."""
        self._heads = heads
        self._batch_sizes = self._sizes_of[1]
        self._dtype = dtype
        self._sm_scale = sm
        self._total_q, self._total_kv = int(host.total_q), int(host.nnz)
        self._max_page = int(host.max_page)
        self._paged, self._page_size = bool(host.paged), int(host.page_size)
        status = self._page_status.ptr if host.paged else 0
        kv_code = abi.paged_kv_code(self.kv_layout) if host.paged else abi.KV_RAGGED
        self._meta = prefill_launch.launch_meta(host, self._heads, kv_code, status)

    def _plan_lists(
        self,
        choice: PrefillChoice,
        planner: PrefillPlanner,
        shape: tuple[int, int, int, int, int],
        inputs: tuple[
            dict[str, object],
            dict[str, torch.Tensor],
            PlannedMask,
            torch.Tensor,
            torch.Tensor,
            float,
        ],
    ) -> tuple[HostPlan, np.ndarray | None]:
        """The work lists of the checked batch, in the workspace (with the tile map, built
        here or queued on the device), and the map's host copy where one was built."""
        num_qo_heads, num_kv_heads, head_dim, group, max_q = shape
        scalars, plan_tensors, planned_mask, qo_t, kv_t, sm = inputs
        module, tile = choice.module, choice.tile_q_tokens
        host_map, queued = None, None
        if self._reads.needs_tile_map:
            found = self._map_inputs(scalars, plan_tensors, (qo_t, kv_t, tile, sm))
            if found is not None and self._queues_map():
                queued = found
            elif found is not None:
                host_map = self._build_map(module, found)
        ctas = prefill_ctas.device_ctas(module, self._workspace.device, head_dim, group, max_q)
        planner.configure(
            num_qo_heads, num_kv_heads, head_dim, tile, ctas, self._workspace.numel(),
            self._map_reserve, walk_ctas=prefill_ctas.walk_ctas(choice.backend, self._reads, ctas),
        )  # fmt: skip
        self._wait_for_copy()  # the planner's buffer is the source of the last plan's copy
        host = host_plan(planner, head_dim, planned_mask.program, host_map, queued is not None)
        self._take_workspace()  # the lists (and a queued map) are written next
        if queued is not None and self._queue_map(module, host, queued):
            self._mark_copy()
        else:
            if queued is not None:  # no room for the queued step: build the map and wait
                host_map = self._build_map(module, queued)
                host = host_plan(planner, head_dim, planned_mask.program, host_map)
            self._copy_to_workspace(host)
        return host, host_map

    def _forget_plan(self) -> None:
        """After a refused plan() that wrote its tile map over the planned one's: nothing is
        planned (run() would read the refused plan's map with the old work lists)."""
        self._plan = None
        self._memo = {}
        self._map_host, self._map_summary = None, None
        self.planned_backend = None
        self._no_plan_why = (
            "the last plan() was refused after it had rebuilt the tile map in the workspace "
            "over the plan in force; call plan() again"
        )

    def _plan_params(
        self, params: Mapping[str, object], heads: tuple[int, int, int], batch: tuple[int, ...]
    ) -> tuple[dict[str, object], dict[str, torch.Tensor], PlannedMask]:
        """The checked scalars and tensors of ``params`` and the mask they plan, for the
        batch's (total_q, total_kv, requests). The last answer is kept for the same scalars
        in a batch of the same sizes (tensors' values are read on every plan: a write torch
        does not count, through ``.data`` or numpy, must be planned by the next ``plan()``),
        and the last checks for values they would pass again (tensors of the same metadata,
        equal scalars): only the mask is made again then."""
        if batch != self._sizes_of[0]:
            self._sizes_of = (batch, token_sizes(*batch))
        keys = params_keys(params)
        same = None if keys is None or keys[0] is None else (keys[0], heads, batch)
        if same is not None and same == self._params_seen[0]:
            return self._params_seen[1]  # type: ignore[return-value]
        checked = None if keys is None else (keys[1], heads, batch)
        scalars: dict[str, object]
        plan_tensors: dict[str, torch.Tensor]
        if checked is not None and checked == self._params_checked[0]:
            scalars, names = self._params_checked[1]
            plan_tensors = {k: params[k] for k in names}  # type: ignore[misc]
        else:
            sizes = dict(zip(("num_qo_heads", "num_kv_heads", "head_dim"), heads, strict=True))
            sizes.update(self._sizes_of[1])
            scalars, plan_tensors = split_plan_params(
                self.variant, params, sizes=sizes, device=self._workspace.device
            )
            self._params_checked = (checked, (scalars, tuple(plan_tensors)))
        # The plan writes the workspace: a tensor there would be overwritten before the map is
        # built from it (run() refuses such a tensor too).
        tensors.check_outside_workspace(
            self._workspace_range, tuple((f"param '{k}'", t) for k, t in plan_tensors.items())
        )
        if plan_tensors:
            planned_mask = PlannedMask.from_values(
                self.variant, scalars, plan_tensors, tile_map=True
            )
        else:
            planned_mask = PlannedMask.from_plan_params(self.variant, scalars)
        found = (scalars, plan_tensors, planned_mask)
        self._params_seen = (same, found)  # the stamps keep the planned tensors alive
        return found

    def _module_choice(
        self, dtype: torch.dtype, head_dim: int, group: int, max_q: int, paged: bool
    ) -> PrefillChoice:
        """``choose_prefill_module`` for this wrapper's variant and backend, remembered per
        (dtype, head_dim, group, longest query, layout)."""
        key = (dtype, head_dim, group, max_q, paged)
        found = self._choices.get(key)
        if found is None:
            found = choose_prefill_module(
                self.variant.ir,
                self.backend,
                dtype=dtype,
                head_dim=head_dim,
                group=group,
                max_q_len=max_q,
                kv_layout="paged" if paged else "ragged",
                device=self._workspace.device,
            )
            if len(self._choices) >= _CHOICES:
                self._choices.pop(next(iter(self._choices)))
            self._choices[key] = found
        return found

    @property
    def tile_map(self) -> TileMapSummary | None:
        """The current plan's map summary (None: the plan has no tile map)."""
        if self._map_host is None:
            return None
        if self._map_summary is None:
            host_map, tile = self._map_host
            plan = self._require_plan()
            self._map_summary = summarize(
                host_map, plan.q_lens, plan.kv_lens, tile, abi.TILE_MAP_KV_BLOCK
            )
        return self._map_summary

    def _first_builds(self, dtype: torch.dtype, head_dim: int, paged: bool) -> None:
        """At the first plan() on a GPU with the planner library not yet loaded: that library
        builds on a thread while this one builds the kernel module the plan will take, so a
        new variant's first call waits for the longer nvcc run, not for both in turn."""
        if not self._workspace.is_cuda or prefill_plan_library.loaded():
            return
        planner_build = prefill_plan_library.build_in_background()
        try:
            prebuild_prefill_module(
                self.variant.ir,
                self.backend,
                dtype=dtype,
                head_dim=head_dim,
                kv_layout="paged" if paged else "ragged",
                device=self._workspace.device,
            )
        finally:
            planner_build.join()

    def _host_planner(self) -> PrefillPlanner:
        if self._planner is None:
            self._planner = PrefillPlanner(pinned=self._workspace.is_cuda)
        return self._planner

    def _wait_for_copy(self) -> None:
        """Wait for the last plan's copy out of the planner's buffer (done already when a
        later synchronisation, the map's, covered it: then no wait)."""
        if self._copied is not None:
            if not self._copied.query():
                self._copied.synchronize()
            self._copied = None

    def _queues_map(self) -> bool:
        """Whether plan() queues the map without waiting (wait_for_tile_map=False on a CUDA
        workspace; a CPU workspace or a host map builder always builds first)."""
        return not self._wait_for_map and self._host_workspace is None and not self._map_builder

    def _queue_map(self, module: PrefillModule, host: HostPlan, found: _MapStep) -> bool:
        """Queue the plan's copy, the classifier and the item step (False: no room for the
        map and its scratch; nothing queued)."""
        values, inputs = found
        lists = (self._planner.out_address, host.buffer.shape[0])  # type: ignore[union-attr]
        return prefill_tile_map.queue_tile_map(
            module, self._workspace, inputs, values, self._reads, self._map_reserve,
            (*lists, host.layout.offsets, int(host.result.num_items)),
        )  # fmt: skip

    def _build_map(self, module: PrefillModule, found: _MapStep) -> np.ndarray:
        """The uint8 host copy of this plan's tile map, built and waited for (into the
        workspace's map region, which the plan in force reads until this plan succeeds)."""
        values, inputs = found
        return prefill_tile_map.build_tile_map(
            module, self._workspace, inputs, values, self._reads, self._map_reserve,
            self._map_builder, self._map_staging, self._host_workspace, self._mark_map_written,
        )  # fmt: skip

    def _mark_map_written(self) -> None:
        """The map region is about to be overwritten: a refusal from here on ends the plan in
        force, which reads it."""
        self._map_written = True
        self._take_workspace()

    def _take_workspace(self) -> None:
        """This wrapper writes the workspace now: another wrapper's plan there is gone."""
        self._plan_token = workspace_owner.take(self._workspace_key, self._plan_token)

    def _map_inputs(
        self,
        scalars: Mapping[str, object],
        plan_tensors: Mapping[str, torch.Tensor],
        batch: tuple[torch.Tensor, torch.Tensor, int, float],
    ) -> _MapStep | None:
        """The classifier's param values and inputs for this plan (None: plan() was not given
        every param the mask reads: tiles keep their closed-form classes). ``batch``: the
        checked qo_indptr and kv_indptr, the tile size and sm_scale."""
        heads = self._checked_heads
        sizes = dict(zip(("num_qo_heads", "num_kv_heads", "head_dim"), heads, strict=True))
        sizes.update(self._sizes_of[1])
        values = prefill_tile_map.map_values(
            self.variant, self._reads, scalars, plan_tensors, sizes, self._workspace.device
        )
        if values is None:
            return None
        planner = self._host_planner()
        qo_t, kv_t, tile, sm = batch
        inputs = prefill_tile_map.MapInputs(
            qo_t, kv_t, planner.q_lens, planner.kv_lens, planner.map_starts(tile), tile,
            self._checked_heads, sm,  # type: ignore[arg-type]
        )  # fmt: skip
        return values, inputs

    def _copy_to_workspace(self, host: HostPlan) -> None:
        """Copy the packed lists (the planner's buffer, pinned for a CUDA workspace) to the
        workspace; on a device an event marks when the buffer may be written again."""
        n = host.buffer.shape[0]
        if self._host_workspace is not None:  # a CPU workspace: one memcpy
            self._host_workspace[:n] = host.buffer
            return
        source = self._planner.out_tensor[:n]  # type: ignore[union-attr]
        written = self._workspace[:n]  # the copy bumps the allocation's version: attnc's own
        own_write(written, lambda: written.copy_(source, non_blocking=True))
        if self._workspace.is_cuda:
            self._mark_copy()

    def _mark_copy(self) -> None:
        """Record on the current stream the event after which the planner's buffer, the
        source of the copy just queued, may be written again."""
        if self._copy_event is None:
            self._copy_event = torch.cuda.Event()
        self._copy_event.record(torch.cuda.current_stream(self._workspace.device))
        self._copied = self._copy_event


_CHOICES = 64  # module choices a wrapper remembers

# A plan's map step: the classifier's param values and inputs.
_MapStep = tuple[dict[str, object], prefill_tile_map.MapInputs]


def _plain_ints(*values: object) -> bool:
    """True when every value is a Python int (not a bool, not a numpy int)."""
    return all(type(v) is int for v in values)
