"""run() after plans that went wrong or tensors changed behind the wrappers' backs, on the CPU: a
refused prefill plan that had rebuilt the tile map (or one refused before it wrote it), a
planned tensor written between two cached decode calls, a tensor param restrided in place
between two remembered prefill calls, the transformers backend's falsy ``is_causal`` and
per-layer settings, a scalar the tile map was built for changed in run(), a tensor param inside
the workspace given to plan(), and index tensors with torch's negative bit (their bytes are not
their values). Each failed before its fix (a launch over the wrong map, bytes or mask, or a plan
of other ids)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime import abi
from attnc.runtime.build.backends import PrefillChoice
from attnc.runtime.planning.mask_ranges import PlannedMask
from attnc.runtime.wrappers import prefill
from attnc.runtime.wrappers.decode_plan_inputs import FastPathKey
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.tile_map_oracle import doc_causal_map
from tests.unit import test_decode_fast_path as DF
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _wrapper, cpu_run  # noqa: F401

I32 = dict(dtype=torch.int32)
DOC = """variant doc_causal {
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}"""


def _planned_documents(monkeypatch) -> BatchPrefillWrapper:
    """A CPU wrapper of the document mask, planned for one 1024-token request of four
    documents with its tile map (16 KiB kept for it), over a stand-in module."""
    v = attnc.load(source=DOC)
    module = type("StandIn", (), {"module_id": "m", "ir": v.ir, "params_type": abi.params_struct(v.params)})()  # fmt: skip
    monkeypatch.setattr(
        prefill, "choose_prefill_module", lambda *a, **k: PrefillChoice("fa2", module, 64)
    )
    w = BatchPrefillWrapper(v, torch.empty(64 << 10, dtype=torch.uint8), backend="fa2", max_tile_map_bytes=16 << 10)  # fmt: skip
    w._map_builder = lambda vals, ql, kl, tile, block: doc_causal_map(vals["doc"].numpy(), ql, kl, tile, block)  # fmt: skip
    qo = torch.tensor([0, 1024], **I32)
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": torch.arange(4, **I32).repeat_interleave(256)})
    return w


def test_a_plan_refused_after_rebuilding_the_tile_map_leaves_no_plan(monkeypatch) -> None:
    """The refused plan's map overwrote the planned one's in the workspace, and run() went on
    with the old work lists over the new map (FULL blocks unmasked across documents)."""
    w = _planned_documents(monkeypatch)
    assert w.planned_backend == "fa2"
    many = torch.arange(3001, **I32)
    with pytest.raises(ValueError, match="workspace_buffer"):
        w.plan(many, many.clone(), 4, 2, 64, params={"doc": torch.zeros(3000, **I32)})
    assert w.planned_backend is None and w.tile_map is None
    with pytest.raises(RuntimeError, match="the last plan\\(\\) was refused after it had rebuilt"):
        w.run(torch.zeros(1024, 4, 64, dtype=torch.bfloat16), (torch.zeros(1024, 2, 64),) * 2)


def test_a_plan_whose_map_does_not_fit_keeps_the_plan_in_force(monkeypatch) -> None:
    """The map's size is refused before anything is written to the map region, yet the
    wrapper dropped the plan in force and run() blamed a map rebuild that never happened."""
    w = _planned_documents(monkeypatch)
    planned = (w._plan, w._meta, w._map_host[0].copy(), w._workspace.clone())
    long = torch.tensor([0, 16384], **I32)  # 256 query tiles x 128 key blocks: 32 KiB of map
    with pytest.raises(ValueError, match="max_tile_map_bytes"):
        w.plan(long, long.clone(), 4, 2, 64, params={"doc": torch.zeros(16384, **I32)})
    assert w.planned_backend == "fa2" and w._plan is planned[0] and w._meta == planned[1]
    assert np.array_equal(w._map_host[0], planned[2]) and torch.equal(w._workspace, planned[3])
    assert w.tile_map is not None


def test_a_cached_decode_call_refuses_a_planned_tensor_written_since(cpu_decode) -> None:  # noqa: F811
    """The call cache keyed the window tensor by object and address: a write between two
    cached calls launched the new windows over work lists cut for the old."""
    w = cpu_decode("per_request_window")
    w._reads_kv_tokens, w._native, w._token_sizes_of = False, SimpleNamespace(total_kv=12), None
    w._set_token_sizes(1)  # what plan() sets for run(): the batch's sizes
    window = torch.tensor([4, 2, 8], **I32)
    w._planned_mask = PlannedMask.from_values(w.variant, {}, {"window": window})
    q, cache = _inputs()
    w.run(q, cache, window=window)
    w.run(q, cache, window=window)  # from the call cache
    window[0] = 1
    with pytest.raises(ValueError, match="param 'window': run\\(\\) was given the planned tensor"):
        w.run(q, cache, window=window)


def test_a_tensor_param_restrided_in_place_is_checked_again(cpu_run) -> None:  # noqa: F811
    """``as_strided_`` keeps the object and its pointer: the memo replayed the old bytes."""
    w, rec = _wrapper("alibi")
    indptr = torch.tensor([0, 5, 14], **I32)
    w.plan(indptr, indptr, HQ, HKV, D)
    q = torch.randn(14, HQ, D).bfloat16()
    k = torch.randn(14, HKV, D).bfloat16()
    slopes = torch.arange(2 * HQ, dtype=torch.float32)[:HQ]
    w.run(q, (k, k), slopes=slopes)
    slopes.as_strided_((HQ,), (2,))  # now 0, 2, 4, 6
    w.run(q, (k, k), slopes=slopes)
    packed = np.frombuffer(rec.calls[-1]["params_bytes"], dtype=np.uint64)[0]
    first = np.frombuffer(rec.calls[0]["params_bytes"], dtype=np.uint64)[0]
    assert packed != first  # a contiguous copy of the new values, not the old pointer


def _hf():
    pytest.importorskip("transformers")
    from attnc.integrations.transformers import UnsupportedMaskError, attnc_attention_forward

    return attnc_attention_forward, UnsupportedMaskError


@pytest.mark.parametrize("flag", [0, np.False_, torch.tensor(False)])
def test_any_false_is_causal_is_refused(flag) -> None:
    """Only ``is False`` was refused: 0 or a tensor's False ran causal attention."""
    forward, unsupported = _hf()
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(unsupported, match="is_causal=False"):
        forward(torch.nn.Module(), q, q, q, None, is_causal=flag)


def test_a_layers_settings_are_keyed_with_their_types() -> None:
    """``True == 1``: a layer that ran with window 1 took ``sliding_window=True`` unchecked."""
    forward, unsupported = _hf()
    q = torch.randn(1, 2, 4, 16)
    layer = torch.nn.Module()
    forward(layer, q, q, q, None, sliding_window=1)
    with pytest.raises(unsupported, match="sliding_window must be a whole number of keys"):
        forward(layer, q, q, q, None, sliding_window=True)


def _slopes_over(out: torch.Tensor) -> torch.Tensor:
    """[HQ] float32 slopes laid over the first bytes of ``out``."""
    return out.view(-1)[: 2 * HQ].view(torch.float32)


@pytest.mark.parametrize("repeated", [False, True])
def test_prefill_out_overlapping_a_tensor_param_is_refused(cpu_run, repeated) -> None:  # noqa: F811
    """The kernels read the slopes while writing O: an ``out`` over them was launched."""
    w, rec = _wrapper("alibi")
    indptr = torch.tensor([0, 5, 14], **I32)
    w.plan(indptr, indptr, HQ, HKV, D)
    q, k = torch.randn(14, HQ, D).bfloat16(), torch.randn(14, HKV, D).bfloat16()
    out = torch.empty_like(q)
    slopes = _slopes_over(out)
    w.run(q, (k, k), slopes=slopes, out=torch.empty_like(q))  # the first call: remembered
    if not repeated:
        w._memo.clear()
    with pytest.raises(ValueError, match="^out: overlaps param 'slopes' in memory"):
        w.run(q, (k, k), slopes=slopes, out=out)
    assert len(rec.calls) == 1


def test_prefill_a_tensor_param_in_the_workspace_is_refused(cpu_run) -> None:  # noqa: F811
    w, rec = _wrapper("alibi")
    indptr = torch.tensor([0, 5, 14], **I32)
    w.plan(indptr, indptr, HQ, HKV, D)
    q, k = torch.randn(14, HQ, D).bfloat16(), torch.randn(14, HKV, D).bfloat16()
    inside = w._workspace[: 4 * HQ].view(torch.float32)  # the work lists' bytes
    with pytest.raises(ValueError, match="^param 'slopes': overlaps workspace_buffer"):
        w.run(q, (k, k), slopes=inside)
    assert not rec.calls


@pytest.mark.parametrize("repeated", [False, True])
def test_decode_out_overlapping_a_tensor_param_is_refused(cpu_decode, repeated) -> None:  # noqa: F811
    w = cpu_decode("alibi")
    q, cache = _inputs()
    out = torch.empty_like(q)
    slopes = out.view(-1)[: 2 * q.shape[1]].view(torch.float32)
    w.run(q, cache, slopes=slopes, out=torch.empty_like(q))
    if not repeated:
        w._calls.clear()
    with pytest.raises(ValueError, match="^out: overlaps param 'slopes' in memory"):
        w.run(q, cache, slopes=slopes, out=out)
    assert len(w._module.calls) == 1


DOC_OR_ALL = """variant doc_or_all {
    param doc: tensor<i32>[kv_len];
    param flag: bool = false;
    mask = kv_idx <= q_pos && (flag || doc[kv_idx] == doc[q_pos]);
}"""


def _map_wrapper(monkeypatch, source: str, workspace_bytes: int = 64 << 10):
    """A CPU wrapper of ``source`` whose tile map is built on the host (documents' map)."""
    v = attnc.load(source=source)
    module = type("StandIn", (), {"module_id": "m", "ir": v.ir, "params_type": abi.params_struct(v.params)})()  # fmt: skip
    monkeypatch.setattr(
        prefill, "choose_prefill_module", lambda *a, **k: PrefillChoice("fa2", module, 64)
    )
    w = BatchPrefillWrapper(v, torch.empty(workspace_bytes, dtype=torch.uint8), backend="fa2")
    w._map_builder = lambda vals, ql, kl, tile, block: doc_causal_map(vals["doc"].numpy(), ql, kl, tile, block)  # fmt: skip
    return w


@pytest.mark.parametrize("given", [True, False])  # flag given to plan(), or its default
def test_a_scalar_the_tile_map_was_built_for_is_checked_in_run(monkeypatch, given) -> None:
    """The map's EMPTY blocks hold for the planned flag only: run(flag=True) was accepted over
    a map built with flag false (the second document's queries would skip the first's keys)."""
    w = _map_wrapper(monkeypatch, DOC_OR_ALL)
    doc = torch.arange(2, **I32).repeat_interleave(128)
    qo = torch.tensor([0, 256], **I32)
    w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc, **({"flag": False} if given else {})})
    w._check_planned_values({"doc": doc, "flag": False})
    with pytest.raises(ValueError, match="param 'flag' is True in run\\(\\), but plan\\(\\) was"):
        w._check_planned_values({"doc": doc, "flag": True})


def test_plan_refuses_a_tensor_param_in_the_workspace(monkeypatch) -> None:
    """plan() built the map from a tensor inside the workspace after writing its work lists
    over it (run() refused the tensor only afterwards)."""
    w = _map_wrapper(monkeypatch, DOC)
    doc = w._workspace[:1024].view(torch.int32)
    doc.copy_(torch.arange(2, **I32).repeat_interleave(128))
    before = doc.clone()
    qo = torch.tensor([0, 256], **I32)
    with pytest.raises(ValueError, match="^param 'doc': overlaps workspace_buffer"):
        w.plan(qo, qo.clone(), 4, 2, 64, params={"doc": doc})
    assert torch.equal(doc, before)


def test_index_tensors_with_the_negative_bit_are_read_as_their_values(monkeypatch) -> None:
    """A ``_neg_view`` holds -x in memory for the value x: the planner read the bytes (a batch
    the checks passed was refused, and [0, -4], which they refuse, was planned as [0, 4])."""
    w = _map_wrapper(monkeypatch, DOC)
    doc = torch.zeros(4, **I32)
    qo = torch.tensor([0, -4], **I32)._neg_view()  # the values 0, 4
    w.plan(qo, qo, 4, 2, 64, params={"doc": doc})
    assert w.planned_backend == "fa2"
    bad = torch.tensor([0, 4], **I32)._neg_view()  # the values 0, -4
    with pytest.raises(ValueError, match="qo_indptr"):
        w.plan(bad, torch.tensor([0, 4], **I32), 4, 2, 64, params={"doc": doc})


def test_host_index_copies_hold_the_values_of_negative_bit_views() -> None:
    """The decode planner reads the host copies' bytes: a ``_neg_view`` kept its negated
    memory through ``contiguous()``."""
    from attnc.runtime.checks import tensors

    view = torch.tensor([0, -3, -7], **I32)._neg_view()  # the values 0, 3, 7
    for host in (tensors.host_int32("kv_indptr", view), tensors.check_index_tensor("x", view)):
        assert not host.is_neg()
        assert np.frombuffer(host.numpy().tobytes(), dtype=np.int32).tolist() == [0, 3, 7]


def test_plan_on_a_host_without_a_gpu_names_the_cpu_workspace(monkeypatch) -> None:
    """A CPU workspace on a host without CUDA: plan() said 'pass arch= explicitly', an
    argument it does not take; it names the workspace."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    wrapper = BatchPrefillWrapper(
        attnc.load("stdlib:causal"), torch.empty(1 << 20, dtype=torch.uint8)
    )
    indptr = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="workspace_buffer: on the cpu and this host has no CUDA"):
        wrapper.plan(indptr, indptr, num_qo_heads=4, num_kv_heads=4, head_dim=128)


def _zero(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """torch's zero tensor: sizes and strides, and a null data pointer."""
    return torch._efficientzerotensor(shape, dtype=dtype)


def test_a_zero_tensor_index_is_refused_by_plan() -> None:
    """The host planner read through its null pointer: the process died (SIGSEGV)."""
    w = BatchPrefillWrapper(attnc.load("stdlib:causal"), torch.empty(1 << 20, dtype=torch.uint8))
    z = _zero(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="^qo_indptr: expected a dense tensor, got a zero-tensor"):
        w.plan(z, z, 4, 2, 64)


def test_zero_tensors_are_refused_by_prefill_run(cpu_run) -> None:  # noqa: F811
    """q, k and a tensor param with no memory were launched as null pointers."""
    w, rec = _wrapper("alibi")
    indptr = torch.tensor([0, 5, 14], **I32)
    w.plan(indptr, indptr, HQ, HKV, D)
    q, k = torch.randn(14, HQ, D).bfloat16(), torch.randn(14, HKV, D).bfloat16()
    slopes = torch.ones(HQ)
    with pytest.raises(ValueError, match="^q: expected a dense tensor, got a zero-tensor"):
        w.run(_zero(14, HQ, D), (k, k), slopes=slopes)
    with pytest.raises(ValueError, match="^k: expected a dense tensor, got a zero-tensor"):
        w.run(q, (_zero(14, HKV, D), k), slopes=slopes)
    with pytest.raises(ValueError, match="'slopes'.*expected a dense tensor, got a zero-tensor"):
        w.run(q, (k, k), slopes=_zero(HQ, dtype=torch.float32))
    assert not rec.calls


def test_a_zero_tensor_decode_query_is_refused(cpu_decode) -> None:  # noqa: F811
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    with pytest.raises(ValueError, match="^q: expected a dense tensor, got a zero-tensor"):
        w.run(_zero(*q.shape), cache)


@pytest.mark.parametrize(
    "view",
    [lambda: torch.zeros(1 << 18, dtype=torch.complex64).conj(),
     lambda: torch._neg_view(torch.zeros(1 << 20, dtype=torch.float32))],
    ids=["conj", "neg"],
)  # fmt: skip
def test_a_workspace_with_a_conjugate_or_negative_bit_is_refused_by_name(view) -> None:
    """A conjugate view raised torch's own "view is not supported for conjugate view
    tensors", naming no argument."""
    with pytest.raises(ValueError, match="^workspace_buffer: a view with torch's conjugate"):
        BatchPrefillWrapper(attnc.load("stdlib:causal"), view())


def test_a_zero_tensor_workspace_is_refused() -> None:
    with pytest.raises(ValueError, match="^workspace_buffer: expected a contiguous torch.Tensor"):
        BatchPrefillWrapper(attnc.load("stdlib:causal"), _zero(1 << 20, dtype=torch.uint8))


def test_a_decode_cache_given_another_dtype_in_place_is_checked_again(cpu_decode) -> None:  # noqa: F811
    """The same cache object with the same address and shape but another dtype (``.data =``)
    reused the views checked for the old dtype, and the kernel read the cache as bf16."""
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    w.run(q, cache)
    cache.data = cache.data.view(torch.float16)
    with pytest.raises(ValueError, match="^kv: dtype torch.float16 differs from the planned"):
        w.run(q, cache)


def test_a_decode_cache_restrided_in_place_is_checked_again(cpu_decode) -> None:  # noqa: F811
    """``as_strided_`` keeps the object, address and shape: the old strides were launched."""
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    w.run(q, cache)
    before = w._module.calls[-1]
    page, heads, dim = DF.PAGE, DF.HKV, DF.DIM
    strides = list(cache.stride())
    strides[2], strides[3] = dim, page * dim  # HND pages in the NHD shape, same bytes
    cache.as_strided_(cache.shape, strides)
    w.run(q, cache)
    after = w._module.calls[-1]
    assert (before["kv_stride_tok"], before["kv_stride_head"]) == (heads * dim, dim)
    assert (after["kv_stride_tok"], after["kv_stride_head"]) == (dim, page * dim)


def test_a_decode_list_given_a_negated_view_in_place_is_checked_again(cpu_decode) -> None:  # noqa: F811
    """The same list object, one element replaced by ``torch._neg_view`` of the same bytes
    (same address, shape and strides): the views checked for the old element were reused
    and the kernel read the un-negated bytes; a fresh list was refused."""
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    kv = [cache[:, 0], cache[:, 1]]
    w.run(q, kv)
    kv[0] = torch._neg_view(kv[0])
    with pytest.raises(ValueError, match="negative bit"):
        w.run(q, kv)


@pytest.mark.parametrize(
    ("q_len", "indptr", "message"),
    [
        (None, [0, 4, 8, 12], "^q_len_per_request: expected an int"),
        (1, [], "^kv_indptr: needs at least one entry"),
    ],
)
def test_decode_plan_with_tensor_params_checks_its_sizes_first(
    cpu_decode,  # noqa: F811
    q_len,
    indptr,
    message,
) -> None:
    """With a per-request tensor param, plan() sized it from q_len_per_request and kv_indptr
    unchecked: a TypeError from int(None), or the tensor blamed for an empty kv_indptr."""
    w = cpu_decode("per_request_window")
    w._mask_key = None
    window = torch.tensor([4, 2, 8], **I32)
    sizes = (torch.tensor(indptr, **I32), DF.HQ, DF.HKV, 64, q_len)
    with pytest.raises(ValueError, match=message):
        w._mask_ranges({"window": window}, sizes)


def _np_cases():
    return [
        ("kv_layout", "^kv_layout: must be 'NHD' or 'HND', got ndarray"),
        ("dtype", "^dtype: must be torch.bfloat16 or torch.float16, got ndarray"),
        ("num_qo_heads", "^num_qo_heads: expected an int, got ndarray"),
    ]


@pytest.mark.parametrize(("name", "message"), _np_cases())
def test_numpy_arrays_for_prefill_scalars_are_named(cpu_run, name, message) -> None:  # noqa: F811
    """A numpy array where a layout, dtype or head count belongs gave numpy's "The truth
    value of an array ... is ambiguous" (from ``in`` or a tuple comparison), naming nothing;
    the head counts so only after a first plan (the comparison with the checked heads)."""
    arr = np.array([4, 4]) if name != "kv_layout" else np.array(["NHD", "HND"])
    variant, ws = attnc.load("stdlib:causal"), torch.empty(1 << 22, dtype=torch.uint8)
    indptr = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        if name == "kv_layout":
            BatchPrefillWrapper(variant, ws, kv_layout=arr)
        else:
            w = BatchPrefillWrapper(variant, ws)
            w._module_choice = lambda *a: PrefillChoice("fa2", None, 16)  # type: ignore[method-assign]
            w.plan(indptr, indptr, 4, 2, 64)
            kw = {"num_qo_heads": 4, "num_kv_heads": 2, "head_dim": 64, name: arr}
            w.plan(indptr, indptr, **kw)


@pytest.mark.parametrize(
    ("name", "message"),
    [("sm_scale", "^sm_scale: expected a float, got ndarray"),
     ("num_qo_heads", "^num_qo_heads: expected an int, got ndarray")],
)  # fmt: skip
def test_numpy_arrays_for_decode_scalars_on_the_fast_path_are_named(
    cpu_decode,  # noqa: F811
    name,
    message,
) -> None:
    """The decode fast path compared its scalars with the last plan's as one tuple before
    their types: an array gave numpy's ambiguous-truth error."""
    w = cpu_decode("causal")
    w._fast = FastPathKey((DF.HQ, DF.HKV, 64, DF.PAGE, 1, None, torch.bfloat16), 1, None)
    w._page_status = SimpleNamespace(pending=False)
    kw = {"num_qo_heads": DF.HQ, "num_kv_heads": DF.HKV, "head_dim": 64}
    kw.update(page_size=DF.PAGE, **{name: np.array([4.0, 4.0])})
    indptr = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        w.plan(indptr, torch.arange(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32), **kw)


def test_a_layout_given_as_a_str_subclass_is_the_plain_string() -> None:
    """A type check refusing numpy arrays refused str subclasses too (a ``StrEnum``
    member, ``np.str_``), which worked before; a ``(str, Enum)`` member's str() is its
    class-qualified name, so the wrapper keeps the plain string."""
    import enum

    class Layout(str, enum.Enum):
        HND = "HND"

    variant, ws = attnc.load("stdlib:causal"), torch.empty(1 << 22, dtype=torch.uint8)
    for given in (Layout.HND, np.str_("HND")):
        w = BatchPrefillWrapper(variant, ws, kv_layout=given)
        assert type(w.kv_layout) is str and w.kv_layout == "HND"
