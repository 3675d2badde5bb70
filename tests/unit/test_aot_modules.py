"""What `attnc build` builds per arch and kind (no nvcc): the same module specs the runtime
asks for, the Hopper prefill only for 90a and only when the template is there, and clear
errors for bad --dtype/--head-dim/--kind."""

from __future__ import annotations

import pytest

import attnc
from attnc.runtime.build import aot, modules


@pytest.fixture(scope="module")
def causal():
    return attnc.load("stdlib:causal").compiled


def _names(mods):
    return [(m.kind, m.spec.name) for m in mods]


def test_sm80_builds_fa2_prefill_and_decode_per_dtype_and_head_dim(causal):
    mods = aot.deployment_modules([causal], "80", ("bfloat16", "float16"), (64, 128))
    assert _names(mods) == [
        ("prefill", "causal_bf16_d64"),
        ("prefill", "causal_bf16_d128"),
        ("prefill", "causal_fp16_d64"),
        ("prefill", "causal_fp16_d128"),
        ("decode", "causal_decode_bf16_d64"),
        ("decode", "causal_decode_bf16_d128"),
        ("decode", "causal_decode_fp16_d64"),
        ("decode", "causal_decode_fp16_d128"),
        ("decode_planner", "decode_plan"),
        ("prefill_planner", "prefill_plan"),
        ("merge_state", "merge_state"),
    ]
    assert [m.arch for m in mods[-3:]] == ["80", "80", "80"]
    planners = ("decode_planner", "prefill_planner")
    assert all(m.spec.extra_flags == () for m in mods if m.kind not in planners)


def test_specs_are_what_the_runtime_builds(causal, monkeypatch):
    from attnc.runtime.build import jit
    from attnc.runtime.planning import decode_plan_library
    from attnc.runtime.wrappers import merge

    mod, planner = aot.deployment_modules([causal], "90a", ("bfloat16",), (128,), "decode")
    assert mod.spec == modules.DECODE_MODULES.spec(causal.variant, "bfloat16", 128, "90a")
    asked = []

    def record(name, source, *, arch=None, extra_flags=()):
        asked.append((jit.ModuleSpec(name, source, tuple(extra_flags)), arch))
        raise RuntimeError("recorded")

    monkeypatch.setattr(jit, "build_module", record)
    with pytest.raises(RuntimeError, match="recorded"):
        decode_plan_library._load()
    with pytest.raises(RuntimeError, match="recorded"):
        merge._library("90a")
    merge_state = aot.shared_modules("90a", "all")[-1]
    assert asked == [(planner.spec, planner.arch), (merge_state.spec, "90a")]
    (fa2,) = [
        m
        for m in aot.deployment_modules([causal], "90a", ("bfloat16",), (128,))
        if m.kind == "prefill"
    ]
    assert fa2.spec.extra_flags == modules.prefill_arch_flags("90a")


def test_sm90a_adds_the_hopper_prefill_when_available(causal, monkeypatch):
    monkeypatch.setattr(modules, "sm90_prefill_available", lambda: True)
    monkeypatch.setattr(modules, "_render_prefill_sm90", lambda ir, dtype, d: "// hopper\n")
    mods = aot.deployment_modules([causal], "90a", ("bfloat16",), (128,), "prefill")
    assert _names(mods) == [
        ("prefill", "causal_bf16_d128"),
        ("prefill_sm90", "causal_sm90_bf16_d128"),
        ("prefill_planner", "prefill_plan"),
    ]
    sm80 = aot.deployment_modules([causal], "80", ("bfloat16",), (128,), "prefill")
    assert _names(sm80) == [("prefill", "causal_bf16_d128"), ("prefill_planner", "prefill_plan")]


def test_sm90a_without_the_hopper_template_says_so(causal, monkeypatch):
    monkeypatch.setattr(modules, "sm90_prefill_available", lambda: False)
    built = []
    monkeypatch.setattr(
        aot.jit, "build_modules", lambda specs, **kw: built.extend(specs) or ["x"] * len(specs)
    )
    lines: list[str] = []
    aot.build_deployment(
        [causal], "sm_90a", ("bfloat16",), (128,), "prefill", progress=lines.append
    )
    assert [s.name for s in built] == ["causal_bf16_d128", "prefill_plan"]
    assert "no Hopper prefill template" in lines[0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: aot.parse_dtypes("bf32"), "--dtype"),
        (lambda: aot.parse_dtypes(""), "--dtype"),
        (lambda: aot.parse_head_dims("96"), "--head-dim"),
        (lambda: aot.parse_head_dims("x"), "--head-dim"),
        (lambda: aot.parse_head_dims("128,,64"), "--head-dim"),  # was read as 128,64
        (lambda: aot.parse_head_dims("128,"), "--head-dim"),
        (lambda: aot.parse_dtypes("bf16,,fp16"), "--dtype"),
    ],
)
def test_bad_choices(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_parse_lists():
    assert aot.parse_dtypes("bf16,fp16,bf16") == ("bfloat16", "float16")
    assert aot.parse_head_dims("64, 256") == (64, 256)


def test_bad_kind(causal):
    with pytest.raises(ValueError, match="--kind"):
        aot.deployment_modules([causal], "80", ("bfloat16",), (128,), "both")


@pytest.mark.parametrize("call", [lambda: aot.parse_dtypes("bf\x1b[31m"),
                                  lambda: aot.parse_head_dims("6\x1b[31m4")])  # fmt: skip
def test_bad_choices_are_echoed_escaped(call):
    with pytest.raises(ValueError) as err:
        call()
    assert "\x1b" not in str(err.value) and "\\x1b" in str(err.value)


@pytest.mark.parametrize("arch", ["75", (7, 5), "sm_70", "abc", "9.x", "", "8\x1b0", "90a;x"])
def test_an_arch_older_than_sm80_or_not_an_arch_is_refused_before_nvcc(arch, causal):
    from attnc.runtime.build import toolchain

    with pytest.raises(toolchain.UnsupportedArch, match="sm_80 and newer") as err:
        aot.build_deployment([causal], arch, ("bfloat16",), (128,))
    assert "\x1b" not in str(err.value)
