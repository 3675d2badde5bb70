"""FA4 / FLASH-backend anchors, the anchor child protocol, attnc backend columns, FA3 budget
(CPU only: no GPU, no FA4, no FlashInfer)."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from benchmarks import child_systems, fa4_anchor, flex_anchor, report, workloads
from benchmarks.outcome import Missing, Outcome, Unsupported
from benchmarks.workloads import VARIANTS, PrefillCase


def _case(key: str, q_len: int = 2048, kv_len: int = 2048, **kw) -> PrefillCase:
    return PrefillCase(VARIANTS[key], q_len, kv_len, **kw)


# ---------------------------------------------------------------- FA4 keywords per row


def test_fa4_rows_map_to_flash_attn_func_keywords():
    assert fa4_anchor.fa4_call(_case("causal")).kwargs == {"causal": True}
    soft = fa4_anchor.fa4_call(_case("softcap"))
    assert soft.kwargs == {"causal": True, "softcap": 30.0} and not soft.alibi
    window = fa4_anchor.fa4_call(_case("sliding_window"))
    # window 1024 keeps q_pos - kv_idx < 1024: FA4's left window is 1023, right 0, causal
    assert window.kwargs == {"causal": True, "window_size": (1023, 0)}
    alibi = fa4_anchor.fa4_call(_case("alibi"))
    assert alibi.alibi and alibi.kwargs == {"causal": True, "pack_gqa": False}
    full = fa4_anchor.fa4_call(_case("sigmoid"))
    assert full.stand_in and full.kwargs == {"causal": False} and "not compared" in full.note


def test_fa4_cannot_express_prefix_lm():
    with pytest.raises(Unsupported, match="mask_mod"):
        fa4_anchor.fa4_call(_case("prefix_lm"))


def test_fa4_and_flash_cover_every_prefill_row_but_the_listed_ones():
    """Every full-profile row gets a call or an Unsupported, never another exception."""
    fa4_rows, flash_rows = set(), set()
    for case in workloads.prefill_cases(full=True):
        try:
            fa4_anchor.fa4_call(case)
            fa4_rows.add(case.variant.stdlib)
        except Unsupported:
            pass
        try:
            flex_anchor.flash_backend_call(case)
            flash_rows.add(case.variant.stdlib)
        except Unsupported:
            pass
    assert fa4_rows == {"causal", "softcap", "alibi", "sliding_window", "sigmoid"}
    assert flash_rows == {"causal", "softcap", "alibi", "sliding_window", "prefix_lm"}


def _fa4_reference(q, k, v, call, num_heads, offset):
    """float64 attention with FA4's semantics for a call (q/k/v [L, H, D], bottom-right)."""
    import math

    import torch

    q_len, kv_len, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / math.sqrt(q.shape[-1])
    q_idx = torch.arange(q_len)[:, None]
    kv_idx = torch.arange(kv_len)[None, :]
    kw = call.kwargs
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    if call.alibi:  # what alibi_score_mod computes: 2^(-8 (h + 1) / H) * (kv - q - offset)
        slopes = torch.pow(2.0, -8.0 * torch.arange(1, num_heads + 1).double() / num_heads)
        s = s + slopes[:, None, None] * (kv_idx - q_idx - offset)
    keep = torch.ones(q_len, kv_len, dtype=torch.bool)
    if kw.get("causal"):  # FA's causal and windows are bottom-right aligned
        keep &= kv_idx <= q_idx + offset
    if "window_size" in kw:
        left, right = kw["window_size"]
        keep &= (kv_idx >= q_idx + offset - left) & (kv_idx <= q_idx + offset + right)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)


@pytest.mark.parametrize("key", ["causal", "softcap", "alibi", "sliding_window"])
@pytest.mark.parametrize("shape", [(37, 37), (9, 40)])
def test_fa4_semantics_match_the_benchmark_reference(key, shape):
    """The keywords FA4 gets compute the row's function (fp64 on small shapes)."""
    import torch

    from benchmarks.inputs import variant_params
    from benchmarks.workloads import Mask, VariantSpec
    from tests.unit.test_benchmarks_workloads import _reference_attention

    variant = VARIANTS[key]
    if key == "sliding_window":  # a window narrower than the shape, so it cuts
        variant = VariantSpec("w", "sliding_window", Mask("window", window=5), (("window", 5),))
    q_len, kv_len = shape
    case = PrefillCase(variant, q_len, kv_len, num_qo_heads=4, num_kv_heads=2, head_dim=8)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(q_len, 4, 8, generator=gen)
    k, v = (torch.randn(kv_len, 2, 8, generator=gen) for _ in range(2))
    params = variant_params(variant, 4, device="cpu")
    call = fa4_anchor.fa4_call(case)
    got = _fa4_reference(q, k, v, call, 4, kv_len - q_len)
    want = _reference_attention(q, k, v, variant, params)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


# ---------------------------------------------------------------- child protocol


def test_case_round_trips_through_json():
    import json

    from benchmarks.child_server import case_from_dict, case_to_dict

    for case in workloads.prefill_cases(full=True):
        back = case_from_dict(json.loads(json.dumps(case_to_dict(case))))
        assert back == case and back.name == case.name


def test_reply_lines_are_found_among_library_output():
    prefix = "@@x "
    assert child_systems.reply_from_line('noise @@x {"a": 1}\n', prefix) == {"a": 1}
    assert child_systems.reply_from_line("warning: something\n", prefix) is None
    assert child_systems.reply_from_line("@@x not json\n", prefix) is None


def test_child_env_puts_fa4_first_and_keeps_the_rest():
    env = {"ATTNC_FA4_PYTHONPATH": "/fa4:/fa4/dsl", "PYTHONPATH": "/tmp/site:/repo", "X": "1"}
    out = child_systems.child_env(env)
    parts = out["PYTHONPATH"].split(os.pathsep)
    assert parts[:2] == ["/fa4", "/fa4/dsl"] and parts[2] == child_systems.REPO_ROOT
    assert "/tmp/site" in parts and out["X"] == "1"
    assert child_systems.fa4_paths({}) == []


def test_fa4_versions_come_from_dist_info(tmp_path):
    (tmp_path / "flash_attn_4-4.0.0b36.dist-info").mkdir()
    (tmp_path / "nvidia_cutlass_dsl-4.8.1.dist-info").mkdir()
    env = {"ATTNC_FA4_PYTHONPATH": f"{tmp_path}:/nonexistent"}
    assert child_systems.fa4_versions(env) == "flash_attn_4 4.0.0b36, nvidia_cutlass_dsl 4.8.1"
    assert child_systems.fa4_versions({}) == ""


def test_fa4_absent_looks_for_the_interface_file(tmp_path):
    env = {"ATTNC_FA4_PYTHONPATH": str(tmp_path)}
    assert "ATTNC_FA4_PYTHONPATH" in child_systems.fa4_absent(env, search=[])
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "interface.py").write_text("")
    assert child_systems.fa4_absent(env, search=[]) == ""


FAKE_CHILD = textwrap.dedent(
    """
    import json, sys, time
    P = "@@bench-child "
    mode = sys.argv[1]
    print("library noise", flush=True)
    if mode == "crash_at_start":
        sys.exit(7)
    print(P + json.dumps({"ready": True, "missing": "no FA4 here" if mode == "missing" else ""}),
          flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if mode == "hang":
            time.sleep(60)
        if mode == "crash":
            sys.exit(9)
        if req["case"]["variant"]["stdlib"] == "sigmoid":
            print(P + json.dumps({"status": "error", "note": "TypeError: bad"}), flush=True)
            continue
        import torch
        torch.save(torch.full((3, 2), 2.0), req["out"])
        print("partial" + P + json.dumps({"status": "ok", "ms": 0.5, "note": "n",
                                          "compare": False}), flush=True)
    """
)


@pytest.fixture
def fake_child(tmp_path, monkeypatch):
    """ChildPrefill talking to a stand-in child (same protocol), FA4 'installed'."""
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "interface.py").write_text("")
    monkeypatch.setenv("ATTNC_FA4_PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(child_systems, "START_TIMEOUT_S", 60.0)
    monkeypatch.setattr("torch.load", _cpu_load(__import__("torch").load))

    def use(mode: str) -> child_systems.AnchorChild:
        child = child_systems.AnchorChild(cmd=[sys.executable, str(script), mode])
        monkeypatch.setattr(child_systems, "_CHILD", [child])
        return child

    yield use
    for child in child_systems._CHILD:
        child.stop()


def _cpu_load(load):
    def cpu(path, map_location=None):
        return load(path, map_location="cpu")

    return cpu


def test_child_anchor_ok_reply_carries_time_output_and_stand_in(fake_child):
    child = fake_child("ok")
    prep = child_systems.ChildPrefill("fa4", rep=5).prepare(_case("causal"), None)
    assert prep.timed_ms == 0.5 and prep.note == "n" and not prep.compare
    assert prep.run().tolist() == [[2.0, 2.0]] * 3
    again = child_systems.ChildPrefill("flex_flash", rep=5).prepare(_case("softcap"), None)
    assert again.timed_ms == 0.5 and child.starts == 1  # one child for the whole run


def test_child_anchor_failures_become_cells(fake_child):
    from benchmarks.outcome import from_exception

    fake_child("ok")
    fa4 = child_systems.ChildPrefill("fa4", rep=5)
    with pytest.raises(Unsupported):  # decided here, without asking the child
        fa4.prepare(_case("prefix_lm"), None)
    flash = child_systems.ChildPrefill("flex_flash", rep=5)
    with pytest.raises(Exception) as err:
        flash.prepare(_case("sigmoid"), None)
    assert from_exception(err.value).status == "n/a"
    fake_child("missing")
    with pytest.raises(Missing, match="no FA4 here"):
        fa4.prepare(_case("causal"), None)


def test_child_crash_and_timeout_are_contained(fake_child, monkeypatch):
    from benchmarks.outcome import from_exception

    fake_child("crash")
    fa4 = child_systems.ChildPrefill("fa4", rep=5)
    with pytest.raises(RuntimeError, match="exited with code 9"):
        fa4.prepare(_case("causal"), None)
    child = fake_child("hang")
    monkeypatch.setattr(child_systems.ChildPrefill, "timeout", lambda self: 1.0)
    with pytest.raises(TimeoutError) as err:
        fa4.prepare(_case("causal"), None)
    assert from_exception(err.value).status == "error" and child.proc is None
    child = fake_child("crash_at_start")
    for _ in range(child_systems.MAX_STARTS):
        with pytest.raises(RuntimeError):
            fa4.prepare(_case("causal"), None)
    with pytest.raises(Missing, match="failed 2 times"):
        fa4.prepare(_case("causal"), None)


def test_child_error_reply_keeps_the_child_reason(fake_child):
    from benchmarks.outcome import from_exception

    fake_child("ok")
    flash = child_systems.ChildPrefill("fa4", rep=5)
    with pytest.raises(Exception) as err:
        flash.prepare(_case("sigmoid"), None)
    assert from_exception(err.value) == Outcome("error", note="TypeError: bad")


def test_child_anchor_without_fa4_is_missing_without_a_child(monkeypatch):
    monkeypatch.delenv("ATTNC_FA4_PYTHONPATH", raising=False)
    monkeypatch.setattr(child_systems, "fa4_absent", lambda: "flash-attn-4 not found")
    monkeypatch.setattr(child_systems, "_CHILD", [])
    with pytest.raises(Missing, match="not found"):
        child_systems.ChildPrefill("fa4", rep=5).prepare(_case("causal"), None)
    assert child_systems._CHILD == []


def test_child_server_measures_with_the_parents_inputs(monkeypatch, tmp_path):
    """The child's measure(): one system, every input set, output saved, time replied."""
    import torch

    from benchmarks import child_server, inputs, timing
    from benchmarks.child_server import case_to_dict
    from benchmarks.system import Prepared

    seen = []

    class Fake:
        def prepare(self, case, data):
            seen.append(data)
            return Prepared(lambda: torch.ones(2, 2) * data, note="x", compare=True)

    monkeypatch.setattr(child_server, "make_system", lambda name, autotune=False: Fake())
    monkeypatch.setattr(inputs, "make_prefill_sets", lambda case: [1.0, 2.0, 3.0])
    monkeypatch.setattr(timing, "bench_ms", lambda fns, graph=False, rep=100: (0.25, ""))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    path = str(tmp_path / "out.pt")
    req = {"system": "fa4", "case": case_to_dict(_case("causal")), "rep": 5, "out": path}
    reply = child_server.measure(req)
    assert reply == {"status": "ok", "ms": 0.25, "note": "x", "compare": True}
    assert seen == [1.0, 2.0, 3.0] and torch.load(path).tolist() == [[1.0, 1.0]] * 2

    def broken(self, case, data):
        raise Unsupported("not expressible")

    Fake.prepare = broken  # type: ignore[method-assign]
    assert child_server.measure(req) == {"status": "n/a", "note": "not expressible"}


# ---------------------------------------------------------------- stand-ins and timed_elsewhere


class _Sys:
    graph = False

    def __init__(self, name, out, *, compare=True, timed_ms=None, is_attnc=False):
        self.name, self.out, self.compare, self.timed_ms = name, out, compare, timed_ms
        self.is_attnc = is_attnc
        self.timed_elsewhere = timed_ms is not None
        self.prepared_sets = 0

    def prepare(self, case, data):
        from benchmarks.system import Prepared

        self.prepared_sets += 1
        return Prepared(lambda: self.out, compare=self.compare, timed_ms=self.timed_ms)


def test_stand_in_is_timed_not_compared_and_child_time_is_used(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (2.0, ""))
    ref = torch.randn(16, 4)
    stand_in = _Sys("fa4", ref * 5, compare=False, timed_ms=1.0)
    systems = [stand_in, _Sys("attnc", ref, is_attnc=True)]
    monkeypatch.setattr(systems[1], "self_check", lambda c, d, o: 0.0, raising=False)
    out = measure.measure_case(None, systems, [None, None, None], 4e12, log=lambda _: None)
    assert out["fa4"].status == "ok" and out["fa4"].value == pytest.approx(4000.0)
    assert out["fa4"].rel_err is None and stand_in.prepared_sets == 1
    assert out["attnc"].status == "ok" and out["attnc"].note == "vs eager reference, last rows"


def test_two_attnc_templates_without_anchor_check_the_first_against_eager(monkeypatch):
    import torch

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "bench_ms", lambda fns, graph=False, rep=100: (2.0, ""))
    ref = torch.randn(16, 4)
    fa2, sm90 = _Sys("attnc-fa2", ref, is_attnc=True), _Sys("attnc-sm90", ref + 1, is_attnc=True)
    fa2.self_check = lambda c, d, o: 1e-3  # type: ignore[attr-defined]
    out = measure.measure_case(None, [fa2, sm90], [None], 4e12, log=lambda _: None)
    assert out["attnc-fa2"].status == "ok" and "eager" in out["attnc-fa2"].note
    assert out["attnc-sm90"].status == "mismatch" and "attnc-fa2" in out["attnc-sm90"].note


# ---------------------------------------------------------------- attnc backends


def test_backend_detection_needs_a_named_parameter():
    from benchmarks.attnc_systems import takes_backend

    def named(q, k, v, *, backend="fa2", **params): ...

    def kwargs_only(q, k, v, **params): ...

    class Wrapper:
        def __init__(self, variant, workspace, kv_layout="NHD", backend=None): ...

    assert takes_backend(named) and takes_backend(Wrapper)
    assert not takes_backend(kwargs_only) and not takes_backend(42)


def test_prefill_lists_show_one_attnc_system_per_backend(monkeypatch):
    from benchmarks import attnc_systems, suites
    from benchmarks.cli import parse_args

    args = parse_args([])
    monkeypatch.setattr(attnc_systems, "prefill_backends", lambda batch=False: ("fa2", "sm90"))
    names = [s.name for s in suites.prefill_systems(args)]
    assert names == [
        "flashinfer_fa3", "flashinfer_fa2", "fa4", "flex", "flex_flash", "sdpa_cudnn",
        "sdpa_flash", "attnc-fa2", "attnc-sm90",
    ]  # fmt: skip
    batch = [s.name for s in suites.batch_prefill_systems(args)]
    assert batch == ["flashinfer_fa3", "flashinfer_fa2", "attnc-fa2", "attnc-sm90"]
    monkeypatch.setattr(attnc_systems, "prefill_backends", lambda batch=False: (None,))
    assert [s.name for s in suites.prefill_systems(args)][-1] == "attnc"


def test_attnc_backend_reaches_prefill_and_wrapper(monkeypatch):
    import types

    from benchmarks import attnc_systems

    calls = []
    variant = types.SimpleNamespace(prefill=lambda q, k, v, **kw: calls.append(kw) or "out")
    monkeypatch.setattr(attnc_systems, "load_variant", lambda name: variant)
    data = types.SimpleNamespace(q=1, k=2, v=3, params={"cap": 30.0})
    for backend, want in (("sm90", {"cap": 30.0, "backend": "sm90"}), (None, {"cap": 30.0})):
        prep = attnc_systems.AttncPrefill(backend).prepare(_case("softcap"), data)
        assert prep.run() == "out" and calls[-1] == want


def test_this_runtime_is_detected_without_error():
    from benchmarks.attnc_systems import prefill_backends

    for batch in (False, True):
        assert prefill_backends(batch) in (("fa2", "sm90"), (None,))


def test_report_with_two_attnc_columns():
    def ok(v):
        return Outcome("ok", value=v).to_dict()

    row = {
        "case": "causal, L=8192",
        "unit": "TFLOP/s",
        "higher_is_better": True,
        "systems": {"fa4": ok(700.0), "attnc-fa2": ok(350.0), "attnc-sm90": ok(735.0)},
    }
    assert report.columns([row]) == ["attnc-fa2", "attnc-sm90", "fa4"]
    assert report.best_anchor(row) == ("fa4", 700.0)
    assert report.ratio_cells(row, {"matmul_tflops": 700.0}) == (
        "fa2 0.50x fa4; sm90 1.05x fa4",
        "fa2 50%; sm90 105%",
    )
    text = report.render_suite("prefill", [row], {})
    assert "| attnc-fa2 | attnc-sm90 | fa4 |" in text


# ---------------------------------------------------------------- FA3 in the budget


def test_jit_builds_skip_a_build_that_does_not_fit():
    from benchmarks.budget import JitBuilds

    builds = JitBuilds(50.0, "FlashInfer FA3")
    builds.admit("causal", None)  # no limit
    builds.admit("softcap", 61.0)
    with pytest.raises(Missing, match="~50 s.*40 s left"):
        builds.admit("window", 40.0)
    builds.admit("softcap", 1.0)  # built before: no new build
    with pytest.raises(Missing, match="0 s left"):
        builds.admit("alibi", -5.0)


def test_flashinfer_fa3_asks_the_suite_clock(monkeypatch):
    import types

    from benchmarks import flashinfer_anchor
    from benchmarks.budget import JitBuilds

    monkeypatch.setattr(flashinfer_anchor, "FA3_BUILDS", JitBuilds(50.0, "FlashInfer FA3"))
    monkeypatch.setattr(flashinfer_anchor, "flashinfer", lambda: types.SimpleNamespace())
    late = flashinfer_anchor.FlashInferSingle("fa3", lambda: 10.0)
    with pytest.raises(Missing, match="does not fit"):
        late.prepare(_case("causal"), None)
    fa2 = flashinfer_anchor.FlashInferSingle("fa2", lambda: 10.0)
    assert fa2.prepare(_case("causal"), None).run is not None  # FA2 is not held back
    keys = {
        flashinfer_anchor.module_key("single", 128, flashinfer_anchor.variant_kwargs(v, "fa3"))
        for v in (VARIANTS["causal"], VARIANTS["softcap"], VARIANTS["sliding_window"])
    }
    assert len(keys) == 3


def test_real_child_server_answers_missing_without_cuda_or_fa4(tmp_path, monkeypatch):
    """``python -m benchmarks.child_server`` starts, says why FA4 cannot run here (no CUDA or
    no flash_attn on this machine) and the anchor shows that reason."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine could run FA4; the check is for CPU-only hosts")
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "interface.py").write_text("")
    monkeypatch.setenv("ATTNC_FA4_PYTHONPATH", str(tmp_path))
    child = child_systems.AnchorChild()
    monkeypatch.setattr(child_systems, "_CHILD", [child])
    try:
        with pytest.raises(Missing, match="flash-attn-4 not importable"):
            child_systems.ChildPrefill("fa4", rep=5).prepare(_case("causal"), None)
        assert child.proc is None  # stopped once it said FA4 is missing
        with pytest.raises(Missing, match="not importable"):
            child_systems.ChildPrefill("flex_flash", rep=5).prepare(_case("alibi"), None)
        assert child.starts == 1
    finally:
        child.stop()


ALIBI_KERNEL = textwrap.dedent(
    """
    import cutlass
    import cutlass.cute as cute

    from benchmarks.fa4_anchor import alibi_score_mod

    HEADS, HEAD, Q_IDX, KV_IDX, OFFSET, SCORE = 32, 3, 5, 2, 7, 1.5
    MOD = alibi_score_mod(HEADS, OFFSET)


    @cute.jit
    def filled(dtype: cutlass.Constexpr, value: cutlass.Constexpr):
        frag = cute.make_rmem_tensor(4, dtype)
        frag.fill(value)
        return frag.load()


    @cute.kernel
    def kernel(out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        i32 = cutlass.Int32
        got = MOD(
            filled(cutlass.Float32, SCORE), filled(i32, 0), filled(i32, HEAD),
            q_idx=filled(i32, Q_IDX), kv_idx=filled(i32, KV_IDX), seqlen_info=None,
            aux_tensors=(),
        )
        res = cute.make_rmem_tensor(4, cutlass.Float32)
        res.store(got)
        out[tidx] = res[0]


    @cute.jit
    def host(out: cute.Tensor):
        kernel(out).launch(grid=[1, 1, 1], block=[32, 1, 1])


    def build():
        cute.compile(host, cute.runtime.make_fake_compact_tensor(cutlass.Float32, (32,)))
    """
)


def test_fa4_alibi_score_mod_compiles_to_the_alibi_bias(tmp_path, monkeypatch):
    """With the CuTe DSL importable (no GPU needed), compile a kernel applying the ALiBi
    score_mod to constants for sm_90a and read the folded result from its PTX."""
    import importlib
    import re
    import struct

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_DSL_KEEP", "ptx")
    monkeypatch.setenv("CUTE_DSL_DUMP_DIR", str(tmp_path))
    pytest.importorskip("cutlass.cute")
    (tmp_path / "fa4_alibi_kernel.py").write_text(ALIBI_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    kern = importlib.import_module("fa4_alibi_kernel")
    assert fa4_anchor.alibi_score_mod(kern.HEADS, kern.OFFSET) is kern.MOD
    kern.build()
    ptx = "".join(p.read_text() for p in tmp_path.rglob("*.ptx"))
    stored = re.findall(r"st\.global\.b32\s+\[[^\]]+\],\s*(-?\d+);", ptx)
    assert len(stored) == 1
    value = struct.unpack("<f", struct.pack("<i", int(stored[0])))[0]
    slope = 2.0 ** (-8.0 * (kern.HEAD + 1) / kern.HEADS)
    want = kern.SCORE + slope * (kern.KV_IDX - kern.Q_IDX - kern.OFFSET)
    assert value == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("key", ["alibi", "sigmoid", "sliding_window"])
def test_fa4_call_compiles_for_sm90_on_fake_tensors(key, monkeypatch):
    """With flash-attn-4 and the CuTe DSL importable (no GPU needed), the call FA4 gets for
    a row compiles FA4's whole sm90 forward kernel: under FakeTensorMode FA4 compiles and
    skips the launch."""
    import types

    import torch

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    try:
        import triton  # noqa: F401  (quack's autotuner imports it; only the import is needed)
    except ImportError:
        stub = types.ModuleType("quack.autotuner")
        stub.autotune = lambda *a, **k: lambda f: f  # type: ignore[attr-defined]
        stub.AutotuneConfig = type(  # type: ignore[attr-defined]
            "AutotuneConfig", (), {"__init__": lambda self, *a, **k: None}
        )
        monkeypatch.setitem(sys.modules, "quack.autotuner", stub)
    interface = pytest.importorskip("flash_attn.cute.interface")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from benchmarks.inputs import DenseData

    monkeypatch.setattr(interface, "_get_device_arch", lambda: 90)
    monkeypatch.setattr(interface, "get_num_sms_for_selection", lambda *a, **k: 132)
    case = _case(key, 1024, 1024)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(1024, 32, 128, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.empty(1024, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in "kv")
        prep = fa4_anchor.Fa4Prefill().prepare(case, DenseData(q, k, v, {}))
        out = prep.run()
    assert tuple(out.shape) == (1, 1024, 32, 128)
    assert prep.compare == (key != "sigmoid")
