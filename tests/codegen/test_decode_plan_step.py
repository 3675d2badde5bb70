"""BatchDecodeWrapper.plan() (checks, plan and copies in C++) against the oracle
(decode_schedule_oracle.py), on the CPU: the step's CUDA calls are switched to host memcpys,
so the "workspace" is a CPU tensor and its bytes can be compared with what the oracle
writes."""

from __future__ import annotations

import ctypes

import decode_plan_harness as h
import decode_schedule_oracle as oracle
import numpy as np
import pytest
import torch
from mask_ranges_oracle import decode_spans, tile_kv_ranges

import attnc
from attnc.runtime import abi
from attnc.runtime.abi import FLAG_MERGE, AttncDecodeArgs
from attnc.runtime.checks.page_status import PageStatus
from attnc.runtime.planning import decode_plan_library
from attnc.runtime.planning.mask_ranges import NO_PLANNED_MASK, PlannedMask
from attnc.runtime.planning.workspace import CapacityError, make_layout
from attnc.runtime.wrappers import decode as D
from attnc.runtime.wrappers import decode_launch, decode_planning

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

HQ, HKV, DIM, PAGE = 32, 8, 128, 16


class _FakeEvent:
    def record(self, stream):
        pass

    def synchronize(self):
        pass


class _FakeModule:
    def __init__(self, variant):
        self.params_type = abi.params_struct(variant.ir.params)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    mp.setattr(decode_plan_library.ONCE, "lib", None)
    mp.setattr(decode_plan_library.ONCE, "failure", None)
    lib = decode_plan_library.library()
    decode_plan_library.fake_cuda(1)
    yield lib
    decode_plan_library.fake_cuda(0)
    mp.undo()


@pytest.fixture
def cpu(monkeypatch, lib):
    monkeypatch.setattr(decode_planning, "_GET_RAW_STREAM", lambda index: 0)
    monkeypatch.setattr(
        decode_planning, "_pinned_empty", lambda n: torch.zeros(n, dtype=torch.uint8)
    )
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    return lib


def make_wrapper(max_batch=64, ws_bytes=64 << 20, graph=False, max_pages=None, name="vanilla"):
    """BatchDecodeWrapper.__init__ on the CPU (host memory for the workspace and the pinned
    buffer), with modules for every (heads, q_len) the tests use."""
    variant = attnc.load(f"stdlib:{name}")
    w = object.__new__(D.BatchDecodeWrapper)
    w.variant, w.kv_layout, w.use_cuda_graph = variant, "NHD", graph
    w._ws = torch.full((ws_bytes,), 0xCD, dtype=torch.uint8)
    w._device = torch.device("cuda:0")
    w._num_sms = 132
    w.layout = make_layout(ws_bytes, max_batch, max(16384, 64 * max_batch), 8 * 132, max_pages)
    w._pinned = torch.zeros(w.layout.work_bytes(w.layout.max_items), dtype=torch.uint8)
    w._pinned_np = w._pinned.numpy()
    w._native = None
    w._device_index = 0
    w._fast = None
    module = _FakeModule(variant)
    w._modules = {
        (torch.bfloat16, DIM, q * hq // hkv): (module, 16, 64, 2)
        for q in range(1, 9)
        for hq, hkv in ((HQ, HKV), (HQ, HQ))
    }
    w._shape = w._module = None
    w._args = AttncDecodeArgs()
    w._args_ref = ctypes.byref(w._args)
    w._max_page, w._batch, w._q_rows = -1, 0, 0
    w._last_kv = w._applied = None
    w._packer = decode_launch.ParamsPacker(variant.params)
    w._all_defaults = all(d.kind != "tensor" and d.default is not None for d in variant.params)
    w._calls = {}
    w._planned_mask = NO_PLANNED_MASK
    w._page_status = PageStatus(torch.device("cpu"))  # the device page-id check's word
    w.last_schedule = None
    w.handle = 0
    return w


def page_table(rng, batch, page_size=PAGE, max_len=5000):
    lens = rng.integers(0, max_len, batch)
    pages = -(-lens // page_size)
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.where(lens > 0, (lens - 1) % page_size + 1, rng.integers(-3, 30, batch))
    ids = rng.permutation(int(indptr[-1]) + 5).astype(np.int32)
    return torch.from_numpy(indptr), torch.from_numpy(ids), torch.from_numpy(last.astype(np.int32))


def _plan(w, indptr, ids, last, **kw):
    kw.setdefault("page_size", PAGE)
    hq, hkv = kw.pop("heads", (HQ, HKV))
    w.plan(indptr, ids, last, hq, hkv, DIM, kw.pop("page_size"), dtype=torch.bfloat16, **kw)


def _outcome(w, *args, **kw):
    try:
        _plan(w, *args, **kw)
    except Exception as exc:  # noqa: BLE001
        return (type(exc), str(exc))
    n = w.layout.work_bytes(w.last_schedule.num_items)
    nnz = int(args[0][-1])
    lay = w.layout
    ws = w._ws.numpy()
    return (
        ws[:n].tobytes(),
        ws[lay.page_ids : lay.page_ids + 4 * nnz].tobytes(),
        w._batch,
        w._q_rows,
        w._max_page,
        w._args.flags,
        w.last_schedule.merge_rows,
    )


def _expected(w, ref_buf, indptr, ids, last, **kw):
    """What the oracle says ``_outcome`` gives: its checks, then its schedule written into
    ``ref_buf`` (the wrapper's pinned buffer as the oracle keeps it, stale bytes included)."""
    page_size = kw.get("page_size", PAGE)
    hq, hkv = kw.get("heads", (HQ, HKV))
    q_len = kw.get("q_len_per_request", 1)
    try:
        kv, max_page = oracle.check_page_table(
            indptr.numpy(), last.numpy(), page_size, w.layout, ids.numpy(), False
        )
        spans = None
        if kw.get("params"):
            planned = PlannedMask.from_plan_params(w.variant, kw["params"])  # plan()'s checks
            ranges = tile_kv_ranges(w.variant.compiled.mask_analysis, planned.values)
            spans = None if ranges is None else decode_spans(ranges, kv, q_len, 64)
        row_blocks = -(-q_len * (hq // hkv) // 16)
        sched = oracle.schedule(
            kv, q_len, hq, hkv, row_blocks, 264, 64, w.layout.max_part_rows(DIM),
            max_items=w.layout.max_items, spans=spans,
        )  # fmt: skip
    except ValueError as exc:
        return (type(exc), str(exc))
    n = oracle.write_work_region(ref_buf, w.layout, sched, q_len, indptr.numpy()[:-1], kv)
    nnz = int(indptr[-1])
    flags = FLAG_MERGE if w.use_cuda_graph or sched.merge_rows > 0 else 0
    batch = kv.shape[0]
    return (ref_buf[:n].tobytes(), ids.numpy()[:nnz].tobytes(), batch, batch * q_len, max_page,
            flags, sched.merge_rows)  # fmt: skip


def _pair(**kw):
    """A wrapper and the oracle's copy of its pinned buffer."""
    w = make_wrapper(**kw)
    return w, np.zeros_like(w._pinned_np)


def test_plan_matches_the_oracle(cpu):
    rng = np.random.default_rng(5)
    w, ref_buf = _pair()
    before = decode_plan_library.fake_cuda(-1)
    fast = 0
    for trial in range(300):
        batch = int(rng.integers(0, 65))
        args = page_table(rng, batch, max_len=int(rng.choice([40, 3000, 70000])))
        q_len = int(rng.integers(1, 3)) if trial % 50 == 0 else 1
        kw = {"q_len_per_request": q_len, "heads": (HQ, HQ) if trial % 70 == 0 else (HQ, HKV)}
        fast += w._fast is not None
        got, want = _outcome(w, *args, **kw), _expected(w, ref_buf, *args, **kw)
        assert got == want, trial
    assert fast > 250
    now = decode_plan_library.fake_cuda(-1)
    copies, records, waits, _ = (a - b for a, b in zip(now, before, strict=True))
    assert records == 300 and waits == 299 and 300 <= copies <= 600


@pytest.mark.parametrize("name", ["sliding_window", "prefix_lm"])
def test_plans_with_mask_params_match_the_oracle(cpu, monkeypatch, name):
    """plan(params=...) of a sliding window or a prefix-LM (a union): the C++ step computes
    the mask's spans from the span table and writes what the oracle writes (spans from
    mask_ranges_oracle.decode_spans); repeated values take the fast path, and plans without params
    return to the plain fast path."""
    rng = np.random.default_rng(8)
    w, ref_buf = _pair(name=name)
    key = "window" if name == "sliding_window" else "prefix_len"
    checked = []
    real = D.BatchDecodeWrapper._plan_checked
    monkeypatch.setattr(
        D.BatchDecodeWrapper, "_plan_checked", lambda self, *a: checked.append(1) or real(self, *a)
    )
    narrowed = fast = 0
    for trial in range(150):
        args = page_table(rng, int(rng.integers(1, 65)), max_len=int(rng.choice([3000, 70000])))
        kw = {"q_len_per_request": 1 + (trial // 8) % 4}  # runs of one q_len
        if trial % 5:
            kw["params"] = {key: (1, 300, 1024)[(trial // 4) % 3]}  # runs of one value
        before = len(checked)
        got, want = _outcome(w, *args, **kw), _expected(w, ref_buf, *args, **kw)
        assert got == want, trial
        if "params" in kw and isinstance(got[0], bytes):
            assert w._fast is not None and w._fast.program is w._planned_mask.program
            fast += len(checked) == before
            narrowed += bool((w.last_schedule.items[:, 3] > 0).any())
    assert fast > 20, fast
    assert narrowed > 30 or name == "prefix_lm", narrowed
    args = page_table(rng, 8)
    _plan(w, *args)
    _plan(w, *args)
    assert w._fast is not None  # no params: the fast path again


BAD = {
    "start": ([1, 2, 3], [1, 1]),
    "decreasing": ([0, 3, 2, 4], [1, 1, 1]),
    "empty": ([], []),
    "last count": ([0, 2, 3], [1, 1, 1]),
    "last range": ([0, 2, 2, 5], [3, 0, 17]),
    "last zero": ([0, 2, 3], [5, 0]),
    "negative last": ([0, 1], [-1]),
    "batch": (list(range(66)), [1] * 65),
    "short ids": ([0, 20, 40], [1, 1]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_errors_match_the_oracle(cpu, case):
    indptr, last = BAD[case]
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    ids = i32(list(range(30)))
    good = page_table(np.random.default_rng(1), 4)
    for warm in (False, True):  # the checked path, then the fast path
        w, ref_buf = _pair()
        if warm:
            _plan(w, *good)
            assert w._fast is not None
        got = _outcome(w, i32(indptr), ids, i32(last))
        assert got == _expected(w, ref_buf, i32(indptr), ids, i32(last))
        assert got[0] in (ValueError, CapacityError), got


def test_negative_and_capacity_errors_match_the_oracle(cpu):
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    good = page_table(np.random.default_rng(1), 4, max_len=40)
    cases = [
        (i32([0, 2, 3]), i32([4, -1, 7]), i32([3, 3])),  # negative page id
        (i32([0, 40, 90]), i32(list(range(90))), i32([3, 3])),  # beyond max_num_pages
    ]
    for warm in (False, True):
        for args in cases:
            w, ref_buf = _pair(max_pages=64)
            if warm:
                _plan(w, *good)
            got = _outcome(w, *args)
            assert got == _expected(w, ref_buf, *args)
            assert got[0] in (ValueError, CapacityError)


def test_lengths_beyond_the_planner_raise(cpu):
    # 2^31 tokens and more per request: a ValueError naming the request (the planner's
    # generic limits text named none), nothing copied; the next plan works.
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    args = (i32([0, 3, 5]), i32([9, 8, 7, 6, 5]), i32([1 << 30, 5]))
    w, ref_buf = _pair()
    for _ in range(2):  # the checked path, then the fast path
        kind, message = _outcome(w, *args, page_size=1 << 30)
        assert kind is ValueError
        assert message.startswith(
            f"kv_indptr: request 0 holds {3 << 30} KV tokens (3 pages of page_size={1 << 30})"
        )
    good = page_table(np.random.default_rng(4), 8)
    assert _outcome(w, *good) == _expected(w, ref_buf, *good)


def test_build_failure_reaches_plan(cpu, monkeypatch):
    monkeypatch.setattr(decode_plan_library.ONCE, "lib", None)
    monkeypatch.setattr(
        decode_plan_library.ONCE, "failure", "BuildError: attnc: nvcc failed\n  command: nvcc"
    )
    w = make_wrapper()
    with pytest.raises(
        decode_plan_library.PlannerUnavailable, match="could not be built or loaded"
    ):
        _plan(w, *page_table(np.random.default_rng(4), 8))


def test_other_inputs_take_the_checked_path(cpu, monkeypatch):
    w = make_wrapper()
    indptr, ids, last = page_table(np.random.default_rng(2), 8)
    _plan(w, indptr, ids, last)
    want = _outcome(w, indptr, ids, last)
    calls = []
    real = D.BatchDecodeWrapper._plan_checked
    monkeypatch.setattr(
        D.BatchDecodeWrapper, "_plan_checked", lambda self, *a: calls.append(1) or real(self, *a)
    )
    assert _outcome(w, indptr, ids, last) == want and not calls  # fast
    wide = torch.zeros(2 * ids.shape[0], dtype=torch.int32)
    wide[::2] = ids
    assert _outcome(w, indptr, wide[::2], last) == want and calls  # strided page ids
    calls.clear()
    out = _outcome(w, indptr, ids, last, page_size=np.int64(PAGE))  # not a plain int: checked
    assert calls and out == want
    for bad, shown in ((16.0, "float 16.0"), (16.7, "float 16.7"), (True, "bool True")):
        out = _outcome(w, indptr, ids, last, page_size=bad)
        assert out == (ValueError, f"page_size: expected an int, got {shown}")
    out = _outcome(w, indptr, ids, last, q_len_per_request=True)
    assert out == (ValueError, "q_len_per_request: expected an int, got bool True")
    out = _outcome(w, indptr, ids, last, heads=(float(HQ), HKV))
    assert out == (ValueError, f"num_qo_heads: expected an int, got float {float(HQ)}")
    calls.clear()
    assert _outcome(w, indptr, ids, last, sm_scale=0.1)[0] == want[0] and calls  # new shape
    calls.clear()
    assert _outcome(w, indptr, ids, last, sm_scale=0.1)[0] == want[0] and not calls
    with pytest.raises(ValueError, match="kv_indptr: dtype must be torch.int32"):
        _plan(w, indptr.long(), ids, last)


def test_wrapper_with_cuda_graph_keeps_shape(cpu):
    w = make_wrapper(graph=True)
    args = page_table(np.random.default_rng(3), 8)
    _plan(w, *args)
    _plan(w, *args)
    assert w._args.flags == FLAG_MERGE and w._fast is not None
    with pytest.raises(ValueError, match="use_cuda_graph wrapper must keep"):
        _plan(w, *args, q_len_per_request=2)


def test_repeated_plan_params_keep_their_checks(cpu):
    """A plan-time value equal to the last one (same type) reuses its planned mask; a value
    of another type or range is checked again and refused as on a fresh wrapper."""
    w = make_wrapper(name="sliding_window")
    args = page_table(np.random.default_rng(6), 8)
    _plan(w, *args, params={"window": 1024})
    planned = w._planned_mask
    _plan(w, *args, params={"window": 1024})
    assert w._planned_mask is planned and w._fast is not None
    for bad, words in ((1024.0, "got float"), (True, "got bool"), (2**40, "does not fit")):
        with pytest.raises(ValueError, match=f"param 'window' \\(i32\\): .*{words}"):
            _plan(w, *args, params={"window": bad})
    _plan(w, *args, params={"window": 300})
    assert w._planned_mask.values == {"window": 300}


def test_a_refused_plan_keeps_the_planned_mask(cpu):
    """A plan refused after its mask params were read (a bad page table; a use_cuda_graph
    wrapper given another shape) leaves the last plan's mask in force: run() must still
    match the window the work lists were cut for, not the refused plan's."""
    for graph in (False, True):
        w = make_wrapper(name="sliding_window", graph=graph)
        indptr, ids, last = page_table(np.random.default_rng(11), 8)
        _plan(w, indptr, ids, last, params={"window": 50})
        planned = w._planned_mask
        bad_last = last.clone()
        bad_last[0] = 0
        with pytest.raises(ValueError, match="kv_last_page_len"):
            _plan(w, indptr, ids, bad_last, params={"window": 1000})
        assert w._planned_mask is planned and w._planned_mask.values == {"window": 50}
        if graph:
            with pytest.raises(ValueError, match="use_cuda_graph wrapper must keep"):
                _plan(w, indptr, ids, last, params={"window": 1000}, q_len_per_request=2)
            assert w._planned_mask is planned
        _plan(w, indptr, ids, last, params={"window": 1000})
        assert w._planned_mask.values == {"window": 1000}


def test_kv_token_starts_are_copied_by_the_step(cpu):
    """A variant that reads a kv_len tensor: the step writes kv_token_start (prefix sums of
    (pages - 1) * page_size + last, 0 for a request without pages) into its workspace region
    with the work lists, on the checked and the fast path; run() sizes from the same plan."""
    w = make_wrapper(name="doc_causal")
    w._reads_kv_tokens = True
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    begin = w.layout.kv_token_start
    before = decode_plan_library.fake_cuda(-1)[0]
    _plan(w, i32([0, 2, 2, 5]), i32(list(range(5))), i32([3, 0, 16]), q_len_per_request=4)
    assert w._ws[begin : begin + 16].view(torch.int32).tolist() == [0, 19, 19, 67]
    assert w._token_sizes == {"q_len": 12, "kv_len": 67, "batch_size": 3}
    assert decode_plan_library.fake_cuda(-1)[0] - before == 3  # work lists, page ids, starts
    rng = np.random.default_rng(9)
    for _ in range(20):  # the fast path, other batches
        indptr, ids, last = page_table(rng, int(rng.integers(0, 65)))
        _plan(w, indptr, ids, last, q_len_per_request=4)
        pages = (indptr[1:] - indptr[:-1]).long()
        lens = torch.where(pages > 0, (pages - 1) * PAGE + last.long(), 0)
        want = [0, *torch.cumsum(lens, 0).tolist()]
        n = len(want)
        assert w._ws[begin : begin + 4 * n].view(torch.int32).tolist() == want
        assert w._token_sizes == {"q_len": 4 * (n - 1), "kv_len": want[-1], "batch_size": n - 1}
    assert w._fast is not None


def test_a_per_key_tensor_given_to_plan_is_sent_to_run(cpu):
    """A [kv_len] tensor param (a document id per key) given to decode plan() was refused
    with 'its size comes from the batch, which is not known here', though plan() holds the
    batch: it plays no part in the KV ranges, and the refusal now says where it belongs."""
    w = make_wrapper(name="doc_causal")
    w._device = torch.device("cpu")
    args = page_table(np.random.default_rng(5), 4)
    with pytest.raises(ValueError, match=r"param 'doc' .*not a tensor of one value per KV token: give it to run\(\)"):  # fmt: skip
        _plan(w, *args, params={"doc": torch.zeros(64, dtype=torch.int32)})
    _plan(w, *args)


@pytest.mark.parametrize(("name", "graph"), [("vanilla", False), ("doc_causal", True)])
def test_a_checked_plan_writes_the_plan_fixed_launch_fields(cpu, name, graph):
    """The fields of AttncDecodeArgs a checked plan fixes: the workspace regions' addresses
    (kv_token_start only for a variant that reads a kv_len tensor), heads, page size, layout,
    grid, merge CTAs and flag, scale and the params struct's size; a fast-path plan keeps them
    and sets the merge flag again."""
    w = make_wrapper(name=name, graph=graph)
    w._reads_kv_tokens = name == "doc_causal"
    args = page_table(np.random.default_rng(2), 8)
    _plan(w, *args, sm_scale=0.125)
    base, lay, a = w._ws.data_ptr(), w.layout, w._args
    regions = ("header", "cta_indptr", "items", "req_page_begin", "req_kv_len", "page_ids")
    want = {field: base + getattr(lay, field) for field in regions}
    want.update(
        kv_token_start=base + lay.kv_token_start if w._reads_kv_tokens else None,
        merge_items=base + lay.merge_items,
        part_o=base + lay.partials,
        part_lse=base + lay.part_lse_offset(DIM),
        num_qo_heads=HQ,
        num_kv_heads=HKV,
        head_dim=DIM,
        page_size=PAGE,
        kv_layout=abi.paged_kv_code("NHD"),
        rows_per_item=16,
        num_ctas=min(2 * 132, lay.max_ctas),
        merge_ctas=2 * 132,
        flags=FLAG_MERGE if graph or w.last_schedule.merge_rows > 0 else 0,
        sm_scale=0.125,
        variant_params_size=ctypes.sizeof(abi.params_struct(w.variant.ir.params)),
    )
    assert {field: getattr(a, field) for field in want} == want
    _plan(w, *args, sm_scale=0.125)
    assert w._fast is not None
    assert {field: getattr(a, field) for field in want} == want
