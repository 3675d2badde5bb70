"""``torch.compile(fullgraph=True)`` traces ``Variant.prefill``, ``BatchPrefillWrapper.run``
and ``BatchDecodeWrapper.run`` without a graph break: each becomes one attnc custom op.

On the CPU: the launchers are stood in by recorders, the device checks accept CPU tensors,
and ``torch.cuda.is_current_stream_capturing`` breaks the graph if it is called while
tracing (the real one returns a non-tensor Dynamo cannot trace).
"""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch
from prefill_plan_helpers import PlanShape, make_host_plan

import attnc
from attnc.runtime import abi
from attnc.runtime.abi import AttncDecodeArgs
from attnc.runtime.checks import kv as kv_checks
from attnc.runtime.checks import tensors
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK
from attnc.runtime.wrappers import decode as D
from attnc.runtime.wrappers import decode_launch, prefill_launch, single_prefill
from attnc.runtime.wrappers.decode_op import register_wrapper
from attnc.runtime.wrappers.decode_planning import DecodeShape
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

HQ, HKV, DIM, PAGE, BATCH = 4, 2, 64, 4, 3


def _capturing() -> bool:
    torch._dynamo.graph_break()  # a no-op when not tracing
    return False


@pytest.fixture
def on_cpu(monkeypatch):
    real = tensors.check_data_tensor
    monkeypatch.setattr(
        tensors,
        "check_data_tensor",
        lambda name, t, shape, device_type="cuda": real(name, t, shape, "cpu"),
    )
    monkeypatch.setattr(kv_checks, "check_data_tensor", tensors.check_data_tensor)
    monkeypatch.setattr(decode_launch, "raw_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", _capturing)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _no_breaks(fn, *args):
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")(*args)


def test_variant_prefill_is_one_op(on_cpu, monkeypatch):
    seen, backends = [], []
    monkeypatch.setenv("ATTNC_PREFILL_BACKEND", "fa2")  # the op took "auto" before

    def run_one(variant, q, k, v, sm_scale, return_lse, values, backend="auto"):
        seen.append((variant.name, sm_scale, dict(values)))
        backends.append(backend)
        o = torch.full_like(q, 2.0)
        return (o, torch.zeros(q.shape[:2])) if return_lse else o

    monkeypatch.setattr(single_prefill, "run_one", run_one)
    variant = attnc.load("stdlib:softcap")
    q, k = torch.randn(5, HQ, DIM).bfloat16(), torch.randn(7, HKV, DIM).bfloat16()
    o, lse = _no_breaks(
        lambda q, k: variant.prefill(q, k, k, sm_scale=0.5, return_lse=True, cap=20.0), q, k
    )
    assert torch.equal(o, torch.full_like(q, 2.0)) and lse.shape == (5, HQ)
    assert seen[-1] == ("softcap", 0.5, {"cap": 20.0})
    alibi = attnc.load("stdlib:alibi")
    slopes = torch.rand(HQ)
    _no_breaks(lambda q, k, s: alibi.prefill(q, k, k, slopes=s), q, k, slopes)
    assert torch.equal(seen[-1][2]["slopes"], slopes)
    assert backends and set(backends) == {"fa2"}
    # A scale that changes between calls is made symbolic by dynamo: math.isfinite in the
    # trace-time check broke the fullgraph trace; its value is checked in the op's body.
    scaled = torch.compile(
        lambda q, k, s: variant.prefill(q, k, k, sm_scale=s), fullgraph=True, backend="aot_eager"
    )
    for scale in (0.5, 0.25, 0.125):
        scaled(q, k, scale)
        assert seen[-1][1] == scale


class _Recorder:
    """Stands in for a decode module: keeps the params bytes of every launch."""

    name = "recorder"

    def __init__(self, variant):
        self.params_type = abi.params_struct(variant.ir.params)
        self.params: list[bytes] = []

    def launch(self, args_ref, stream):
        a = args_ref._obj
        self.params.append(ctypes.string_at(a.variant_params, a.variant_params_size))


def _decode_wrapper(variant):
    w = object.__new__(D.BatchDecodeWrapper)
    w.variant, w.kv_layout, w.use_cuda_graph = variant, "NHD", False
    w._device = torch.device("cpu")
    w._shape = DecodeShape(HQ, HKV, DIM, PAGE, 1, torch.bfloat16, 0.25, 4, 8)
    w._module = _Recorder(variant)
    w._args = AttncDecodeArgs()
    w._args_ref = ctypes.byref(w._args)
    w._args.variant_params_size = ctypes.sizeof(w._module.params_type)
    w._max_page, w._batch, w._q_rows = 5, BATCH, BATCH
    w._last_kv, w._calls, w._applied = None, {}, None
    w._packer = decode_launch.ParamsPacker(variant.params)
    w._all_defaults = all(d.kind != "tensor" and d.default is not None for d in variant.params)
    w._planned_mask = NO_PLANNED_MASK
    w.handle = register_wrapper(w)
    w._debug_checks, w._page_status = False, None  # no device page check here
    return w


def test_decode_run_is_one_op(on_cpu):
    variant = attnc.load("stdlib:softcap")
    w = _decode_wrapper(variant)
    q, cache = torch.randn(BATCH, HQ, DIM).bfloat16(), torch.randn(8, 2, PAGE, HKV, DIM).bfloat16()
    out = torch.empty_like(q)
    o, lse = _no_breaks(
        lambda q, c, out: w.run(q, c, return_lse=True, out=out, cap=7.0), q, cache, out
    )
    assert o is out and lse.shape == (BATCH, HQ)
    expect = bytes(abi.fill_params(w._module.params_type, variant.params, {"cap": 7.0}))
    assert w._module.params and set(w._module.params) == {expect}


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (host prefill planner)")
def test_prefill_run_is_one_op(on_cpu, monkeypatch):
    variant = attnc.load("stdlib:sliding_window")
    i32 = dict(dtype=torch.int32)
    qo = torch.tensor([0, 3, 8], **i32).long()
    kv = torch.tensor([0, 10, 30], **i32).long()
    shape = PlanShape(HQ, HKV, DIM, tile_q_tokens=16, num_ctas=4, workspace_bytes=1 << 20)
    host = make_host_plan(qo, kv, None, None, 1, shape)
    w = BatchPrefillWrapper(variant, torch.empty(1 << 20, dtype=torch.uint8))
    w._plan, w._heads, w._dtype, w._sm_scale = host, (HQ, HKV, DIM), torch.bfloat16, 0.125
    w._total_q, w._total_kv, w._max_page = 8, 30, -1
    w._paged, w._page_size = False, 1
    w._module = type(
        "M",
        (),
        {"module_id": "m", "ir": variant.ir, "params_type": abi.params_struct(variant.params)},
    )()
    w._meta = [0] * len(prefill_launch.META_FIELDS)
    seen = []
    monkeypatch.setattr(prefill_launch, "module_by_id", lambda module_id: w._module)
    monkeypatch.setattr(
        prefill_launch,
        "launch",
        lambda module, meta, tensors, sc, params: seen.append(bytes(params)),
    )
    q, k = torch.randn(8, HQ, DIM).bfloat16(), torch.randn(30, HKV, DIM).bfloat16()
    o = _no_breaks(lambda q, k: w.run(q, (k, k), window=5), q, k)
    expect = abi.fill_params(w._module.params_type, variant.params, {"window": 5})
    assert o.shape == q.shape and seen[-1] == bytes(expect)


def test_module_by_id_finds_hopper_modules(monkeypatch):
    """The compiled path looks a module up by id in both prefill registries (FA2 and Hopper)."""
    from attnc.runtime.build import modules

    fake = object()
    monkeypatch.setitem(modules.PREFILL_SM90_MODULES._by_id, "/x/causal_sm90.so", fake)
    assert modules.module_by_id("/x/causal_sm90.so") is fake
    with pytest.raises(KeyError, match="no prefill module"):
        modules.module_by_id("/x/missing.so")
