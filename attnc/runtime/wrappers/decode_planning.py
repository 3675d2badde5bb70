"""Owns: the plan half of ``BatchDecodeWrapper``: the workspace layout and the C++ planner
(``planning/decode_plan.py``) made at construction, ``plan()`` (a fast path for a step that
repeats the last plan's shape, and the fully checked path), the decode module per shape,
and the plan-fixed fields of ``AttncDecodeArgs`` (workspace pointers, heads, grid), which
``decode_launch.fill_plan_fields`` writes.

``plan()`` hands the page table to the planner, which checks it, writes the work lists into
a pinned host buffer and copies them with one copy into the fixed work region of the
workspace (page ids follow with a second copy). Scalars are checked once, on the checked
path; the fast path only recognises the scalars of the last checked plan. Each argument is
checked once: those that plan-time tensor params are sized by (head counts, q_len,
kv_indptr) where the params are checked, then handed on checked (``CheckedSizes``); the page
table once by the planner, also when the mask's range rows need its KV lengths before the
step (``DecodePlanner.check``, then ``step_checked``). The mask made of ``plan()``'s params,
and its commit, are ``decode_plan_masks.py``'s.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnc.runtime.abi import FLAG_MERGE, AttncDecodeArgs
from attnc.runtime.build import toolchain
from attnc.runtime.build.modules import DecodeModule, get_decode_module
from attnc.runtime.checks import tensors
from attnc.runtime.checks.kv import KvViews
from attnc.runtime.checks.page_status import PageStatus, debug_checks_enabled
from attnc.runtime.checks.params import check_params_arg, check_variant, token_sizes
from attnc.runtime.planning import workspace_owner
from attnc.runtime.planning.decode_plan import DecodePlanner, StepPlan
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK, RangeProgram
from attnc.runtime.planning.workspace import make_layout
from attnc.runtime.wrappers import cuda_stream, decode_launch
from attnc.runtime.wrappers.decode_calls import CachedCall
from attnc.runtime.wrappers.decode_plan_inputs import (
    MAX_Q_LEN,
    CheckedSizes,
    DecodeShape,
    FastPathKey,
    PlanInputs,
    fast_path_takes,
    ids_placement,
)
from attnc.runtime.wrappers.decode_plan_masks import DecodeMaskPlanning, MaskPlan
from attnc.runtime.wrappers.plan_guard import one_plan_at_a_time

if TYPE_CHECKING:
    from attnc.runtime.variant import Variant

DEFAULT_MAX_BATCH = 256
MAX_CTAS_PER_SM = 8
_GET_RAW_STREAM = cuda_stream.GET_RAW_STREAM


def _count(name: str, value: int | None, default: int) -> int:
    """A capacity argument: ``default`` for None, else an int >= 1 (``check_int``)."""
    return default if value is None else tensors.check_int(name, value)


def _pinned_empty(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True, device="cpu")


class DecodePlanning(DecodeMaskPlanning, workspace_owner.RefusesCopies):
    """The plan half of the decode wrapper (see the module docstring); ``BatchDecodeWrapper``
    adds ``run()``."""

    _debug_checks = False  # ATTNC_DEBUG_CHECKS: run() synchronises and reads the page status
    _plans_begun = 0  # plan() calls begun (plan_guard): run() launches no plan made meanwhile
    _planning = False  # a plan() of this wrapper is running (plan_guard)
    _reads_kv_tokens = False  # the variant reads a kv_len tensor (set in __init__)
    _token_sizes: dict[str, int] | None = None  # token_sizes of the last plan
    _token_sizes_of: tuple[int, int, int] | None = None  # its (batch, q_len, KV tokens)
    # A kernel was launched since plan() last read the page status (sticky under CUDA
    # graphs: replays of a captured run() launch without passing through Python).
    _launched = False
    _workspace_range = (0, 0)  # the workspace's bytes [start, end) (checks.memory.byte_range)
    # The workspace (workspace_owner.workspace_key) and the token of this wrapper's last plan
    # written there (no workspace, no token: nothing to check).
    _workspace_key: workspace_owner.WorkspaceKey = ("", -1, 0, 0)
    _plan_token: workspace_owner.PlanToken | None = None

    def __init__(
        self,
        variant: Variant,
        workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        max_batch_size: int | None = None,
        *,
        max_work_items: int | None = None,
        max_num_pages: int | None = None,
    ) -> None:
        check_variant(variant)
        kv_layout = tensors.check_kv_layout(kv_layout)
        use_graph = tensors.check_flag("use_cuda_graph", use_cuda_graph)
        # The capacities are ints >= 1, checked before the regions are placed by them.
        max_batch = _count("max_batch_size", max_batch_size, DEFAULT_MAX_BATCH)
        max_items = _count("max_work_items", max_work_items, max(16384, 64 * max_batch))
        max_pages = (
            None if max_num_pages is None else tensors.check_int("max_num_pages", max_num_pages)
        )
        self._ws = tensors.workspace_bytes(workspace_buffer, require_cuda=True)
        self._workspace_range = tensors.byte_range(self._ws)
        self._workspace_key = workspace_owner.workspace_key(self._ws, self._workspace_range)
        self.variant = variant
        self.kv_layout = kv_layout
        self.use_cuda_graph = use_graph
        self._device = self._ws.device
        self._num_sms = torch.cuda.get_device_properties(self._device).multi_processor_count
        self.layout = make_layout(
            self._ws.numel(), max_batch, max_items, MAX_CTAS_PER_SM * self._num_sms, max_pages
        )
        work_bytes = self.layout.work_bytes(max_items)
        self._pinned = torch.zeros(work_bytes, dtype=torch.uint8, pin_memory=True, device="cpu")
        self._pinned_np = self._pinned.numpy()
        self._native: DecodePlanner | None = None  # the planner, made by the first plan()
        self._device_index = self._device.index if self._device.index is not None else 0
        self._fast: FastPathKey | None = None  # the shape of the last plan, for the fast path
        self._modules: dict[tuple[object, ...], tuple[DecodeModule, int, int, int]] = {}
        self._shape: DecodeShape | None = None
        self._module: DecodeModule | None = None
        self._args = AttncDecodeArgs()
        self._args_ref = ctypes.byref(self._args)
        # The device page-id check's status word (fixed address: CUDA graphs replay it).
        self._page_status = PageStatus(self._device)
        self._args.page_status = self._page_status.ptr
        self._debug_checks = debug_checks_enabled()
        self._max_page = -1
        self._batch = 0
        self._last_kv: tuple[tuple[object, ...], object, KvViews] | None = None
        # The run side's caches that a new plan may invalidate.
        self._calls: dict[tuple[object, ...], CachedCall] = {}
        self._q_rows = 0
        self._planned_mask = NO_PLANNED_MASK  # the params given to plan(), its mask's KV ranges
        # Variants that read a kv_len tensor get kv_token_start (else the args' pointer is
        # null and kernels use 0); their run() checks tensor shapes against the batch.
        decls = variant.params
        self._reads_kv_tokens = any(d.token_dim == "kv_len" for d in decls)
        self.last_schedule: StepPlan | None = None
        self._init_run_side()

    def _init_run_side(self) -> None:
        """The run side's own state, set up last in ``__init__`` (``BatchDecodeWrapper``)."""

    # ---- plan ------------------------------------------------------------------------
    @one_plan_at_a_time
    def plan(
        self,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        q_len_per_request: int = 1,
        sm_scale: float | None = None,
        dtype: torch.dtype = torch.bfloat16,
        params: Mapping[str, object] | None = None,
    ) -> None:
        """Check the page table, schedule the step and copy the work lists to the device.

        ``params`` optionally gives scalar param values now. Those the mask's bounds read (a
        sliding window's width) let the scheduler chunk and cost only the KV each request
        may see; ``run()`` must then be given the same values. The planner computes each
        request's span from its KV length and the mask's range rows; repeated scalar values
        take the fast path, per-request tensor params (``window[batch]``) the checked path on
        every plan (their values go with the rows as extra columns).

        After runs of a plan whose ``kv_indices`` lived on the device, ``plan()`` first
        synchronises and raises the ``ValueError`` of a page id the kernels found outside the
        cache (see ``check()``); without a run since the last read (of a wrapper without
        ``use_cuda_graph``) there is nothing new to read and it does not synchronise.
        """
        if self._page_status.pending and self._launched:
            self._page_status.raise_if_set()
            self._launched = self.use_cuda_graph
        planned = self._planned_mask
        program = None
        mask: MaskPlan | None = None
        checked = None  # the sizes checked with tensor params
        params = check_params_arg(params)
        if params or planned.values or getattr(planned, "tensors", None):
            sizes = (kv_indptr, num_qo_heads, num_kv_heads, head_dim, q_len_per_request)
            mask = self._mask_ranges(params, sizes)
            program, checked = mask[0].program, mask[2]
        fast = self._fast
        if fast is not None and fast_path_takes(
            fast, program, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads,
            head_dim, page_size, q_len_per_request, sm_scale, dtype,
        ):  # fmt: skip
            on_device = ids_placement(kv_indices, self._device_index)
            if on_device is not None:
                if checked is not None:  # its copy, of the values checked
                    kv_indptr = checked.kv_indptr
                self._plan_fast(
                    fast, kv_indptr, kv_indices, kv_last_page_len, on_device, checked is not None
                )
                self._commit_mask(mask)
                return
        inputs = PlanInputs(
            kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim,
            page_size, q_len_per_request, sm_scale, dtype,
        )  # fmt: skip
        self._plan_checked(inputs, program, checked)
        self._commit_mask(mask)

    def _plan_fast(
        self,
        fast: FastPathKey,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        on_device: bool,
        indptr_checked: bool = False,
    ) -> None:
        """The fast path's plan (``fast_path_takes``): the last checked plan's shape with a
        new page table, scheduled and copied in C++ (``indptr_checked``: kv_indptr's entries
        were checked with the tensor params)."""
        sched = self._native_step(
            fast.q_len, kv_indptr, kv_indices, kv_last_page_len, on_device, indptr_checked
        )
        self._set_token_sizes(fast.q_len)
        self._args.flags = FLAG_MERGE if self.use_cuda_graph or sched.merge_rows else 0
        self.last_schedule = sched
        self._last_kv = None

    def _plan_checked(
        self,
        inputs: PlanInputs,
        program: RangeProgram | None = None,
        checked: CheckedSizes | None = None,
    ) -> None:
        """``plan()`` with every scalar and tensor check in Python first (a new shape, inputs
        the fast path does not take, or the mask's range rows ``program`` from plan-time
        params), but those of ``checked`` (the sizes checked with tensor params: not checked
        again); the page table's values are checked by the planner (kv_indptr's not when
        ``checked`` holds it)."""
        self._fast = None
        kv_indptr, kv_indices, kv_last_page_len = inputs[:3]
        num_qo_heads, num_kv_heads, head_dim, page_size, q_len, scale = self._checked_scalars(
            inputs, checked
        )
        if checked is None:
            indptr = tensors.host_int32("kv_indptr", kv_indptr)
        else:
            indptr = checked.kv_indptr
        indptr_checked = checked is not None
        last = tensors.host_int32("kv_last_page_len", kv_last_page_len)
        pages_dev = self._check_indices(kv_indices)
        ids = kv_indices.detach().resolve_neg().contiguous()
        module, rows, kv_tile, per_sm = self._module_for(
            inputs.dtype, head_dim, q_len * (num_qo_heads // num_kv_heads)
        )
        num_ctas = max(1, min(per_sm * self._num_sms, self.layout.max_ctas))
        shape = DecodeShape(
            num_qo_heads, num_kv_heads, head_dim, page_size, q_len, inputs.dtype, scale, rows,
            num_ctas,
        )  # fmt: skip
        self._check_graph_shape(shape)
        native = self._configured_planner(shape, kv_tile)
        extra, tables_checked = None, False
        if program is not None and program.by_request:  # the rows' per-request columns
            tables = (indptr, last, ids)
            extra, tables_checked = self._range_columns(
                program, native, tables, pages_dev, q_len, indptr_checked
            )
        native.set_ranges(program, extra)
        native.set_visible(None)
        sched = self._native_step(
            q_len, indptr, ids, last, pages_dev, indptr_checked, tables_checked
        )
        self._set_token_sizes(q_len)
        # Plans whose rows have per-request columns compute them each time (never the fast
        # path). The key holds checked ints; the fast path takes only plain ints equal to them.
        sm_scale = inputs.sm_scale
        if extra is None and (sm_scale is None or type(sm_scale) is float):
            key = (num_qo_heads, num_kv_heads, head_dim, page_size, q_len, sm_scale, inputs.dtype)
            self._fast = FastPathKey(key, q_len, program)
        self._keep_shape(shape, module, sched)

    def _checked_scalars(
        self, inputs: PlanInputs, checked: CheckedSizes | None = None
    ) -> tuple[int, int, int, int, int, float]:
        """The one check of the plan's scalars (the fast path only recognises checked ones):
        num_qo_heads, num_kv_heads, head_dim, page_size and q_len as ints, and the scale the
        kernels take; the head counts, head_dim and q_len taken from ``checked`` when they
        were checked with tensor params (in the same order: heads, dtype, page_size, q_len,
        sm_scale)."""
        if checked is None:
            num_qo_heads, num_kv_heads, head_dim = inputs[3:6]
            tensors.check_heads(num_qo_heads, num_kv_heads, head_dim)
            num_qo_heads, num_kv_heads = int(num_qo_heads), int(num_kv_heads)
            head_dim = int(head_dim)
        else:
            num_qo_heads, num_kv_heads, head_dim = checked[:3]
        tensors.check_dtype_arg(inputs.dtype)
        page_size = tensors.check_int("page_size", inputs.page_size)
        if checked is None:
            q_len = tensors.check_int("q_len_per_request", inputs.q_len, 1, MAX_Q_LEN)
        else:
            q_len = checked.q_len
        scale = tensors.check_sm_scale(inputs.sm_scale, head_dim)
        return num_qo_heads, num_kv_heads, head_dim, page_size, q_len, scale

    def _check_graph_shape(self, shape: DecodeShape) -> None:
        """A ``use_cuda_graph`` wrapper's later plans keep the shape of its first."""
        if self.use_cuda_graph and self._shape is not None and shape != self._shape:
            raise ValueError(
                "plan: a use_cuda_graph wrapper must keep num_qo_heads, num_kv_heads, head_dim, "
                f"page_size, q_len_per_request, dtype and sm_scale (planned {self._shape}, "
                f"got {shape})"
            )

    def _configured_planner(self, shape: DecodeShape, kv_tile: int) -> DecodePlanner:
        """The planner, configured for a plan of ``shape`` over KV tiles of ``kv_tile``."""
        q_len, num_qo_heads, num_kv_heads = shape.q_len, shape.num_qo_heads, shape.num_kv_heads
        row_blocks = -(-q_len * (num_qo_heads // num_kv_heads) // shape.rows_per_item)
        native = self._planner()
        native.configure(
            q_len, num_qo_heads, num_kv_heads, row_blocks, shape.num_ctas, kv_tile,
            self.layout.max_part_rows(shape.head_dim), shape.page_size, self.layout.max_items,
        )  # fmt: skip
        return native

    def _range_columns(
        self,
        program: RangeProgram,
        native: DecodePlanner,
        tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        pages_dev: bool,
        q_len: int,
        indptr_checked: bool,
    ) -> tuple[np.ndarray | None, bool]:
        """The per-request columns of the mask's range rows ``program`` (read from the KV
        lengths, for which the planner checks the page ``tables`` when the rows read them;
        ``indptr_checked``: kv_indptr's entries are checked already), and whether the planner
        checked the tables (the step then plans them unchecked: ``step_checked``)."""
        indptr, last, ids = tables
        if program.reads_lengths:
            spans = ((indptr.data_ptr(), indptr.shape[0]), (last.data_ptr(), last.shape[0]))
            ids_span = (ids.data_ptr(), ids.shape[0])
            self._fit_stage(native, ids_span[1], pages_dev)  # check() stages the ids
            kv_lens = native.check(*spans, ids_span, pages_dev, indptr_checked)
        else:
            kv_lens = np.zeros(max(indptr.shape[0] - 1, 0), np.int64)
        return program.extra(np.full_like(kv_lens, q_len), kv_lens), program.reads_lengths

    def _keep_shape(self, shape: DecodeShape, module: DecodeModule, sched: StepPlan) -> None:
        """A checked plan's shape, module and schedule, and the launch fields they fix."""
        if shape != self._shape:
            self._calls.clear()  # cached calls hold strides and params of the old shape
            self._shape = shape
        self._module = module
        self.last_schedule = sched
        decode_launch.fill_plan_fields(
            self._args, self.layout, self._ws.data_ptr(), shape, kv_layout=self.kv_layout,
            token_starts=self._reads_kv_tokens, merge_ctas=2 * self._num_sms,
            merge=self.use_cuda_graph or sched.merge_rows > 0,
            params_size=ctypes.sizeof(module.params_type),
        )  # fmt: skip
        self._last_kv = None

    def _planner(self) -> DecodePlanner:
        """The wrapper's planner, made (and its library built) on first use."""
        native = self._native
        if native is None:
            native = DecodePlanner(self._pinned_np, self.layout)
            base = self._ws.data_ptr()
            native.bind(base, base + self.layout.page_ids, self._device_index)
            if self._reads_kv_tokens:
                stage = _pinned_empty(4 * (self.layout.max_batch + 1))
                native.set_token_starts(base + self.layout.kv_token_start, stage, stage.data_ptr())
            self._native = native
        return native

    def _native_step(
        self,
        q_len: int,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        on_device: bool,
        indptr_checked: bool = False,
        tables_checked: bool = False,
    ) -> StepPlan:
        """Checks, plan and copies in C++ (``DecodePlanner.step``) on contiguous int32
        tables (page ids on the workspace's device or the CPU); sets the batch and the
        largest page id. Not checked again: kv_indptr's entries with ``indptr_checked``, the
        tables that ``DecodePlanner.check`` has just passed with ``tables_checked``
        (``step_checked``)."""
        native = self._native
        assert native is not None
        num_ids = kv_indices.numel()  # the tables are 1-D (numel: cheaper than shape[0])
        if not tables_checked:  # else check() staged the ids (the stage sized before it)
            self._fit_stage(native, num_ids, on_device)
        stream = (
            _GET_RAW_STREAM(self._device_index) if _GET_RAW_STREAM is not None
            else decode_launch.raw_stream(self._device)
        )  # fmt: skip
        if tables_checked:
            sched = native.step_checked(stream)
        else:
            sched = native.step(
                (kv_indptr.data_ptr(), kv_indptr.numel()),
                (kv_last_page_len.data_ptr(), kv_last_page_len.numel()),
                (kv_indices.data_ptr(), num_ids),
                on_device,
                stream,
                indptr_checked,
            )
        # Written (a refused step writes nothing: the plan in force stays the workspace's).
        self._plan_token = workspace_owner.take(self._workspace_key, self._plan_token)
        self._max_page = native.max_page  # -1: none, or ids on the device (not read back)
        # Ids unchecked on the host: the kernels check them and the next plan() reads.
        self._page_status.pending = on_device
        self._batch = batch = native.batch
        self._q_rows = batch * q_len
        return sched

    def _fit_stage(self, native: DecodePlanner, num_ids: int, on_device: bool) -> None:
        """Grow the pinned stage of host page ids to hold ``num_ids`` (at most the workspace's
        page ids), before the planner copies them there."""
        if not on_device:
            need = 4 * min(num_ids, self.layout.max_pages)
            if need > native.stage_bytes:
                native.wait()  # the previous copy out of the old stage
                stage = _pinned_empty(max(need, 1 << 16) * 2)
                native.set_stage(stage, stage.data_ptr(), stage.numel())

    def _set_token_sizes(self, q_len: int) -> None:
        """The batch sizes run() checks tensor params with (for a variant that reads a
        ``kv_len`` tensor, the step's KV tokens: the planner copied ``kv_token_start``, the
        prefix sums of the planned KV lengths, into its fixed workspace region). Cached calls
        checked their tensor params against the old sizes: they are dropped when these
        change."""
        native = self._native
        assert native is not None
        batch, total = self._batch, native.total_kv
        if self._token_sizes_of != (batch, q_len, total):  # else the same as the last plan's
            sizes = token_sizes(batch * q_len, total if self._reads_kv_tokens else 0, batch)
            if sizes != self._token_sizes:
                self._calls.clear()
            self._token_sizes = sizes
            self._token_sizes_of = (batch, q_len, total)

    def _check_indices(self, kv_indices: object) -> bool:
        """The tensor checks of ``kv_indices`` (its values are the planner's); True when it
        lives on the device (copied device to device)."""
        ids = tensors.check_index_tensor("kv_indices", kv_indices)
        if ids.device.type == "cuda":
            if ids.device != self._device:
                raise ValueError(f"kv_indices: on {ids.device}, workspace on {self._device}")
            return True
        return False

    def _module_for(
        self, dtype: torch.dtype, head_dim: int, rows_needed: int
    ) -> tuple[DecodeModule, int, int, int]:
        key = (dtype, head_dim, rows_needed)
        hit = self._modules.get(key)
        if hit is None:
            ir = self.variant.ir
            module = get_decode_module(ir, dtype, head_dim, toolchain.device_arch(self._device))
            with torch.cuda.device(self._device):
                rows, kv_tile, per_sm = module.shape(head_dim, rows_needed)
            hit = (module, rows, kv_tile, max(per_sm, 1))
            self._modules[key] = hit
        return hit
