"""BatchDecodeWrapper.plan() checks each argument once, on the CPU (the step's CUDA calls
switched to host memcpys):

- with plan-time tensor params (a per-request ``window[batch]``) the head counts, q_len and
  ``kv_indptr`` are checked where the tensors are sized by them (``_mask_ranges``), and not
  again by the checked path nor (``kv_indptr``'s entries) by the C++ planner;
- when the mask's range rows read the KV lengths (their per-request columns are computed from
  them before the step), the C++ page-table check (``page_table_check.h``) runs once, in
  ``attnc_decode_check``; ``attnc_decode_step_checked`` then plans the tables it passed.

Pinned alike before and after the checks were made single: the message of each faulty
argument and which one wins when several are wrong, with tensor params, with length-reading
range rows and without either; and the plans of per-request windows against the oracle."""

from __future__ import annotations

import collections
import itertools

import decode_schedule_oracle as oracle
import numpy as np
import pytest
import torch
from mask_ranges_oracle import decode_spans, tile_kv_ranges
from test_decode_plan_step import DIM, HKV, HQ, _FakeModule, _outcome, cpu, lib, make_wrapper
from test_decode_plan_step import page_table as random_table

import attnc
from attnc.runtime.checks import tensors
from attnc.runtime.wrappers import decode_launch

pytestmark = pytest.mark.nvcc

__all__ = ["cpu", "lib"]  # fixtures of test_decode_plan_step used here

I32 = {"dtype": torch.int32}

# A per-request window whose range rows' extra column reads kv_len (kv_len * window[batch]):
# the planner computes the KV lengths before the step.
LENGTHS_WINDOW = """variant lengths_window {
    param window: tensor<i32>[batch_size];
    mask = q_pos - kv_idx < kv_len * window[batch] && kv_idx <= q_pos;
}"""
# A scalar param in an atom that reads q_len: an extra column of the lengths, no tensor.
SQUARE_WINDOW = """variant square_window {
    param window: i32 = 4;
    mask = kv_idx < q_len * q_len + window;
}"""

# name -> (source, params of a good plan)
VARIANTS = {
    "per_request_window": ("stdlib:per_request_window", "tensor"),
    "lengths_window": (LENGTHS_WINDOW, "tensor"),
    "square_window": (SQUARE_WINDOW, "scalar"),
    "vanilla": ("stdlib:vanilla", None),
}


def wrapper(name: str, source: str | None = None, **kw):
    """``make_wrapper`` (a CPU workspace, fake modules) of variant ``name`` of VARIANTS (or of
    ``source``); its device the CPU, where the tests' param tensors live."""
    source = VARIANTS[name][0] if source is None else source
    w = make_wrapper(**kw)
    variant = attnc.load(source) if source.startswith("stdlib:") else attnc.load(source=source)
    w.variant = variant
    w._modules = {k: (_FakeModule(variant), *rest) for k, (_, *rest) in w._modules.items()}
    w._packer = decode_launch.ParamsPacker(variant.params)
    w._all_defaults = all(d.kind != "tensor" and d.default is not None for d in variant.params)
    w._device = torch.device("cpu")
    return w


def _good(name: str) -> dict[str, object]:
    """The arguments of a good plan of three requests (9 pages of 16 tokens, q_len 2)."""
    kw: dict[str, object] = {
        "indptr": [0, 3, 5, 9], "ids": list(range(12)), "last": [5, 16, 1], "heads": (HQ, HKV),
        "page_size": 16, "q_len": 2, "dtype": torch.bfloat16, "sm_scale": None,
    }  # fmt: skip
    kind = VARIANTS[name][1] if name in VARIANTS else None
    if kind == "tensor":
        kw["params"] = {"window": torch.tensor([4, 2, 8], **I32)}
    elif kind == "scalar":
        kw["params"] = {"window": 3}
    return kw


# fault -> (the argument it changes, its bad value, the message it gets)
FAULTS: dict[str, tuple[str, object, str]] = {
    "heads": ("heads", (HQ, 5), f"num_qo_heads: {HQ} is not a multiple of num_kv_heads 5"),
    "heads type": (
        "heads", (float(HQ), HKV), f"num_qo_heads: expected an int, got float {float(HQ)}",
    ),
    "q_len": ("q_len", 9, "q_len_per_request: must be in [1, 8], got 9"),
    "q_len type": ("q_len", True, "q_len_per_request: expected an int, got bool True"),
    "indptr type": ("indptr", (0, 3, 5, 9), "kv_indptr: expected a torch.Tensor, got tuple"),
    "indptr dtype": (
        "indptr",
        torch.tensor([0, 3, 5, 9], dtype=torch.int64),
        "kv_indptr: dtype must be torch.int32, got torch.int64",
    ),
    "indptr 2-D": (
        "indptr",
        torch.tensor([[0, 3, 5, 9]], **I32),
        "kv_indptr: must be 1-D, got shape [1, 4]",
    ),
    "indptr start": ("indptr", [1, 3, 5, 9], "kv_indptr: must start at 0, got 1"),
    "indptr decreasing": (
        "indptr",
        [0, 3, 2, 9],
        "kv_indptr: must be non-decreasing, but kv_indptr[2]=2 < kv_indptr[1]=3",
    ),
    "window size": (
        "params",
        {"window": torch.tensor([4, 2, 8, 1], **I32)},
        "variant '{variant}': param 'window' (tensor<i32>[batch_size]): expected shape [3] "
        "(batch_size = requests in the batch), got [4]",
    ),
    "dtype": ("dtype", torch.float32, "dtype: must be torch.bfloat16 or torch.float16, got torch.float32"),  # fmt: skip
    "page_size": ("page_size", 0, "page_size: must be in [1, 2147483647], got 0"),
    "sm_scale": ("sm_scale", -1.0, "sm_scale: must be a finite number > 0, got -1.0"),
    "last dtype": (
        "last",
        torch.tensor([5, 16, 1], dtype=torch.int64),
        "kv_last_page_len: dtype must be torch.int32, got torch.int64",
    ),
    "last count": ("last", [5, 16, 1, 1], "kv_last_page_len: expected 3 entries, got 4"),
    "last range": (
        "last", [5, 0, 1], "kv_last_page_len: kv_last_page_len[1]=0 is outside [1, page_size=16]",
    ),
    "ids dtype": (
        "ids",
        torch.arange(12, dtype=torch.int64),
        "kv_indices: dtype must be torch.int32, got torch.int64",
    ),
    "ids short": ("ids", list(range(8)), "kv_indices: has 8 entries, but kv_indptr[-1] = 9"),
    "ids negative": (
        "ids", [0, 1, -4, *range(3, 12)], "kv_indices: page index -4 is negative",
    ),
}  # fmt: skip

# The faults in the order plan() reports them (the first of several wins). With tensor params
# the sizes the tensor is checked against come first (heads, q_len, kv_indptr), then the
# tensor; the page table's values are the planner's, after every Python check.
TENSOR_ORDER = [
    "heads", "heads type", "q_len", "q_len type", "indptr type", "indptr dtype", "indptr 2-D",
    "indptr start", "indptr decreasing", "window size", "dtype", "page_size", "sm_scale",
    "last dtype", "ids dtype", "last count", "last range", "ids short", "ids negative",
]  # fmt: skip
PLAIN_ORDER = [
    "heads", "heads type", "dtype", "page_size", "q_len", "q_len type", "sm_scale",
    "indptr type", "indptr dtype", "indptr 2-D", "last dtype", "ids dtype", "indptr start",
    "indptr decreasing", "last count", "last range", "ids short", "ids negative",
]  # fmt: skip
ORDERS = {
    "per_request_window": TENSOR_ORDER,
    "lengths_window": TENSOR_ORDER,
    "square_window": PLAIN_ORDER,
    "vanilla": PLAIN_ORDER,
}


def _tensor(value: object) -> object:
    return torch.tensor(value, **I32) if isinstance(value, list) else value


def _plan_with(name: str, faults: tuple[str, ...] = (), w=None) -> str:
    """plan() of the good arguments with ``faults`` applied: "ok" or the error's text."""
    kw = _good(name)
    for fault in faults:
        arg, value, _ = FAULTS[fault]
        kw[arg] = value
    w = wrapper(name, max_batch=8, max_pages=64) if w is None else w
    hq, hkv = kw["heads"]  # type: ignore[misc]
    try:
        w.plan(
            _tensor(kw["indptr"]), _tensor(kw["ids"]), _tensor(kw["last"]), hq, hkv, DIM,
            kw["page_size"], q_len_per_request=kw["q_len"], sm_scale=kw["sm_scale"],
            dtype=kw["dtype"], params=kw.get("params"),
        )  # fmt: skip
    except ValueError as exc:
        return str(exc)
    return "ok"


def _message(name: str, fault: str) -> str:
    return FAULTS[fault][2].format(variant=name)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_fault_has_its_message(cpu, name):
    assert _plan_with(name) == "ok"
    for fault in ORDERS[name]:
        assert _plan_with(name, (fault,)) == _message(name, fault), fault


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_first_fault_in_the_order_wins(cpu, name):
    """Two faults of different arguments: the one plan() checks first is reported."""
    order = ORDERS[name]
    w = wrapper(name, max_batch=8, max_pages=64)
    for first, second in itertools.combinations(order, 2):
        if FAULTS[first][0] == FAULTS[second][0]:
            continue  # one argument, one value
        got = _plan_with(name, (second, first), w)
        assert got == _message(name, first), (first, second)


def _overflow_with_negative_id(w) -> str:
    """A batch past int32 KV tokens for a variant that reads a kv_len tensor (its
    kv_token_start would wrap) whose page ids hold a negative one: the text of the error."""
    w._reads_kv_tokens = True
    page, pages, batch = 1 << 20, 1024, 5
    indptr = torch.tensor([pages * i for i in range(batch + 1)], **I32)
    ids = torch.zeros(pages * batch, **I32)
    ids[7] = -3
    last = torch.tensor([page] * batch, **I32)
    window = torch.full((batch,), 4, **I32)
    try:
        w.plan(indptr, ids, last, HQ, HKV, DIM, page, params={"window": window})
    except ValueError as exc:
        return str(exc)
    return "ok"


KV_AND_WINDOW = """variant kv_and_window {{
    param doc: tensor<i32>[kv_len];
    param window: tensor<i32>[batch_size];
    mask = doc[kv_idx] >= 0 && q_pos - kv_idx < {width} && kv_idx <= q_pos;
}}"""


@pytest.mark.parametrize(
    ("width", "message"),
    [
        # the rows' column reads no length: the step checks and stages the ids after the
        # KV tokens' limit
        ("window[batch]", "kv_indptr: the batch holds 5368709120 KV tokens"),
        # the rows' column reads kv_len: the page table (negative ids included) is checked
        # before the column is computed, so before the step's KV-token limit
        ("kv_len * window[batch]", "kv_indices: page index -3 is negative"),
    ],
)
def test_a_negative_page_id_and_too_many_kv_tokens(cpu, width, message):
    w = wrapper("kv_and_window", KV_AND_WINDOW.format(width=width))
    assert _overflow_with_negative_id(w).startswith(message)


@pytest.mark.parametrize("name", ["per_request_window", "lengths_window"])
def test_per_request_plans_match_the_oracle(cpu, name):
    """Plans with a per-request window (the rows' column reading kv_len or not) write the
    work region, page ids and largest page id the oracle computes from the numpy spans."""
    w = wrapper(name)
    analysis = w.variant.compiled.mask_analysis
    ref_buf = np.zeros_like(w._pinned_np)
    rng = np.random.default_rng(12)
    planned = 0
    for trial in range(40):
        args = random_table(rng, int(rng.integers(1, 40)), max_len=int(rng.choice([300, 9000])))
        batch = args[0].shape[0] - 1
        window = torch.from_numpy(rng.integers(1, 5, batch).astype(np.int32))
        q_len = 1 + trial % 3
        got = _outcome(w, *args, q_len_per_request=q_len, params={"window": window})
        try:
            kv, max_page = oracle.check_page_table(
                args[0].numpy(), args[2].numpy(), 16, w.layout, args[1].numpy(), False
            )
        except ValueError as exc:
            assert got == (type(exc), str(exc)), trial
            continue
        ranges = tile_kv_ranges(analysis, {}, {"window": window.numpy()})
        spans = decode_spans(ranges, kv, q_len, 64)
        sched = oracle.schedule(
            kv, q_len, HQ, HKV, -(-q_len * (HQ // HKV) // 16), 264, 64,
            w.layout.max_part_rows(DIM), max_items=w.layout.max_items, spans=spans,
        )  # fmt: skip
        n = oracle.write_work_region(ref_buf, w.layout, sched, q_len, args[0].numpy()[:-1], kv)
        nnz = int(args[0][-1])
        assert got[0] == ref_buf[:n].tobytes(), trial
        assert got[1] == args[1].numpy()[:nnz].tobytes(), trial
        assert (got[2], got[4]) == (batch, max_page), trial
        planned += 1
    assert planned > 20, planned


# A per-request tensor the score reads and the mask does not: plan() checks it against the
# sizes, and the plans after the first take the fast path.
SCORE_BIAS = """variant score_bias {
    param bias: tensor<f32>[batch_size];
    score = score + bias[batch];
    mask = kv_idx <= q_pos;
}"""


class _Calls:
    """Stands in for the planner library: counts the C calls and the ``indptr_checked`` each
    was given."""

    def __init__(self, lib) -> None:
        self._lib = lib
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)

        def call(*args):
            step = args[0]._obj if name.startswith("attnc_decode_") and args else None
            checked = int(step.indptr_checked) if hasattr(step, "indptr_checked") else -1
            self.calls.append((name, checked))
            return fn(*args)

        return call


def _count_checks(monkeypatch) -> collections.Counter:
    """Counts of the Python checks of the sizes: heads, q_len, kv_indptr (tensor, entries)."""
    counts: collections.Counter = collections.Counter()

    def counted(name, real, key=None):
        def check(*args, **kw):
            counts[name if key is None else key(args)] += 1
            return real(*args, **kw)

        monkeypatch.setattr(tensors, name, check)

    counted("check_heads", tensors.check_heads)
    counted("check_int", tensors.check_int, lambda a: f"check_int {a[0]}")
    counted("check_index_tensor", tensors.check_index_tensor, lambda a: f"tensor {a[0]}")
    counted("check_indptr_values", tensors.check_indptr_values)
    return counts


PLAN_KINDS = {
    # name: (the C calls of a plan after the first, each with its indptr_checked)
    "per_request_window": [("attnc_decode_step", 1)],
    # the page table checked once, by attnc_decode_check (attnc_decode_step would again)
    "lengths_window": [("attnc_decode_check", 1), ("attnc_decode_step_checked", 1)],
    "square_window": [("attnc_decode_check", 0), ("attnc_decode_step_checked", 0)],
    "vanilla": [("attnc_decode_step", 0)],
    "score_bias": [("attnc_decode_step", 1)],
}


@pytest.mark.parametrize("name", sorted(PLAN_KINDS))
def test_each_argument_is_checked_once(cpu, monkeypatch, name):
    """One plan() checks the head counts, q_len and kv_indptr once (with tensor params where
    the params are sized by them, and kv_indptr's entries not again in C++), and the page
    table once in C++ (also when the range rows read the KV lengths before the step)."""
    w = wrapper(name, SCORE_BIAS if name == "score_bias" else None)
    kw = _good(name)
    if name == "score_bias":
        kw["params"] = {"bias": torch.zeros(3)}
    hq, hkv = kw["heads"]
    args = [_tensor(kw[k]) for k in ("indptr", "ids", "last")]
    q_len, params = kw["q_len"], kw.get("params")

    def plan():
        w.plan(*args, hq, hkv, DIM, 16, q_len_per_request=q_len, params=params)

    plan()  # the planner made, the first plan checked
    want = (w._ws.numpy().copy(), w._batch, w._max_page, w.last_schedule.num_items)
    calls = _Calls(w._native._lib)
    w._native._lib = calls
    counts = _count_checks(monkeypatch)
    plan()
    assert (w._ws.numpy(), w._batch, w._max_page, w.last_schedule.num_items)[1:] == want[1:]
    assert np.array_equal(w._ws.numpy(), want[0])
    assert calls.calls == PLAN_KINDS[name]
    fast = name in ("vanilla", "score_bias")  # a plan like the last: the fast path
    sized = name in ("per_request_window", "lengths_window", "score_bias")  # tensor params
    assert counts["check_heads"] == (0 if fast and not sized else 1)
    assert counts["check_int q_len_per_request"] == (0 if fast and not sized else 1)
    assert counts["tensor kv_indptr"] == (0 if fast and not sized else 1)
    assert counts["check_indptr_values"] == (1 if sized else 0)


def test_step_checked_plans_only_tables_a_check_passed(cpu):
    """``DecodePlanner.step_checked`` (and the C entry behind it) refuses tables that no
    check passed: none yet, a failed check, or new tables given since."""
    from attnc.runtime import abi

    w = wrapper("vanilla")
    args = [_tensor(v) for v in ([0, 3, 5, 9], list(range(12)), [5, 16, 1])]
    w.plan(*args, HQ, HKV, DIM, 16)
    native = w._native
    st, lib = native._step, native._lib
    tables = [(t.data_ptr(), t.numel()) for t in (args[0], args[2], args[1])]  # indptr, last, ids
    assert st.tables_checked == 0  # a step clears it
    with pytest.raises(RuntimeError, match="step_checked"):
        native.step_checked(0)
    assert lib.attnc_decode_step_checked(native._step_ref, native._result_ref) == (
        abi.PLAN_OUT_OF_RANGE
    )
    assert native.check(*tables, False).tolist() == [37, 32, 49]
    assert st.tables_checked == 1
    assert native.step_checked(0).num_items > 0 and st.tables_checked == 0
    bad = torch.tensor([5, 0, 1], **I32)
    with pytest.raises(ValueError, match=r"kv_last_page_len\[1\]=0"):
        native.check(tables[0], (bad.data_ptr(), 3), tables[2], False)
    assert st.tables_checked == 0
    with pytest.raises(RuntimeError, match="step_checked"):
        native.step_checked(0)
    native.check(*tables, False)
    native.step(*tables, False, 0)  # new tables (the same here): the check no longer holds
    with pytest.raises(RuntimeError, match="step_checked"):
        native.step_checked(0)
