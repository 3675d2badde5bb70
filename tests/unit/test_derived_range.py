"""The values a functor derives once per request from scalar params and sm_scale are checked
in float32 before a launch. Soft-cap's ``cap * tanh(score * sm_scale / cap)`` is rewritten to
``tanh(score * c1) * c2`` with ``c1 = sm_scale / cap`` and ``c2 = 1.442695 * cap``: with
``cap = 1e37`` c1 is subnormal in float32 and with ``cap = 3e38`` c2 overflows, while the
written expression and the reference stay finite. Both calls were launched before the
check; they are now refused, naming the param."""

from __future__ import annotations

import math

import pytest

import attnc
from attnc.codegen.derived_range import checked_value_exprs, derived_value_problem
from tests.unit.test_decode_fast_path import _inputs, cpu_decode  # noqa: F401
from tests.unit.test_prefill_call_memo import _qkv, _ragged_plan, _wrapper, cpu_run  # noqa: F401

HEADS = (4, 2, 128)
SCALE = 1.0 / math.sqrt(128)


def _problem(source: str, **scalars: object) -> str | None:
    compiled = attnc.load(source=source).compiled
    return derived_value_problem(checked_value_exprs(compiled), scalars, SCALE, HEADS)


def _softcap_problem(cap: float) -> str | None:
    compiled = attnc.load("stdlib:softcap").compiled
    return derived_value_problem(checked_value_exprs(compiled), {"cap": cap}, SCALE, HEADS)


@pytest.mark.parametrize("cap", [50.0, 1.0, 1e-3, 1e30, -30.0])
def test_ordinary_caps_pass(cap: float) -> None:
    assert _softcap_problem(cap) is None


def test_a_cap_whose_scale_is_subnormal_is_named() -> None:
    problem = _softcap_problem(1e37)
    assert problem is not None
    assert problem.startswith("cap = 1e+37, sm_scale = ")
    assert "sm_scale / cap" in problem and "below the normal range" in problem


def test_a_cap_whose_log2_factor_overflows_is_named() -> None:
    problem = _softcap_problem(3e38)
    assert problem is not None and "cap = 3e+38" in problem


@pytest.mark.parametrize("cap", [math.inf, -math.inf, math.nan])
def test_a_cap_given_as_inf_or_nan_is_taken_as_asked(cap: float) -> None:
    assert _softcap_problem(cap) is None


def test_values_of_the_request_lengths_and_of_tensors_are_not_checked() -> None:
    source = """variant v {
        param a: f32 = 1.0;
        param t: tensor<f32>[num_qo_heads];
        param b: f32 = 1.0;
        score = score * (a / kv_len) + t[qo_head] * (b * sm_scale);
    }"""
    compiled = attnc.load(source=source).compiled
    exprs = checked_value_exprs(compiled)
    assert len(exprs) == 1 and "kv_len" not in repr(exprs) and "TensorLoad" not in repr(exprs)
    assert _problem(source, a=1e-37, b=1.0) is None  # a / kv_len: a request's own value
    assert _problem(source, a=1.0, b=1e-37) is not None


def test_an_exact_zero_is_in_range() -> None:
    source = "variant v { param a: f32 = 0.0; score = score + a * sm_scale; }"
    assert _problem(source, a=0.0) is None
    problem = _problem(source, a=1e-40)  # the written product is subnormal too: refused alike
    assert problem is not None and "a * sm_scale" in problem


def test_a_derived_overflow_of_the_users_own_product_is_named() -> None:
    source = "variant v { param a: f32 = 1.0; score = score * (a * a); }"
    problem = _problem(source, a=1e20)
    assert problem is not None and "a = 1e+20" in problem and "not finite" in problem


def test_a_per_head_value_is_checked_for_every_query_head() -> None:
    """A Row field that reads the head index and scalar params (computed once per query
    head) was not checked: ``a * exp2(-4 * qo_head)`` is subnormal in float32 from head 32
    on, so 64 heads launched with the last 32 heads' factor flushed to 0. The error names
    the first such head."""
    source = "variant v { param a: f32 = 1.0; score = score * (a * exp2(-4.0 * qo_head)); }"
    exprs = checked_value_exprs(attnc.load(source=source).compiled)
    assert len(exprs) == 2 and "qo_head" in repr(exprs)  # the Row field; its exp2 factor
    assert derived_value_problem(exprs, {"a": 1.0}, SCALE, (32, 8, 128)) is None
    problem = derived_value_problem(exprs, {"a": 1.0}, SCALE, (64, 8, 128))
    assert problem is not None and problem.startswith("a = 1.0 (query head 32): ")
    assert "once per query head in float32" in problem


def test_a_per_kv_head_value_uses_the_kernels_grouping() -> None:
    """kv_head is qo_head // (H_qo / H_kv), as the functor computes it."""
    source = "variant v { param a: f32 = 1.0; score = score * (a * exp2(-8.0 * kv_head)); }"
    exprs = checked_value_exprs(attnc.load(source=source).compiled)
    assert derived_value_problem(exprs, {"a": 1.0}, SCALE, (64, 16, 128)) is None
    problem = derived_value_problem(exprs, {"a": 1.0}, SCALE, (68, 17, 128))
    assert problem is not None and "(query head 64)" in problem  # kv_head 16: 2^-128


@pytest.mark.parametrize(
    ("source", "scalars", "heads"),
    [
        (
            "variant v { param a: f32 = 1.0;"
            " score = qo_head < 8 ? score * (a * exp2(-4.0 * qo_head)) : score; }",
            {"a": 1.0},
            (64, 8, 128),
        ),
        (
            "variant v { param cap: f32 = 1.0;"
            " score = cap > 0.0 ? score * (sm_scale / cap) : score; }",
            {"cap": 0.0},
            HEADS,
        ),
    ],
    ids=["per-head", "per-request"],
)
def test_a_value_used_only_under_a_guard_is_not_checked(source, scalars, heads) -> None:
    """A value the hooks use only under a ?: branch was checked where the guard is false
    and the value unused: head 32's ``a * exp2(-4 * qo_head)`` (only heads 0-7 use it),
    ``sm_scale / cap`` with ``cap = 0`` (used only when ``cap > 0``). Both calls were
    refused; the reference gives finite output."""
    exprs = checked_value_exprs(attnc.load(source=source).compiled)
    assert exprs == ()
    assert derived_value_problem(exprs, scalars, SCALE, heads) is None


def test_prefill_run_refuses_the_call(cpu_run) -> None:  # noqa: F811
    w, recorder = _wrapper("softcap")
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    w.run(q, (k, v), cap=30.0)
    launched = len(recorder.calls)
    with pytest.raises(ValueError, match=r"variant 'softcap': cap = 1e\+38.* / cap once per"):
        w.run(q, (k, v), cap=1e38)
    assert len(recorder.calls) == launched


def test_decode_run_refuses_the_call(cpu_decode) -> None:  # noqa: F811
    w = cpu_decode("softcap")
    q, cache = _inputs()
    w.run(q, cache, cap=30.0)
    with pytest.raises(ValueError, match=r"variant 'softcap': cap = 3e\+38"):
        w.run(q, cache, cap=3e38)
    assert len(w._module.calls) == 1


def test_a_checked_key_is_remembered(monkeypatch) -> None:
    v = attnc.load("stdlib:softcap")
    v.check_derived_values({"cap": 30.0}, SCALE, HEADS)
    import attnc.codegen.derived_range as dr

    monkeypatch.setattr(dr, "derived_value_problem", lambda *a: "checked again")
    v.check_derived_values({"cap": 30.0}, SCALE, HEADS)
    with pytest.raises(ValueError, match="checked again"):
        v.check_derived_values({"cap": 31.0}, SCALE, HEADS)


def test_the_remembered_keys_are_the_most_recent(monkeypatch) -> None:
    """Past 256 remembered keys every new key was checked on each call, however often it
    recurred; the least recently checked key is now dropped instead."""
    import attnc.runtime.variant as variant_module

    monkeypatch.setattr(variant_module, "_DERIVED_CHECKS_KEPT", 4)
    v = attnc.load("stdlib:softcap")
    for cap in (1.0, 2.0, 3.0, 4.0, 1.0, 5.0):  # 1.0 used again: 2.0 is the oldest
        v.check_derived_values({"cap": cap}, SCALE, HEADS)
    assert [key[0][0][1] for key in v._derived_checked] == [3.0, 4.0, 1.0, 5.0]


def test_variants_without_derived_values_skip_the_check() -> None:
    v = attnc.load("stdlib:causal")
    assert v._derived_exprs == ()
    v.check_derived_values({}, SCALE, HEADS)
    assert not v._derived_checked  # nothing to check, nothing remembered


def test_the_prefill_op_checks_in_its_body(cpu_run, monkeypatch) -> None:  # noqa: F811
    """Under torch.compile ``run()`` sees symbols, not values; the ``attnc::prefill`` op's
    body checked nothing, so a compiled batch prefill launched cap = 3e38 (its derived
    ``1.442695 * cap`` is inf in float32). The body now refuses it, before any launch."""
    import torch

    from attnc.runtime.wrappers import prefill_launch

    w, recorder = _wrapper("softcap")
    monkeypatch.setattr(prefill_launch, "module_by_id", lambda module_id: recorder)
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)

    @torch.compile(backend="eager", fullgraph=True, dynamic=False)
    def compiled_run(q, k, v, cap):
        return w.run(q, (k, v), cap=cap)

    with pytest.raises(ValueError, match=r"variant 'softcap': cap = 3e\+38"):
        compiled_run(q, k, v, 3e38)
    assert recorder.calls == []
    compiled_run(q, k, v, 30.0)
    assert len(recorder.calls) == 1


def test_the_prefill_op_runs_after_its_variant_is_gone(cpu_run, monkeypatch) -> None:  # noqa: F811
    """A graph exported by ``torch.export`` holds the variant's handle, and may outlive the
    variant: the op then raised KeyError. It launches without the check instead, and a
    handle naming a variant of another IR is not used for the check."""
    import gc

    from attnc.runtime.variant import live_variant
    from attnc.runtime.wrappers import prefill_launch

    w, recorder = _wrapper("softcap")
    monkeypatch.setattr(prefill_launch, "module_by_id", lambda module_id: recorder)
    total_q, total_kv = _ragged_plan(w)
    q, k, v = _qkv(total_q, total_kv)
    ws, meta = w._workspace, list(w._meta)
    handle = w.variant.handle
    args = ("recorder", q, k, v, ws, meta, SCALE, [], [3e38], [], False)
    with pytest.raises(ValueError, match=r"cap = 3e\+38"):
        prefill_launch.prefill_op(handle, *args)
    del w
    gc.collect()
    assert live_variant(handle) is None
    prefill_launch.prefill_op(handle, *args)  # no variant to check with: launched as asked
    other = attnc.load("stdlib:causal")
    prefill_launch.prefill_op(other.handle, *args)  # another IR: not its check
    assert len(recorder.calls) == 2


def test_single_prefill_op_names_a_variant_that_is_gone() -> None:
    """``attnc::single_prefill`` in a graph that outlived its variant raised a bare
    ``KeyError: 7``; it names the handle and what to keep alive."""
    import gc

    import torch

    from attnc.runtime.wrappers.single_prefill import single_prefill_op

    handle = attnc.load(source="variant gone_soon { }").handle
    gc.collect()
    q = torch.zeros(2, 2, 16)
    with pytest.raises(RuntimeError, match=rf"variant handle {handle} names no live variant"):
        single_prefill_op(handle, q, q, q, None, [], [], [], False)


def test_an_affine_bias_that_overflows_times_log2e_is_refused() -> None:
    """score + b with b = 3e38 passed (the reference stays finite), while the kernels add
    b * log2(e) = inf to every key's exp2 argument: NaN or all-zero rows."""
    source = "variant v { param b: f32 = 0.0; score = score + b; }"
    for b in (3e38, -3e38):
        problem = _problem(source, b=b)
        assert problem is not None and "b * 1.44269" in problem and "not finite" in problem
    assert _problem(source, b=2e38) is None  # 2.9e38 times log2(e): finite
    assert _problem(source, b=1e-40) is None  # flushed to 0: added to a score, harmless


def test_a_bias_without_softmax_is_not_scaled_and_not_refused() -> None:
    """normalize = none adds the bias as it is (no log2(e)): b = -3e38 was refused."""
    source = "variant v { param b: f32 = 0.0; score = score + b; normalize = none; }"
    assert _problem(source, b=-3e38) is None


def test_an_affine_scale_whose_exp2_factor_overflows_is_refused() -> None:
    """score * a with a = 3e38: the kernels' a * sm_scale * log2(e) is inf (logits inf or
    NaN) while the reference stays finite; nothing was checked."""
    source = "variant v { param a: f32 = 1.0; score = score * a; }"
    problem = derived_value_problem(checked_value_exprs(attnc.load(source=source).compiled), {"a": 3e38}, 1.0, HEADS)  # fmt: skip
    assert problem is not None and "not finite" in problem
    assert _problem(source, a=1e-30) is None  # tiny: flushed, as the written form would be
