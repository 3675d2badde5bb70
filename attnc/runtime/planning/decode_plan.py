"""Owns: the Python binding of the decode step planner, the C++ library built from
``attnc/kernels/host/`` (``decode_plan.cpp`` and its headers) and called through ctypes.

``DecodePlanner`` is made once per wrapper with its fixed pinned host buffer and
``WorkspaceLayout``. ``configure`` sets the scalars of one shape; ``step`` then runs
``BatchDecodeWrapper.plan()``'s host work in one C call: the page-table checks on the raw int32
arrays, the wait for the previous copies, the plan (split-KV chunks, heaviest-first LPT
assignment onto the CTAs, merge list) written into the buffer, and the copies of the work
region and page ids to the workspace. A plan that needs the KV lengths before the step (the
mask's range rows read them) calls ``check`` and then ``step_checked``, which plans the
checked tables without checking them again. Failures come back as codes
(``attnc/abi_codes.h``) and are raised here with the words of ``checks/page_table.py``.

The library is built on first use (``decode_plan_library.py``); when it cannot be built or
loaded, ``PlannerUnavailable`` says why (the nvcc command and its output).
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from attnc.runtime import abi
from attnc.runtime.checks import page_table
from attnc.runtime.checks.limits import check_paged_kv_tokens, kv_tokens_past_int32
from attnc.runtime.checks.tensors import I32_MAX
from attnc.runtime.planning.decode_plan_library import (
    MAX_SPLIT_FACTORS,
    PlanParams,
    PlanSummary,
    StepParams,
    StepResult,
    library,
)
from attnc.runtime.planning.host_planner_abi import RangeRows
from attnc.runtime.planning.workspace import (
    ITEM_INTS,
    MERGE_INTS,
    CapacityError,
    WorkspaceLayout,
)

if TYPE_CHECKING:
    from attnc.runtime.planning.mask_ranges import RangeProgram

_PLAN_OK = abi.PLAN_OK
ALPHA = 16.0  # cost of one query token of an item, in KV tokens
BETA = 1.0  # cost of one KV token
MIN_CHUNK = 256  # never split a request into chunks shorter than this (read at configure)
SPLIT_FACTORS = (1, 2, 4)  # candidate chunks: (cost per CTA) / factor, and "no split" (same)
OUT_OF_RANGE_MESSAGE = (
    "decode plan: the batch is beyond the planner's limits (KV lengths of at most "
    "2^31 - 2^16 tokens, "
    "fewer than 2^31 work items, heads, q_len, CTAs and KV tile below 2^30, finite positive "
    "costs); nothing was planned"
)


class StepPlan(NamedTuple):
    """What one plan decided (``AttncPlanSummary``); the arrays it wrote are read back from
    the planner's host buffer until the next plan overwrites them. (A named tuple: one is
    made per ``plan()``.)"""

    num_items: int
    num_split: int  # split requests (rows of merge_items)
    merge_rows: int
    chunk_size: int  # KV tokens per chunk; 0 when no request is split
    num_part_slots: int
    work_bytes: int  # bytes of the work region copied to the workspace
    planner: DecodePlanner
    generation: int

    def _region(self, offset: int, ints: int) -> np.ndarray:
        if self.generation != self.planner.generation:
            raise RuntimeError("decode plan: a later plan() has overwritten this plan's arrays")
        return self.planner.buffer[offset : offset + 4 * ints].view(np.int32).copy()

    @property
    def items(self) -> np.ndarray:
        """int32 [num_items, 8] in CTA order (request, KV head, row block, begin, end, slot)."""
        lay = self.planner.layout
        return self._region(lay.items, self.num_items * ITEM_INTS).reshape(-1, ITEM_INTS)

    @property
    def merge_items(self) -> np.ndarray:
        """int32 [num_split, 4] (request, chunks, first slot, 0)."""
        lay = self.planner.layout
        return self._region(lay.merge_items, self.num_split * MERGE_INTS).reshape(-1, MERGE_INTS)

    @property
    def cta_indptr(self) -> np.ndarray:
        """int32 [num_ctas + 1]: the items of CTA b are items[cta_indptr[b]:cta_indptr[b+1]]."""
        return self._region(self.planner.layout.cta_indptr, self.planner.num_ctas + 1)


def _result_word(name: str) -> int:
    """The int64 word of ``AttncStepResult`` holding field ``name`` (a summary field:
    ``AttncPlanSummary``'s, inside the result), from the ctypes mirrors' offsets."""
    if name in (field[0] for field in PlanSummary._fields_):
        return (StepResult.summary.offset + getattr(PlanSummary, name).offset) // 8
    return getattr(StepResult, name).offset // 8


# One read of the result's words gives the step's batch, largest page id and KV tokens, and
# the summary fields of ``StepPlan`` (its leading fields, named as in ``AttncPlanSummary``).
_step_words = operator.itemgetter(*map(_result_word, ("batch", "max_page", "total_kv")))
_plan_words = operator.itemgetter(*map(_result_word, StepPlan._fields[:-2]))


class DecodePlanner:
    """The decode planner writing into one fixed uint8 host buffer laid out by ``layout``."""

    def __init__(self, buf: np.ndarray, layout: WorkspaceLayout) -> None:
        if not (
            type(buf) is np.ndarray and buf.dtype == np.uint8 and buf.ndim == 1
            and buf.flags.c_contiguous and buf.flags.writeable
        ):  # fmt: skip
            raise ValueError("DecodePlanner: buf must be a writeable contiguous 1-D uint8 array")
        self._lib = lib = library()
        self.buffer, self.layout, self.generation = buf, layout, 0
        n = max(layout.max_batch, 1)
        self._kv, self._page_begin = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self._vis_offset, self._vis_len = np.zeros(n, np.int64), np.zeros(n, np.int64)
        st = self._step = StepParams()
        p = st.plan
        p.buf, p.buf_bytes, p.off_header = buf.ctypes.data, buf.shape[0], layout.header
        p.off_cta_indptr, p.off_req_page_begin = layout.cta_indptr, layout.req_page_begin
        p.off_req_kv_len, p.off_merge_items = layout.req_kv_len, layout.merge_items
        p.off_items = layout.items
        st.max_batch, st.max_pages = layout.max_batch, layout.max_pages
        st.kv_out, st.page_begin_out = self._kv.ctypes.data, self._page_begin.ctypes.data
        self.result = StepResult()
        self._step_ref, self._result_ref = ctypes.byref(st), ctypes.byref(self.result)
        # The result as int64 words: one read gives the step's batch, largest page id and
        # summary (AttncStepResult: 8 words, then AttncPlanSummary).
        words = ctypes.cast(ctypes.pointer(self.result), ctypes.POINTER(ctypes.c_int64))
        self._result_words = np.ctypeslib.as_array(words, (ctypes.sizeof(StepResult) // 8,))
        self.batch = 0  # requests of the last step
        self.max_page = -1  # largest host page id of the last step (-1: none, or on the device)
        self.total_kv = 0  # its KV tokens as int32 (with kv_token_start; else 0)
        self._token_stage: object = None  # keeps the kv_token_start stage alive
        self._stage_bytes = 0
        self._stage: object = None  # keeps the page stage alive
        self._ranges_alive: tuple[object, ...] = ()  # keeps the mask's range rows alive
        st.span_offset, st.span_len = self._vis_offset.ctypes.data, self._vis_len.ctypes.data
        # Waits for the last copies and frees the event when the planner goes.
        self._finalizer = weakref.finalize(self, lib.attnc_decode_release, st)
        self._finalizer.atexit = False

    @property
    def num_ctas(self) -> int:
        """CTAs of the configured shape."""
        return int(self._step.plan.num_ctas)

    def configure(
        self, q_len: int, num_qo_heads: int, num_kv_heads: int, row_blocks: int, num_ctas: int,
        kv_tile: int, max_part_rows: int, page_size: int, max_items: int | None, *,
        min_chunk: int | None = None, alpha: float = ALPHA, beta: float = BETA,
        split_factors: tuple[int, ...] | None = None,
    ) -> None:  # fmt: skip
        """Set the scalars of one shape (ints; ``max_items`` None: no limit; ``min_chunk``
        and ``split_factors`` None: the module's ``MIN_CHUNK`` and ``SPLIT_FACTORS``)."""
        factors = SPLIT_FACTORS if split_factors is None else split_factors
        if len(factors) > MAX_SPLIT_FACTORS:
            raise ValueError(f"decode plan: at most {MAX_SPLIT_FACTORS} split factors")
        p = self._step.plan
        p.q_len, p.num_qo_heads, p.num_kv_heads = q_len, num_qo_heads, num_kv_heads
        p.row_blocks, p.num_ctas, p.kv_tile = row_blocks, num_ctas, kv_tile
        p.max_part_rows, p.max_items = max_part_rows, -1 if max_items is None else max_items
        p.min_chunk = MIN_CHUNK if min_chunk is None else min_chunk
        p.alpha, p.beta = float(alpha), float(beta)
        p.split_factors[: len(factors)] = factors
        p.num_split_factors = len(factors)
        self._step.page_size = page_size

    def set_visible(self, spans: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Plan only ``spans`` = (offset, length) int64 [batch] of each request (the KV its
        queries may see, start rounded down to a KV tile: what ``spans`` computes) in the
        following plans, or whole requests (None)."""
        p = self._step.plan
        if spans is None:
            p.plan_lens = p.kv_offset = None
            p.visible_count = 0
            return
        offset, length = spans
        n = offset.shape[0]
        if n > self._vis_len.shape[0] or length.shape != offset.shape:
            raise ValueError(f"decode plan: {n} spans for a planner of {self._vis_len.shape[0]}")
        self._vis_offset[:n], self._vis_len[:n] = offset, length
        p.plan_lens, p.kv_offset = self._vis_len.ctypes.data, self._vis_offset.ctypes.data
        p.visible_count = n

    def set_ranges(self, program: RangeProgram | None, extra: np.ndarray | None = None) -> None:
        """Let the following steps compute each request's span from its KV length with the
        mask's range rows (``mask_ranges.tile_range_program``; ``extra``: its extra columns for
        the step's batch, ``program.extra``), or not (None: ``set_visible`` decides)."""
        self._ranges_alive = self._step.ranges.set(program, extra)

    def set_token_starts(self, dev_token_start: int, stage: object, ptr: int) -> None:
        """Let the following steps write kv_token_start (prefix sums of the KV lengths, int32
        [batch + 1]) to the workspace at ``dev_token_start`` through the pinned ``stage`` at
        ``ptr`` (4 * (max_batch + 1) bytes; kept alive)."""
        self._token_stage = stage
        self._step.dev_token_start, self._step.token_stage = dev_token_start, ptr

    def spans(
        self, program: RangeProgram, kv_lens: np.ndarray, q_len: int, kv_tile: int,
        extra: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(offset, length) int64 [batch] the step computes from ``program`` (and its
        ``extra`` columns) for ``kv_lens``: the KV each request's ``q_len`` queries may see,
        clipped to the request, its start rounded down to a KV tile."""
        rows = RangeRows()
        alive = rows.set(program, extra)
        kv = np.ascontiguousarray(kv_lens, dtype=np.int64)
        offset, length = np.empty_like(kv), np.empty_like(kv)
        rc = self._lib.attnc_decode_spans(
            ctypes.byref(rows), kv.ctypes.data, kv.shape[0], q_len, kv_tile,
            offset.ctypes.data, length.ctypes.data,
        )  # fmt: skip
        del alive  # read by the call above
        abi.raise_if_no_memory(rc, "decode plan")
        if rc != abi.PLAN_OK:
            raise ValueError("decode plan: malformed range rows")
        return offset, length

    def bind(self, dev_work: int, dev_page_ids: int, device: int) -> None:
        """The workspace the step copies into (its work region at ``dev_work``, its page id
        region at ``dev_page_ids``) on CUDA device ``device``."""
        st = self._step
        st.dev_work, st.dev_page_ids, st.device = dev_work, dev_page_ids, device

    def set_stage(self, stage: object, ptr: int, nbytes: int) -> None:
        """The pinned staging buffer of host page ids (``stage`` is kept alive); call
        ``wait`` first when replacing one the previous copies may read."""
        self._stage = stage
        st = self._step
        st.page_stage, st.page_stage_bytes = ptr, nbytes
        st.tables_checked = 0  # the ids a check staged were in the old stage
        self._stage_bytes = int(nbytes)

    @property
    def stage_bytes(self) -> int:
        """Bytes of the page-id staging buffer."""
        return self._stage_bytes

    def _tables(self, indptr: tuple[int, int], last: tuple[int, int],
                indices: tuple[int, int], on_device: bool, indptr_checked: bool) -> None:  # fmt: skip
        st = self._step
        st.kv_indptr, st.indptr_len = indptr
        st.indptr_checked = indptr_checked
        st.last_page_len, st.last_len = last
        st.kv_indices, st.indices_len = indices
        st.indices_on_device = on_device
        st.tables_checked = 0  # no check has passed these tables yet

    def check(self, indptr: tuple[int, int], last: tuple[int, int],
              indices: tuple[int, int], on_device: bool,
              indptr_checked: bool = False) -> np.ndarray:  # fmt: skip
        """Only the page-table checks of ``step`` (each table an (address, entries) pair of
        int32 host data; page ids on the device or the host; ``indptr_checked``: the
        caller has checked kv_indptr's entries, ``checks.tensors.check_indptr_values``): the
        KV length per request. ``step_checked`` then plans these tables: what it needs of
        them is kept here (host page ids staged as they are checked, after a wait for the
        previous copies: size the stage first, ``set_stage``)."""
        self._tables(indptr, last, indices, on_device, indptr_checked)
        self._raise_for(self._lib.attnc_decode_check(self._step_ref, self._result_ref))
        return self._kv[: self.result.batch].copy()

    def step(self, indptr: tuple[int, int], last: tuple[int, int],
             indices: tuple[int, int], on_device: bool, stream: int,
             indptr_checked: bool = False) -> StepPlan:  # fmt: skip
        """Check the page table (kv_indptr's entries not when ``indptr_checked``: the
        caller has), wait for the previous copies, plan into the buffer and queue the copies
        on ``stream``; ``self.result`` holds the batch, nnz and largest page id (also in
        ``batch`` and ``max_page``)."""
        self._tables(indptr, last, indices, on_device, indptr_checked)
        self._step.stream = stream
        return self._planned(self._lib.attnc_decode_step(self._step_ref, self._result_ref))

    def step_checked(self, stream: int) -> StepPlan:
        """``step`` of the tables the last ``check`` passed, without checking them again."""
        st = self._step
        if not st.tables_checked:
            raise RuntimeError("decode plan: step_checked() needs tables that check() passed")
        st.stream = stream
        return self._planned(self._lib.attnc_decode_step_checked(self._step_ref, self._result_ref))

    def _planned(self, rc: int) -> StepPlan:
        """The plan of a step that returned ``rc`` (raised unless ``PLAN_OK``)."""
        if rc != _PLAN_OK:
            self._raise_for(rc)
        w = self._result_words.tolist()
        self.batch, self.max_page, self.total_kv = _step_words(w)
        self.generation = generation = self.generation + 1
        n, split, merge_rows, chunk, part_slots, work_bytes = _plan_words(w)
        return StepPlan(n, split, merge_rows, chunk, part_slots, work_bytes, self, generation)

    def plan_params(self, p: PlanParams) -> StepPlan:
        """``attnc_decode_plan`` on a filled parameter struct (``params()`` plus the requests
        and any test outputs): the plan into the buffer, no checks, no copies."""
        summary = PlanSummary()
        self._raise_for(
            self._lib.attnc_decode_plan(ctypes.byref(p), ctypes.byref(summary)), summary
        )
        return self._summary(summary)

    def params(self) -> PlanParams:
        """A copy of the configured parameter struct (tests fill its outputs)."""
        return PlanParams.from_buffer_copy(self._step.plan)

    def _summary(self, s: PlanSummary) -> StepPlan:
        self.generation += 1
        return StepPlan(
            s.num_items, s.num_split, s.merge_rows, s.chunk_size, s.num_part_slots, s.work_bytes,
            self, self.generation,
        )  # fmt: skip

    def _check_step_kv_tokens(self) -> None:
        """The ``ValueError`` naming a request of the refused step whose KV tokens pass the
        kernels' limit (``limits.check_paged_kv_tokens``, as prefill names it), from the
        step's host tables; returns when none does."""
        st = self._step
        n = int(st.indptr_len)
        if n < 2 or int(st.last_len) != n - 1:
            return
        indptr = _host_int32(st.kv_indptr, n)
        last = _host_int32(st.last_page_len, n - 1)
        check_paged_kv_tokens(torch.from_numpy(indptr), torch.from_numpy(last), int(st.page_size))

    def _raise_for(self, rc: int, summary: PlanSummary | None = None) -> None:
        if rc == abi.PLAN_OK:
            return
        abi.raise_if_no_memory(rc, "decode plan")
        r, st = self.result, self._step
        if rc == abi.PLAN_INVALID:
            raise page_table.planner_error(
                r.error, r.index, r.value, r.value2, st.page_size, st.max_batch, st.max_pages
            )
        if rc == abi.PLAN_CAPACITY:
            needed = (summary or r.summary).num_items
            raise CapacityError(
                f"decode plan: needs {needed} work items, the wrapper holds "
                f"{st.plan.max_items} (raise max_batch_size or pass a larger max_work_items)"
            )
        if rc == abi.PLAN_OUT_OF_RANGE and summary is None and r.total_kv > I32_MAX:
            raise kv_tokens_past_int32(int(r.total_kv))
        if rc == abi.PLAN_OUT_OF_RANGE:
            if summary is None:  # a step: a request past the KV limit is named
                self._check_step_kv_tokens()
            raise ValueError(OUT_OF_RANGE_MESSAGE)
        raise RuntimeError(f"attnc: decode plan: {self.cuda_error(int(r.cuda_error))}")

    def wait(self) -> None:
        """Wait for the copies of the last step (out of the pinned buffers)."""
        rc = self._lib.attnc_decode_wait(self._step_ref)
        if rc:
            raise RuntimeError(f"attnc: decode plan: {self.cuda_error(rc)}")

    def cuda_error(self, code: int) -> str:
        """The CUDA runtime's words for ``code``."""
        text = self._lib.attnc_decode_cuda_error(int(code))
        return text.decode() if text else f"CUDA error {code}"


def _host_int32(address: int, count: int) -> np.ndarray:
    """``count`` int32 values at the host ``address`` as an int64 copy."""
    pointer = ctypes.cast(address, ctypes.POINTER(ctypes.c_int32))
    return np.ctypeslib.as_array(pointer, (count,)).astype(np.int64)
