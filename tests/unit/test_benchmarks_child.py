"""The anchor child: protocol, environment, failures contained, the real server without
FA4 (CPU only)."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from benchmarks import child_systems, workloads
from benchmarks.outcome import Missing, Outcome, Unsupported
from benchmarks.system import Prepared
from benchmarks.workloads import VARIANTS, PrefillCase


def _case(key: str, q_len: int = 2048, kv_len: int = 2048, **kw) -> PrefillCase:
    return PrefillCase(VARIANTS[key], q_len, kv_len, **kw)


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
        if req.get("retime"):
            ok = "out" not in req and req["system"] == "fa4"
            print(P + json.dumps({"status": "ok", "ms": 0.75} if ok else
                                 {"status": "error", "note": "ValueError: not held"}), flush=True)
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


def test_child_anchor_retimes_the_row_it_holds(fake_child):
    """retime() sends the same request without ``out`` and with ``retime``; the child's new
    median comes back, and a child error becomes the round's exception."""
    from benchmarks.outcome import Failed

    fake_child("ok")
    prep = child_systems.ChildPrefill("fa4", rep=5).prepare(_case("causal"), None)
    assert prep.timed_ms == 0.5 and prep.retime is not None and prep.retime() == (0.75, "")
    other = child_systems.ChildPrefill("flex_flash", rep=5).prepare(_case("causal"), None)
    with pytest.raises(Failed, match="not held"):
        other.retime()


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
    assert reply == {"status": "ok", "ms": 0.25, "note": "x", "timing_note": "", "compare": True}
    assert seen == [1.0, 2.0, 3.0] and torch.load(path).tolist() == [[1.0, 1.0]] * 2

    def broken(self, case, data):
        raise Unsupported("not expressible")

    Fake.prepare = broken  # type: ignore[method-assign]
    assert child_server.measure(req) == {"status": "n/a", "note": "not expressible"}


def test_child_server_retimes_the_kept_row_and_drops_it_for_another(monkeypatch, tmp_path):
    """A retime of the row just prepared times its kept sets again (no new inputs, no output
    file); a retime of another row is an error naming it; a new row replaces the kept one."""
    import torch

    from benchmarks import child_server, inputs, timing
    from benchmarks.child_server import case_to_dict

    made = []

    class Fake:
        def prepare(self, case, data):
            made.append(data)
            return Prepared(lambda: torch.ones(2, 2), compare=True)

    benches = iter([(0.5, ""), (0.25, ""), (0.125, "")])
    monkeypatch.setattr(child_server, "make_system", lambda name, autotune=False: Fake())
    monkeypatch.setattr(inputs, "make_prefill_sets", lambda case: [1.0, 2.0])
    monkeypatch.setattr(timing, "bench_ms", lambda fns, graph=False, rep=100: next(benches))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(child_server, "_KEPT", {"case": "", "systems": {}})
    path = str(tmp_path / "out.pt")
    row = {"system": "fa4", "case": case_to_dict(_case("causal")), "rep": 5}
    assert child_server.measure({**row, "out": path})["ms"] == 0.5
    assert child_server.measure({**row, "retime": True})["ms"] == 0.25
    assert made == [1.0, 2.0]  # the retime made no new sets
    other = {**row, "case": case_to_dict(_case("softcap")), "retime": True}
    reply = child_server.measure(other)
    assert reply["status"] == "error" and "does not hold 'fa4' on this row" in reply["note"]
    assert child_server.measure({**row, "out": path})["ms"] == 0.125
    assert made == [1.0, 2.0, 1.0, 2.0]


def test_child_server_keeps_both_child_systems_of_a_row(monkeypatch, tmp_path):
    """fa4 and flex_flash prepared on one row can both be timed again, in either order; a
    request for the next row drops both."""
    import torch

    from benchmarks import child_server, inputs, timing
    from benchmarks.child_server import case_to_dict

    made = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def prepare(self, case, data):
            made.append(self.name)
            return Prepared(lambda: torch.ones(2, 2), note=self.name, compare=True)

    monkeypatch.setattr(child_server, "make_system", lambda name, autotune=False: Fake(name))
    monkeypatch.setattr(inputs, "make_prefill_sets", lambda case: [1.0])
    monkeypatch.setattr(timing, "bench_ms", lambda fns, graph=False, rep=100: (0.5, ""))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(child_server, "_KEPT", {"case": "", "systems": {}})
    path = str(tmp_path / "out.pt")
    causal = case_to_dict(_case("causal"))
    for name in ("fa4", "flex_flash"):
        reply = child_server.measure({"system": name, "case": causal, "rep": 5, "out": path})
        assert reply["status"] == "ok"
    for name in ("fa4", "flex_flash", "fa4"):
        again = child_server.measure({"system": name, "case": causal, "rep": 5, "retime": True})
        assert again == {
            "status": "ok",
            "ms": 0.5,
            "note": name,
            "timing_note": "",
            "compare": True,
        }
    assert made == ["fa4", "flex_flash"]
    softcap = case_to_dict(_case("softcap"))
    child_server.measure({"system": "flex_flash", "case": softcap, "rep": 5, "out": path})
    stale = child_server.measure({"system": "fa4", "case": causal, "rep": 5, "retime": True})
    assert stale["status"] == "error" and "does not hold 'fa4'" in stale["note"]


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


def test_prefill_suite_starts_the_child_early_and_always_stops_it(monkeypatch):
    from benchmarks import suites
    from benchmarks.cli import parse_args

    calls = []
    monkeypatch.setattr(child_systems, "warm_up", lambda: calls.append("up"))
    monkeypatch.setattr(child_systems, "shut_down", lambda: calls.append("down"))

    def rows(*args, **kwargs):
        calls.append("rows")
        raise RuntimeError("a row failed")

    monkeypatch.setattr(suites, "run_rows", rows)
    with pytest.raises(RuntimeError):
        suites.run_prefill(parse_args(["--suite", "prefill"]), None, log=lambda _: None)
    assert calls == ["up", "rows", "down"]
    calls.clear()
    with pytest.raises(RuntimeError):
        args = parse_args(["--suite", "prefill", "--skip", "fa4,flex_flash"])
        suites.run_prefill(args, None, log=lambda _: None)
    assert calls == ["rows", "down"]  # both child anchors skipped: no child


class _InProcessChild:
    """The anchor child's protocol answered by ``child_server.measure`` in this process."""

    def request(self, payload: dict, timeout: float) -> dict:
        from benchmarks import child_server

        return child_server.measure(payload)


def test_a_child_systems_note_shows_once_in_its_outcome(monkeypatch):
    """The child's reply keeps the system's note apart from the timing's, so the row's cell
    says "score_mod, pack_gqa off" once however many rounds retime it."""
    import torch

    from benchmarks import child_server, inputs, measure, timing

    class Fake:
        def prepare(self, case, data):
            return Prepared(lambda: torch.ones(2, 2), note="score_mod, pack_gqa off")

    monkeypatch.setattr(child_server, "make_system", lambda name, autotune=False: Fake())
    monkeypatch.setattr(child_server, "_KEPT", {"case": "", "systems": {}})
    monkeypatch.setattr(inputs, "make_prefill_sets", lambda case: [1.0])
    monkeypatch.setattr(timing, "bench_ms", lambda fns, graph=False, rep=100: (0.5, ""))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr("torch.load", _cpu_load(torch.load))
    monkeypatch.setattr(child_systems, "fa4_absent", lambda: "")
    monkeypatch.setattr(child_systems, "anchor_child", lambda: _InProcessChild())
    system = child_systems.ChildPrefill("fa4", rep=5)
    case = _case("alibi")
    out = measure.measure_case(case, [system], [None], 1e9, rounds=2, log=lambda _: None)
    assert out["fa4"].status == "ok"
    assert out["fa4"].note.split("; ").count("score_mod, pack_gqa off") == 1
