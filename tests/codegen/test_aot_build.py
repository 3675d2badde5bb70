"""`attnc build`: modules built ahead of time for an arch, without a GPU, are found by a later
load that cannot run nvcc (ATTNC_NVCC=/bin/false)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnc import cli

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

# Header digests are frozen at the start of the test in both processes, so that kernel headers
# edited while it runs (a working tree shared with other work) cannot change the cache keys.
_FREEZE = """
import json, sys
from pathlib import Path
from attnc.runtime.build import cache
_frozen = json.loads(sys.argv[1])
cache.header_digest = lambda include_dir=cache.INCLUDE_DIR: _frozen[str(Path(include_dir))]
"""

_LOAD_WITHOUT_NVCC = (
    _FREEZE
    + """
import attnc
from attnc.runtime.build.modules import get_decode_module, get_prefill_module
from attnc.runtime.planning import decode_plan_library, prefill_plan_library
v = attnc.load("stdlib:causal")
m = get_prefill_module(v.ir, "float16", 64, arch="80")
d = get_decode_module(v.ir, "float16", 64, arch="80")
decode_plan_library.library()
prefill_plan_library.library()
print(m.name, m.tile_q_tokens(64, 1, 4096) > 0, d.name)
"""
)


def _freeze_header_digests(monkeypatch) -> str:
    from attnc.runtime.build import cache
    from attnc.runtime.planning import decode_plan_library

    dirs = (cache.INCLUDE_DIR, decode_plan_library.HOST_DIR)
    frozen = {str(Path(d)): cache.header_digest(d) for d in dirs}
    monkeypatch.setattr(
        cache, "header_digest", lambda include_dir=cache.INCLUDE_DIR: frozen[str(Path(include_dir))]
    )
    return json.dumps(frozen)


def test_build_for_sm80_then_load_without_nvcc(tmp_path, monkeypatch, capsys):
    frozen = _freeze_header_digests(monkeypatch)

    def no_cuda(*args, **kwargs):
        raise AssertionError("attnc build must not touch torch.cuda")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_cuda)
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "elsewhere"))
    out_dir = tmp_path / "deploy"
    argv = ["build", "stdlib:causal", "--arch", "80", "--dtype", "fp16", "--head-dim", "64"]
    status = cli.main([*argv, "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    names = "causal_fp16_d64, causal_decode_fp16_d64, decode_plan, prefill_plan, merge_state"
    assert f"attnc build: 5 module(s) for sm_80: {names}" in captured.err
    assert "attnc build: causal_fp16_d64: built in" in captured.err
    lines = captured.out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [
        "causal prefill float16 d64",
        "causal decode float16 d64",
        "decode_planner",
        "prefill_planner",
        "merge_state",
    ]
    assert all(line.split(": ")[1].startswith(str(out_dir)) for line in lines)
    assert (out_dir / "compiled").is_dir()  # the compiled variant too
    entries = sorted(p.name for p in out_dir.iterdir())

    env = dict(os.environ, ATTNC_CACHE_DIR=str(out_dir), ATTNC_NVCC="/bin/false")
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_NVCC, frozen], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["causal_fp16_d64", "True", "causal_decode_fp16_d64"]
    assert sorted(p.name for p in out_dir.iterdir()) == entries  # nothing new was built

    again = cli.main([*argv, "-o", str(out_dir)])  # a cache hit
    assert again == 0 and "built in" not in capsys.readouterr().err


def test_build_for_sm90a_adds_the_hopper_prefill(tmp_path, capsys):
    from attnc.runtime.build import modules

    if not modules.sm90_prefill_available():
        pytest.skip("this install has no Hopper prefill template")
    out_dir = tmp_path / "deploy90"
    argv = ["build", "stdlib:causal", "--arch", "90a", "--kind", "prefill", "-o", str(out_dir)]
    status = cli.main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    lines = captured.out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "causal prefill bfloat16 d128",
        "causal prefill_sm90 bfloat16 d128",
        "prefill_planner",
    ]
    for line in lines[:2]:
        library = line.split(": ", 1)[1]
        assert library.startswith(str(out_dir)) and (tmp_path / library).is_file()
        assert "sm_90a" in (tmp_path / library).with_name("built.ok").read_text()
