"""Hostile or unlucky plans and runs of the wrappers, on the CPU (launchers stubbed): a value
that no longer fits the current plan, or an argument the kernels would misread, is refused
with a ValueError naming it instead of reaching a launch."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import attnc
from attnc.runtime.checks import tensors
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401 (a fixture)
from tests.unit.test_prefill_call_memo import HKV, HQ, D, _Recorder, cpu_run  # noqa: F401

I32 = dict(dtype=torch.int32)


def _decode_plan_of(w, total_kv: int) -> None:
    """What a decode plan() of the fixture's batch with ``total_kv`` KV tokens sets for run()."""
    w._reads_kv_tokens = True
    w._native = SimpleNamespace(total_kv=total_kv)
    w._set_token_sizes(1)


def test_decode_cached_call_rechecks_a_kv_len_param_after_a_plan_of_other_lengths(
    cpu_decode,  # noqa: F811
) -> None:
    """A cached call kept a kv_len tensor sized for the previous plan's KV tokens."""
    w = cpu_decode("doc_causal")
    q, cache = _inputs()
    _decode_plan_of(w, 12)
    doc = torch.zeros(12, **I32)
    w.run(q, cache, doc=doc)
    _decode_plan_of(w, 15)  # the next step: the same batch, three more KV tokens
    with pytest.raises(ValueError, match=r"param 'doc' .*expected shape \[15\]"):
        w.run(q, cache, doc=doc)
    w.run(q, cache, doc=torch.zeros(15, **I32))
    assert len(w._module.calls) == 2


@pytest.fixture
def single_cpu(cpu_run, monkeypatch):  # noqa: F811
    """Variant.prefill on the CPU: every planned wrapper launches into one recorder."""
    from attnc.runtime.build.backends import PrefillChoice

    recorders: dict[str, _Recorder] = {}

    def choice(self, *args):
        rec = recorders.setdefault(self.variant.name, _Recorder(self.variant))
        return PrefillChoice("fa2", rec, 16)

    monkeypatch.setattr(BatchPrefillWrapper, "_module_choice", choice)
    return recorders


def _single_qkv(q_len: int = 5, kv_len: int = 7):
    q = torch.randn(q_len, HQ, D).to(torch.bfloat16)
    k, v = (torch.randn(kv_len, HKV, D).to(torch.bfloat16) for _ in "kv")
    return q, k, v


def test_single_prefill_reads_a_tensor_sm_scale_on_every_call(single_cpu) -> None:
    """The plan of one request was reused by the sm_scale object: a scale tensor written
    between two calls launched with the value it held at the first."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _single_qkv()
    scale = torch.tensor(0.5)
    variant.prefill(q, k, v, sm_scale=scale)
    scale.fill_(0.25)
    variant.prefill(q, k, v, sm_scale=scale)
    assert [c["sm_scale"] for c in single_cpu["causal"].calls] == [0.5, 0.25]


def _prefill_wrapper(name: str = "causal", workspace: torch.Tensor | None = None):
    """A ragged causal plan of 5 + 9 tokens on a CPU workspace; the wrapper and its recorder."""
    from attnc.runtime.build.backends import PrefillChoice

    variant = attnc.load(f"stdlib:{name}")
    recorder = _Recorder(variant)
    if workspace is None:
        workspace = torch.empty(1 << 22, dtype=torch.uint8)
    w = BatchPrefillWrapper(variant, workspace)
    w._module_choice = lambda *a: PrefillChoice("fa2", recorder, 16)  # type: ignore[method-assign]
    indptr = torch.tensor([0, 5, 14], **I32)
    w.plan(indptr, indptr, HQ, HKV, D)
    return w, recorder


def _view_at(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A contiguous view of ``shape`` over ``t``'s memory, from its first element."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), shape)


def _arena(*sizes: int) -> list[torch.Tensor]:
    """bf16 views [n, HKV, D] of one buffer, each starting where the last one ends."""
    base = torch.randn(sum(sizes), HKV, D).to(torch.bfloat16)
    return list(base.split(sizes))


@pytest.mark.parametrize("repeated", [False, True])
@pytest.mark.parametrize("name", ["k", "v"])
def test_prefill_out_overlapping_k_or_v_is_refused(cpu_run, name, repeated) -> None:  # noqa: F811
    """The kernel reads every tile of K/V while other CTAs write O: an ``out`` over them
    gave output computed from partly overwritten keys."""
    w, rec = _prefill_wrapper()
    q = torch.randn(14, HQ, D).to(torch.bfloat16)
    k, v, spare = _arena(14, 14, 14)
    kv = {"k": k, "v": v}
    out = torch.cat([kv[name], spare]).view(14, HQ, D)  # a copy: fine
    w.run(q, (k, v), out=out)
    if not repeated:
        w._memo.clear()  # the plan's first call: every check
    aliased = _view_at(kv[name], (14, HQ, D))
    with pytest.raises(ValueError, match=f"^out: overlaps {name} in memory"):
        w.run(q, (k, v), out=aliased)
    assert len(rec.calls) == 1


@pytest.mark.parametrize("repeated", [False, True])
@pytest.mark.parametrize("name", ["q", "out"])
def test_prefill_q_or_out_in_the_workspace_is_refused(cpu_run, name, repeated) -> None:  # noqa: F811
    """The kernels write split-KV partial states into the workspace and read the work lists
    from it: a q or out there was overwritten, or overwrote the lists."""
    workspace = torch.empty(1 << 22, dtype=torch.uint8)
    w, rec = _prefill_wrapper(workspace=workspace)
    q = torch.randn(14, HQ, D).to(torch.bfloat16)
    k, v = _arena(14, 14)
    w.run(q, (k, v), out=torch.empty_like(q))
    if not repeated:
        w._memo.clear()
    inside = workspace[1 << 21 :].view(torch.bfloat16)[: q.numel()].view(q.shape)
    args = {"q": (inside, torch.empty_like(q)), "out": (q, inside)}[name]
    with pytest.raises(ValueError, match=f"^{name}: overlaps workspace_buffer in memory"):
        w.run(args[0], (k, v), out=args[1])
    assert len(rec.calls) == 1


@pytest.mark.parametrize("repeated", [False, True])
def test_decode_out_overlapping_the_kv_cache_is_refused(cpu_decode, repeated) -> None:  # noqa: F811
    """Other CTAs still read pages of the cache while a CTA writes its O rows."""
    w = cpu_decode("vanilla")
    q, cache = _inputs()
    w.run(q, cache, out=torch.empty_like(q))
    if not repeated:
        w._calls.clear()
    with pytest.raises(ValueError, match="^out: overlaps kv in memory"):
        w.run(q, cache, out=_view_at(cache[3], q.shape))
    assert len(w._module.calls) == 1


@pytest.mark.parametrize("repeated", [False, True])
@pytest.mark.parametrize("name", ["q", "out"])
def test_decode_q_or_out_in_the_workspace_is_refused(cpu_decode, name, repeated) -> None:  # noqa: F811
    w = cpu_decode("vanilla")
    workspace = torch.empty(1 << 20, dtype=torch.uint8)
    w._workspace_range = tensors.byte_range(workspace)
    q, cache = _inputs()
    w.run(q, cache, out=torch.empty_like(q))
    if not repeated:
        w._calls.clear()
    inside = workspace[4096:].view(torch.bfloat16)[: q.numel()].view(q.shape)
    args = {"q": (inside, torch.empty_like(q)), "out": (q, inside)}[name]
    with pytest.raises(ValueError, match=f"^{name}: overlaps workspace_buffer in memory"):
        w.run(args[0], cache, out=args[1])
    assert len(w._module.calls) == 1


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (np.bool_(True), "bool np.True_"),
        (torch.tensor(True), "Tensor tensor(True)"),
        (10**400, "int 1000"),
    ],
)
def test_sm_scale_that_is_a_numpy_or_tensor_bool_or_an_int_past_float_is_named(
    value, shown
) -> None:
    """numpy's and torch's True were taken as a scale of 1.0 (Python's True is refused), and
    an int past the float range raised a bare OverflowError."""
    with pytest.raises(ValueError, match=f"^sm_scale: expected a float, got {re.escape(shown)}"):
        tensors.check_sm_scale(value, 128)


@pytest.mark.parametrize("wrapper", ["BatchPrefillWrapper", "BatchDecodeWrapper"])
@pytest.mark.parametrize("variant", ["stdlib:causal", None])
def test_a_wrapper_of_something_else_than_a_variant_names_the_argument(wrapper, variant) -> None:
    """A variant's name in place of attnc.load(name) raised an AttributeError from deep
    inside the constructor (prefill) or was reported as a workspace problem (decode)."""
    with pytest.raises(TypeError, match="^variant: expected a variant from attnc.load"):
        getattr(attnc, wrapper)(variant, torch.empty(1 << 20, dtype=torch.uint8))


@pytest.mark.parametrize(
    ("variant", "value", "words"),
    [
        ("softcap", 10**400, r"param 'cap' \(f32\): value out of the float range"),
        ("softcap", Fraction(10**400, 3), r"param 'cap' \(f32\): value out of the float range"),
        ("softcap", 1e300, r"param 'cap' \(f32\): value out of the float range \(f32 would"),
        ("softcap", -3.5e38, r"param 'cap' \(f32\): value out of the float range \(f32 would"),
        ("sliding_window", 10**5000, r"param 'window' \(i32\): an int of 16610 bits does not"),
    ],
    ids=["int", "fraction", "1e300", "-3.5e38", "digits"],
)
def test_a_scalar_param_past_the_float_or_printable_range_is_named(variant, value, words) -> None:
    """float() of a huge int or fraction raised a bare OverflowError, and an i32 of 5000
    digits raised Python's digit-limit ValueError while its message was formatted. A float
    past float32's range was packed as inf: soft-cap's inf * tanh(score / inf) made every
    logit NaN."""
    v = attnc.load(f"stdlib:{variant}")
    name = "cap" if variant == "softcap" else "window"
    with pytest.raises(ValueError, match=f"^variant '{variant}': {words}"):
        v.resolve_for({name: value}, (HQ, HKV, D), "cpu", {})


@pytest.mark.parametrize("value", [math.inf, -math.inf, np.float64(math.inf), 3.4028234e38])
def test_an_f32_param_of_inf_or_near_the_f32_maximum_is_taken(value) -> None:
    """inf given as inf is a value (a variant may mean it); the largest float32 is too."""
    v = attnc.load("stdlib:softcap")
    assert v.resolve_for({"cap": value}, (HQ, HKV, D), "cpu", {})["cap"] == float(value)


@pytest.mark.parametrize("flag", ["no", 0, None, np.False_])
def test_a_return_lse_that_is_not_a_bool_is_named(cpu_run, cpu_decode, single_cpu, flag) -> None:  # noqa: F811
    """``return_lse="no"`` counted as on: every entry returned (O, LSE) where O was asked for.
    Prefill, decode, the one-request prefill and the eager reference all refuse it."""
    message = r"^return_lse: expected True or False, got "
    w, rec = _prefill_wrapper()
    q = torch.randn(14, HQ, D).to(torch.bfloat16)
    k, v = _arena(14, 14)
    with pytest.raises(TypeError, match=message):
        w.run(q, (k, v), return_lse=flag)
    dw = cpu_decode("causal")
    dq, cache = _inputs()
    with pytest.raises(TypeError, match=message):
        dw.run(dq, cache, return_lse=flag)
    variant = attnc.load("stdlib:causal")
    with pytest.raises(TypeError, match=message):
        variant.prefill(*_single_qkv(), return_lse=flag)
    with pytest.raises(TypeError, match=message):
        variant.reference(*(t.float() for t in _single_qkv()), return_lse=flag)
    assert rec.calls == [] and dw._module.calls == []


@pytest.mark.parametrize("value", [1e39, 3.4028236e38, 1e-50, 1e-39])
def test_an_sm_scale_the_float32_kernels_cannot_hold_is_named(value) -> None:
    """A scale past float32's range reached the kernels as inf, a tiny one as 0 or a
    subnormal: the check took the float64 value."""
    with pytest.raises(ValueError, match=r"^sm_scale: .* as the kernels' float32 scale"):
        tensors.check_sm_scale(value, 128)
    assert tensors.check_sm_scale(3.4028235e38, 128) == 3.4028235e38  # rounds to float32's max
    assert tensors.check_sm_scale(1.2e-38, 128) == 1.2e-38


@pytest.mark.parametrize("which", ["q", "k"])
def test_single_prefill_past_the_token_limit_names_the_tensor(single_cpu, which) -> None:
    """A zero-stride q or k of more than 2**31 - 2**16 rows: its length went into an int32
    indptr first (torch's overflow error), and lengths below 2**31 were planned."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _single_qkv()
    rows = 2**31 - 2**16 + 1
    if which == "q":
        q = q[:1].expand(rows, HQ, D)
    else:
        k, v = k[:1].expand(rows, HKV, D), v[:1].expand(rows, HKV, D)
    with pytest.raises(ValueError, match=f"^{which}: holds {rows} .* tokens, more than"):
        variant.prefill(q, k, v)
    assert not single_cpu  # nothing was launched (or planned)


def test_planned_backend_is_none_before_a_plan_and_kept_by_a_refused_one(cpu_run) -> None:  # noqa: F811
    from attnc.runtime.build.backends import PrefillChoice

    variant = attnc.load("stdlib:causal")
    w = BatchPrefillWrapper(variant, torch.empty(1 << 22, dtype=torch.uint8))
    assert w.planned_backend is None
    w._module_choice = lambda *a: PrefillChoice("fa2", _Recorder(variant), 16)  # type: ignore[method-assign]
    indptr = torch.tensor([0, 5, 14], **I32)
    w.plan(indptr, indptr, HQ, HKV, D)
    assert w.planned_backend == "fa2"
    w._module_choice = lambda *a: PrefillChoice("sm90", _Recorder(variant), 16)  # type: ignore[method-assign]
    w._copy_to_workspace = None  # the plan fails after the module choice
    with pytest.raises(TypeError):
        w.plan(indptr, indptr, HQ, HKV, D)
    assert w.planned_backend == "fa2"


def test_single_prefill_checks_the_memory_layout_as_run_does(single_cpu) -> None:
    """Variant.prefill launched a q 2 bytes past a 16-byte boundary; the kernel's launch
    check then failed naming no tensor."""
    variant = attnc.load("stdlib:causal")
    q, k, v = _single_qkv()
    shifted = torch.randn(q.numel() + 1).to(torch.bfloat16)[1:].view(q.shape)
    with pytest.raises(ValueError, match="^q: starts 2 bytes past a 16-byte boundary"):
        variant.prefill(shifted, k, v)
    assert not single_cpu.get("causal") or not single_cpu["causal"].calls


def test_single_prefill_sizes_the_tile_map_for_the_kernels_tile_of_a_wide_group(
    single_cpu, monkeypatch
) -> None:
    """Variant.prefill kept a tile map for 16-token query tiles, while an MQA group of 32
    runs 4-token tiles on long queries: a 40K-token document mask was refused with a
    max_tile_map_bytes the caller cannot pass."""
    from attnc.runtime.build.backends import PrefillChoice
    from attnc.runtime.planning import prefill_plan
    from attnc.runtime.wrappers import prefill_tile_map

    built: list[int] = []

    def build(module, workspace, inputs, values, reads, reserve, *rest):
        entries = int(inputs.map_starts[-1])
        prefill_plan.check_map_fits(entries, reserve)
        built.append(entries)
        return np.full(entries, 2, np.uint8)  # every tile PARTIAL

    monkeypatch.setattr(prefill_tile_map, "build_tile_map", build)
    rec = _Recorder(attnc.load("stdlib:doc_causal"))
    monkeypatch.setattr(
        BatchPrefillWrapper, "_module_choice", lambda self, *a: PrefillChoice("fa2", rec, 4)
    )
    n = 40960
    variant = attnc.load("stdlib:doc_causal")
    q = torch.zeros(n, 32, 64, dtype=torch.bfloat16)
    k = torch.zeros(n, 1, 64, dtype=torch.bfloat16)
    variant.prefill(q, k, k.clone(), doc=torch.zeros(n, dtype=torch.int32))
    assert built == [(n // 4) * (n // 64)] and len(rec.calls) == 1


@pytest.mark.parametrize("as_tuple", [False, True])
def test_a_cache_of_2_to_the_31_pages_is_refused(as_tuple: bool) -> None:
    """The kernels check page ids against a page count held in int32 (clamped to
    2**31 - 1): in a cache of 2**31 pages (a view with page stride 0), the valid id
    2**31 - 1 was found out of range on the device and its rows written as NaN."""
    from attnc.runtime.checks.kv import paged_kv

    page = torch.zeros(1, 2, 1, 1, 64, dtype=torch.bfloat16)
    for pages, refused in ((2**31 - 1, False), (2**31, True)):
        cache = page.expand(pages, 2, 1, 1, 64)
        kv = (cache[:, 0], cache[:, 1]) if as_tuple else cache
        if not refused:
            assert paged_kv(kv, "NHD", 1, 1, 64, "cpu").num_pages == pages
            continue
        name = "k_cache" if as_tuple else "kv"
        with pytest.raises(ValueError, match=f"^{name}: holds 2147483648 pages; page ids are "
                           "int32, so a cache holds at most 2147483647$"):  # fmt: skip
            paged_kv(kv, "NHD", 1, 1, 64, "cpu")
