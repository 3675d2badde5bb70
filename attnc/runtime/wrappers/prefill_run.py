"""Owns: the run side of ``BatchPrefillWrapper``: ``run()`` (the checks of a call, or the
plan's call memo, ``prefill_calls.py``), the eager launch and the page-id report
(``check()``). ``plan()`` and what it prepares for ``run()`` live in ``prefill.py``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from attnc.runtime import abi
from attnc.runtime.build.modules import PrefillModule
from attnc.runtime.checks import tensors
from attnc.runtime.checks.kv import KvViews, paged_kv, ragged_kv
from attnc.runtime.checks.page_status import PageStatus
from attnc.runtime.checks.run_memory import check_run_memory
from attnc.runtime.planning import workspace_owner
from attnc.runtime.planning.mask_ranges import PlannedMask
from attnc.runtime.planning.prefill_plan import HostPlan
from attnc.runtime.tracing import compiling
from attnc.runtime.wrappers import call_keys, prefill_calls, prefill_launch
from attnc.runtime.wrappers.forward_only import forward_only
from attnc.runtime.wrappers.op_fakes import new_lse, traced_result
from attnc.runtime.wrappers.params_lists import split_params
from attnc.runtime.wrappers.plan_guard import check_not_replanned
from attnc.runtime.wrappers.prefill_launch import PREFILL_O_STRIDE_MULTIPLE

if TYPE_CHECKING:
    from attnc.runtime.variant import Variant

# A call's memo key, and its kv and params as given.
_MemoRequest = tuple[tuple[object, ...], object, Mapping[str, object]]


class PrefillRunner(workspace_owner.RefusesCopies):
    """``run()`` and ``check()`` of a planned ``BatchPrefillWrapper`` (the attributes below
    are set by its ``plan()``)."""

    variant: Variant
    kv_layout: str
    _plan: HostPlan | None
    _no_plan_why: str  # what run() says while there is no plan
    _plans_begun = 0  # plan() calls begun (plan_guard): run() launches no plan made meanwhile
    _planning = False  # a plan() of this wrapper is running (plan_guard)
    _module: PrefillModule
    _meta: list[int]
    _heads: tuple[int, int, int]
    _dtype: torch.dtype
    _sm_scale: float
    _total_q: int
    _total_kv: int
    _max_page: int
    _paged: bool
    _page_size: int
    _batch_sizes: dict[str, int]
    _planned_mask: PlannedMask
    _workspace: torch.Tensor
    _workspace_range: tuple[int, int]  # its bytes [start, end)
    # The workspace (workspace_owner.workspace_key) and the token of this wrapper's last
    # write there (no workspace, no token: nothing to check).
    _workspace_key: workspace_owner.WorkspaceKey = ("", -1, 0, 0)
    _plan_token: workspace_owner.PlanToken | None = None
    _page_status: PageStatus
    _debug_checks: bool
    _memo: dict[tuple[object, ...], prefill_calls.MemoCall]

    @forward_only("BatchPrefillWrapper.run")
    def run(
        self,
        q: torch.Tensor,
        kv: object,
        /,
        *,
        return_lse: bool = False,
        out: torch.Tensor | None = None,
        **params: object,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch: O ``[total_q, H_qo, D]`` (and LSE ``[total_q, H_qo]``
        float32, natural log, when ``return_lse``)."""
        self._require_plan()
        if return_lse is not False and return_lse is not True:
            tensors.check_flag("return_lse", return_lse)
        key, begun = None, None
        if not compiling():
            begun = self._plans_begun
            workspace_owner.check_held(self._workspace_key, self._plan_token, "BatchPrefillWrapper")
            key = prefill_calls.memo_key(q, kv, out, return_lse, params)
            hit = self._memo.get(key) if key is not None else None
            if hit is not None:
                result = self._run_memo(hit, q, kv, out, return_lse, begun)
                if result is not None:
                    return result
        hq, hkv, d = self._heads
        q = tensors.check_data_tensor("q", q, (self._total_q, hq, d))
        if q.dtype != self._dtype:
            raise ValueError(f"q: dtype {q.dtype} differs from the planned dtype {self._dtype}")
        views = self._kv_views(kv)
        tensors.check_same_kind("k", views.k, "q", q)
        if not tensors.same_device_index(self._workspace, q):
            raise ValueError(f"workspace_buffer: on {self._workspace.device}, q on {q.device}")
        values = self.variant.resolve_for(params, self._heads, q.device, self._batch_sizes)
        self._check_planned_values(values)
        if not compiling():
            out = self._check_memory(q, views, out, values)
        memo = None if key is None else (key, kv, params)
        return self._run_checked(q, views, out, return_lse, values, memo, begun)

    def _check_memory(
        self,
        q: torch.Tensor,
        views: KvViews,
        out: torch.Tensor | None,
        values: Mapping[str, object],
    ) -> torch.Tensor | None:
        """The checked ``out``, apart from q, K, V and the tensor params; those and ``out``
        apart from the workspace (``ValueError`` naming the tensor otherwise)."""
        k_name, v_name = ("kv", "kv") if self._paged else ("k", "v")
        kv = ((k_name, views.k), (v_name, views.v))
        params = call_keys.param_tensors(values)
        workspace = self._workspace_range
        return check_run_memory(q, kv, out, params, workspace, PREFILL_O_STRIDE_MULTIPLE)

    def _run_memo(
        self,
        hit: prefill_calls.MemoCall,
        q: torch.Tensor,
        kv: object,
        out: torch.Tensor | None,
        return_lse: bool,
        begun: int,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """Launch a call whose checks a remembered call of this plan passed (None: its
        tensors may share memory, which the checks of a first call then name). ``begun``:
        the wrapper's ``_plans_begun`` when ``run()`` started."""
        if self._planned_mask.values or self._planned_mask.tensors:
            self._check_planned_values(hit.values)  # the planned tensors are unchanged
        args = prefill_calls.replay_args(hit, q, kv, out)
        if args is None:
            return None
        check_not_replanned(self, begun, "BatchPrefillWrapper")
        o, lse = _outputs(q, out, return_lse)
        args.o = o.data_ptr()
        args.lse = None if lse is None else lse.data_ptr()
        prefill_launch.launch_args(self._module, self._meta, args, q.device, lse)
        return self._launched(o, lse)

    def _check_planned_values(self, values: Mapping[str, object]) -> None:
        """The resolved ``values`` agree with the mask params given to ``plan()``."""
        self._planned_mask.check_run(self.variant.name, values)

    def _require_plan(self) -> HostPlan:
        if self._plan is None:
            raise RuntimeError(f"BatchPrefillWrapper.run(): {self._no_plan_why}")
        return self._plan

    def _kv_views(self, kv: object) -> KvViews:
        """The checked K/V views of ``run()``'s ``kv`` for the current plan."""
        self._require_plan()
        _, hkv, d = self._heads
        if not self._paged:  # plain attributes: torch.compile traces this (no ctypes reads)
            views = ragged_kv(kv, hkv, d, "cuda")
            if views.k.shape[0] != self._total_kv:
                raise ValueError(
                    f"kv_indptr: last value {self._total_kv} does not match "
                    f"k.shape[0] = {views.k.shape[0]}"
                )
            return views
        views = paged_kv(kv, self.kv_layout, self._page_size, hkv, d, "cuda")
        tensors.check_pages_in_range(self._max_page, views.num_pages)
        return views

    def _run_checked(
        self,
        q: torch.Tensor,
        views: KvViews,
        out: torch.Tensor | None,
        return_lse: bool,
        values: Mapping[str, object],
        memo: _MemoRequest | None = None,
        begun: int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Launch on checked tensors and resolved param ``values`` (eagerly through ctypes,
        under ``torch.compile`` through the ``attnc::prefill`` custom op). ``memo``: the
        call's memo key, its ``kv`` and ``params`` as given, to remember the eager launch
        for later calls of the plan. ``begun``: the wrapper's ``_plans_begun`` when the
        eager call started (None: no caller code ran since the plan was read)."""
        module: PrefillModule = self._module
        meta = self._meta
        self.variant.check_derived_values(values, self._sm_scale, self._heads)
        if compiling():
            decls = module.ir.params  # type: ignore[attr-defined]
            ints, floats, tensor_params = split_params(decls, values)
            o, lse = prefill_launch.prefill_op(
                self.variant.handle, module.module_id, q, views.k, views.v, self._workspace, meta,
                self._sm_scale, ints, floats, tensor_params, return_lse,
            )  # fmt: skip
            return traced_result(o, lse, q, out, return_lse)
        o, lse = _outputs(q, out, return_lse)
        params = prefill_launch.pack_params(module, values)
        if begun is not None:
            check_not_replanned(self, begun, "BatchPrefillWrapper")
        launch_tensors = prefill_launch.PrefillTensors(q, views.k, views.v, o, lse, self._workspace)
        args = prefill_launch.launch(module, meta, launch_tensors, self._sm_scale, params)
        if memo is not None:
            self._remember(memo, args, views, q, out, params, values)
        return self._launched(o, lse)

    def _launched(
        self, o: torch.Tensor, lse: torch.Tensor | None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """After a launch: the page-id check under ``ATTNC_DEBUG_CHECKS``, and the result."""
        if self._debug_checks:
            self._page_status.check_after_run()
        return (o, lse) if lse is not None else o

    def _remember(
        self,
        memo: _MemoRequest,
        args: abi.AttncPrefillArgs,
        views: KvViews,
        q: torch.Tensor,
        out: torch.Tensor | None,
        struct: ctypes.Structure,
        values: Mapping[str, object],
    ) -> None:
        key, kv, given = memo
        entry = prefill_calls.remember(
            args, kv, views, (q, out, self._workspace_range), struct, given, values
        )
        if entry is not None:
            if len(self._memo) >= prefill_calls.MAX_MEMO_CALLS:
                self._memo.clear()
            self._memo[key] = entry

    def check(self) -> None:
        """Synchronise the device and raise the ``ValueError`` (naming ``kv_indices``, the
        request and the page id) of a page id a paged kernel found outside ``[0, num_pages)``
        since the last check; the word is cleared. Such a page is never read; the rows of the
        work items that met it are NaN. ``plan()`` checks the ids on the host, so only a
        corrupted or device-updated copy of the table gets here; with
        ``ATTNC_DEBUG_CHECKS=1`` every ``run()`` checks."""
        self._page_status.raise_if_set()


def _outputs(
    q: torch.Tensor, out: torch.Tensor | None, return_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """O (``out`` when given, else a new tensor like ``q``) and, when asked for, a new LSE."""
    o = out if out is not None else torch.empty_like(q)
    lse = new_lse(q) if return_lse else None
    return o, lse
