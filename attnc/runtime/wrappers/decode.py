"""Owns: the decode API, ``BatchDecodeWrapper`` (plan once per step, run once per layer), and
its ``run()``.

``plan()`` (``decode_planning.py``) checks the page table, schedules the step on the C++
planner, copies the work lists into the workspace and fills the plan-fixed half of the
launch argument struct. ``run()`` only patches the q/kv/out pointers and params into that
struct and calls the ctypes launcher (the same grid and the same workspace pointers every
time), so it can be captured in a CUDA graph and replayed after a new ``plan()``. Under
``torch.compile`` the launch goes through the ``attnc::decode`` custom op instead
(``decode_op.py``).

Eager fast path (``decode_calls.py``): a call that repeats a checked one re-checks only what
the current plan changes and launches with the remembered fields. Cached calls survive
``plan()`` while the planned heads, head_dim, page_size, q_len, dtype and sm_scale stay the
same, and while the batch sizes tensor params are checked against (``token_sizes``) do. The per-call
fields are written by ``decode_launch.py``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import torch

from attnc.runtime import abi
from attnc.runtime.checks import memory, tensors
from attnc.runtime.checks.kv import KvViews, paged_kv
from attnc.runtime.checks.run_memory import check_run_memory
from attnc.runtime.planning import workspace_owner
from attnc.runtime.planning.tensor_stamps import check_planned_tensors
from attnc.runtime.tracing import compiling
from attnc.runtime.wrappers import decode_launch
from attnc.runtime.wrappers.call_keys import call_key, param_tensors
from attnc.runtime.wrappers.decode_calls import (
    MAX_CACHED_CALLS,
    CachedCall,
    apply_call,
    kv_identity,
    may_alias,
    remember_call,
)
from attnc.runtime.wrappers.decode_launch import (
    DECODE_O_STRIDE_MULTIPLE,
    ParamsPacker,
    fill_call_fields,
)
from attnc.runtime.wrappers.decode_op import decode_op, register_wrapper
from attnc.runtime.wrappers.decode_planning import DecodePlanning, DecodeShape
from attnc.runtime.wrappers.forward_only import forward_only
from attnc.runtime.wrappers.op_fakes import attention_outputs, new_lse, traced_result
from attnc.runtime.wrappers.params_lists import split_params
from attnc.runtime.wrappers.plan_guard import check_not_replanned


class BatchDecodeWrapper(DecodePlanning):
    """Batched decode over a paged KV cache (NHD ``[pages, 2, page_size, H_kv, D]`` or HND
    ``[pages, 2, H_kv, page_size, D]``, or a ``(k_cache, v_cache)`` tuple), 1..8 query tokens
    per request (speculative decoding), every variant.

    Capacity is fixed at construction: ``max_batch_size`` requests (default 256),
    ``max_work_items`` work items, ``max_num_pages`` page ids (default: a quarter of the
    workspace left after the work lists; the rest holds split-KV partial states). A plan
    beyond it raises ``CapacityError`` (a ``ValueError``). With ``use_cuda_graph=True`` the
    wrapper may be captured; later plans must keep heads, head_dim, page_size, dtype,
    q_len_per_request and sm_scale.
    """

    def _init_run_side(self) -> None:
        """The packed-params cache and the custom-op handle of this wrapper."""
        variant = self.variant
        self._packer = ParamsPacker(variant.params)
        self._all_defaults = all(
            d.kind != "tensor" and d.default is not None for d in variant.params
        )
        self._applied: CachedCall | None = None  # the cached call whose fields are in _args
        self.handle = register_wrapper(self)

    # ---- run -------------------------------------------------------------------------
    @forward_only("BatchDecodeWrapper.run")
    def run(
        self,
        q: torch.Tensor,
        kv_cache: object,
        /,
        *,
        return_lse: bool = False,
        out: torch.Tensor | None = None,
        **params: object,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned step: O ``[batch * q_len, H_qo, D]`` (and the natural-log
        LSE ``[batch * q_len, H_qo]`` float32 when ``return_lse``)."""
        if return_lse is not False and return_lse is not True:
            tensors.check_flag("return_lse", return_lse)
        if compiling():
            return self._run_compiled(q, kv_cache, return_lse, out, params)
        shape, begun = self._shape, self._plans_begun
        if shape is None:
            raise _not_planned()
        workspace_owner.check_held(self._workspace_key, self._plan_token, "BatchDecodeWrapper")
        if not self.use_cuda_graph and torch.cuda.is_current_stream_capturing():
            raise _capture_refused()
        key = call_key(q, kv_cache, out, return_lse, params)
        if key is not None:
            hit = self._calls.get(key)
            # Still valid for the current plan: as many q rows, every planned page in the cache.
            if hit is not None and hit.q_rows == self._q_rows and self._max_page < hit.num_pages:
                if self._planned_mask.tensors:  # the key knows the object, not its writes
                    check_planned_tensors(self.variant.name, self._planned_mask.tensors, params)
                result = self._run_cached(hit, q, out, return_lse, begun)
                if result is not None:
                    return result
        return self._run_checked(q, kv_cache, return_lse, out, params, (shape, begun), key)

    def _run_checked(
        self,
        q: torch.Tensor,
        kv_cache: object,
        return_lse: bool,
        out: torch.Tensor | None,
        params: dict[str, object],
        planned: tuple[DecodeShape, int],
        key: tuple[object, ...] | None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``run()`` past the cached calls: every check, the launch, and the call remembered
        under its ``key`` (None: not cacheable). ``planned``: the plan's shape and the
        wrapper's ``_plans_begun`` when ``run()`` started."""
        shape, begun = planned
        q = self._check_q(q, shape)
        views = self._views(kv_cache, shape)
        values = self._resolve(params, shape)
        if self._planned_mask.values or self._planned_mask.tensors:
            self._planned_mask.check_run(
                self.variant.name,
                values or self._resolve(params, shape, full=True),
            )
        o = self._check_memory(q, views, out, values)
        lse = new_lse(q) if return_lse else None
        module = self._module
        assert module is not None
        struct = self._packer.pack(module.params_type, values)
        check_not_replanned(self, begun, "BatchDecodeWrapper")
        self._applied = None
        fill_call_fields(self._args, q, views, o, lse, struct)
        self._launched = True
        module.launch(self._args_ref, decode_launch.raw_stream(self._device))
        if self._debug_checks:
            self._page_status.check_after_run()
        if key is not None:
            self._remember(key, q, out, views, struct, params, values)
        return (o, lse) if lse is not None else o

    def _remember(
        self,
        key: tuple[object, ...],
        q: torch.Tensor,
        out: torch.Tensor | None,
        views: KvViews,
        struct: ctypes.Structure,
        params: Mapping[str, object],
        values: Mapping[str, object],
    ) -> None:
        """Keep a checked call's launch fields under its ``key`` for later calls (none when
        ``remember_call`` declines it); a full cache is emptied first."""
        kv_range = _kv_range(views)
        hit = remember_call(self._args, q, out, views.num_pages, struct, params, values, kv_range)
        if hit is not None:
            if len(self._calls) >= MAX_CACHED_CALLS:
                self._calls.clear()
            self._calls[key] = self._applied = hit

    def _check_memory(
        self,
        q: torch.Tensor,
        views: KvViews,
        out: torch.Tensor | None,
        values: Mapping[str, object],
    ) -> torch.Tensor:
        """O: ``out`` checked (apart from q, the KV cache and the tensor params), or a new
        tensor; those and ``out`` apart from the workspace (``ValueError`` naming the tensor
        otherwise)."""
        kv = (("kv", views.k), ("kv", views.v))
        params = param_tensors(values)
        workspace = self._workspace_range
        out = check_run_memory(q, kv, out, params, workspace, DECODE_O_STRIDE_MULTIPLE)
        return torch.empty_like(q) if out is None else out

    def _run_cached(
        self,
        hit: CachedCall,
        q: torch.Tensor,
        out: torch.Tensor | None,
        return_lse: bool,
        begun: int,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """Launch with the fields of a cached call: only the q/o/lse pointers are new (None:
        at these addresses q or ``out`` may share memory or lie off a 16-byte boundary, which
        the checked call names). ``begun``: ``_plans_begun`` when ``run()`` started."""
        check_not_replanned(self, begun, "BatchDecodeWrapper")
        qp = q.data_ptr()
        op = None if out is None else out.data_ptr()
        if (qp | (op or 0)) % tensors.VECTOR_ALIGN_BYTES:
            return None  # not 16-byte aligned: the checked call names it
        if may_alias(hit, qp, op, self._workspace_range):
            return None
        a = self._args
        if self._applied is not hit:
            apply_call(a, hit)
            self._applied = hit
        if out is None:
            o = torch.empty_like(q)
            op = o.data_ptr()
        else:
            o = out
        a.q = qp
        a.o = op
        self._launched = True
        module = self._module
        assert module is not None
        if not return_lse:
            a.lse = None
            module.launch(self._args_ref, decode_launch.raw_stream(self._device))
            if self._debug_checks:
                self._page_status.check_after_run()
            return o
        lse = new_lse(q)
        a.lse = lse.data_ptr()
        module.launch(self._args_ref, decode_launch.raw_stream(self._device))
        if self._debug_checks:
            self._page_status.check_after_run()
        return o, lse

    def check(self) -> None:
        """Synchronise the device and raise the ``ValueError`` (naming ``kv_indices``, the
        request and the page id) of a page id a kernel found outside ``[0, num_pages)`` since
        the last check; the word is cleared. Such a page is never read; the rows of its
        request are NaN. ``plan()`` does the same after runs with device-resident page ids;
        with ``ATTNC_DEBUG_CHECKS=1`` every ``run()`` does."""
        self._page_status.raise_if_set()

    def _run_compiled(
        self,
        q: torch.Tensor,
        kv_cache: object,
        return_lse: bool,
        out: torch.Tensor | None,
        params: dict[str, object],
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``run()`` as ``torch.compile`` traces it: the same checks (none that reads a data
        pointer), then the ``attnc::decode`` custom op; the CUDA-graph check runs in the op."""
        shape = self._shape
        if shape is None:
            raise _not_planned()
        q = self._check_q(q, shape)
        views = self._paged_views(kv_cache, shape)
        values = self._resolve(params, shape, full=True)
        self._planned_mask.check_run(self.variant.name, values)
        decls = self.variant.params
        ints, floats, tensor_params = split_params(decls, values)
        o, lse = decode_op(
            self.handle, q, views.k, views.v, ints, floats, tensor_params, return_lse
        )
        return traced_result(o, lse, q, out, return_lse)

    def _launch_functional(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        values: Mapping[str, object],
        return_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The body of the ``attnc::decode`` op: new (O, LSE or empty) for checked inputs."""
        if not self.use_cuda_graph and torch.cuda.is_current_stream_capturing():
            raise _capture_refused()
        shape, module = self._shape, self._module
        assert shape is not None and module is not None
        heads = (shape.num_qo_heads, shape.num_kv_heads, shape.head_dim)
        self.variant.check_derived_values(values, shape.sm_scale, heads)
        o, lse = attention_outputs(q, return_lse)
        layout = abi.paged_kv_code(self.kv_layout)
        views = KvViews(k, v, layout, k.shape[0], shape.page_size)
        struct = self._packer.pack(module.params_type, values)
        self._applied = None
        fill_call_fields(self._args, q, views, o, lse if return_lse else None, struct)
        self._launched = True
        module.launch(self._args_ref, decode_launch.raw_stream(self._device))
        if self._debug_checks:
            self._page_status.check_after_run()
        return o, lse

    def _check_q(self, q: object, shape: DecodeShape) -> torch.Tensor:
        want = (self._batch * shape.q_len, shape.num_qo_heads, shape.head_dim)
        if not isinstance(q, torch.Tensor):
            raise ValueError(f"q: expected a torch.Tensor, got {type(q).__name__}")
        if q.dtype != shape.dtype:
            raise ValueError(f"q: dtype {q.dtype} differs from the planned dtype {shape.dtype}")
        if (
            not tensors.is_dense(q)
            or not memory.has_memory(q)
            or tensors.negated_view(q)
            or tuple(q.shape) != want
            or q.device != self._device
            or q.stride(-1) != 1
        ):
            tensors.check_data_tensor("q", q, want)
            if q.device != self._device:
                raise ValueError(f"q: on {q.device}, workspace_buffer on {self._device}")
        return q

    def _views(self, kv: object, shape: DecodeShape) -> KvViews:
        """The checked K/V views of ``kv``; the last cache's views are reused."""
        last = self._last_kv
        if last is not None and last[1] is kv and last[0] == kv_identity(kv):
            return last[2]
        views = self._paged_views(kv, shape)
        self._last_kv = (kv_identity(kv), kv, views)
        return views

    def _paged_views(self, kv: object, shape: DecodeShape) -> KvViews:
        views = paged_kv(
            kv, self.kv_layout, shape.page_size, shape.num_kv_heads, shape.head_dim, "cuda"
        )
        if views.k.dtype != shape.dtype:
            raise ValueError(
                f"kv: dtype {views.k.dtype} differs from the planned dtype {shape.dtype}"
            )
        if views.k.device != self._device:
            raise ValueError(f"kv: on {views.k.device}, workspace_buffer on {self._device}")
        tensors.check_pages_in_range(self._max_page, views.num_pages)
        return views

    def _resolve(
        self, params: Mapping[str, object], shape: DecodeShape, full: bool = False
    ) -> dict[str, object]:
        """The checked param values (``resolve_params``); ``{}`` when none are given and every
        param has a scalar default (the packer then uses its struct of the defaults), unless
        ``full``. The values the kernel derives from them are checked too
        (``Variant.check_derived_values``)."""
        heads = (shape.num_qo_heads, shape.num_kv_heads, shape.head_dim)
        if not full and not params and self._all_defaults:
            values: dict[str, object] = {}
        else:
            values = self.variant.resolve_for(params, heads, self._device, self._token_sizes)
        self.variant.check_derived_values(values, shape.sm_scale, heads)
        return values


def _kv_range(views: KvViews) -> tuple[int, int]:
    """The bytes ``[start, end)`` of the KV cache's K and V halves together."""
    k, v = tensors.byte_range(views.k), tensors.byte_range(views.v)
    return min(k[0], v[0]), max(k[1], v[1])


def _not_planned() -> RuntimeError:
    return RuntimeError("BatchDecodeWrapper.run() called before plan()")


def _capture_refused() -> RuntimeError:
    return RuntimeError(
        "BatchDecodeWrapper: capturing a CUDA graph needs a wrapper made with use_cuda_graph=True"
    )
