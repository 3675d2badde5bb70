"""`attnc build`: modules built ahead of time for an arch, without a GPU, are found by a later
load that cannot run nvcc (ATTNC_NVCC=/bin/false)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from attnc import cli

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

_LOAD_WITHOUT_NVCC = """
import attnc
from attnc.runtime.build.modules import get_prefill_module
v = attnc.load("stdlib:causal")
m = get_prefill_module(v.ir, "float16", 64, arch="80")
print(m.name, m.tile_q_tokens(64, 1, 4096) > 0)
"""


def test_build_for_sm80_then_load_without_nvcc(tmp_path, monkeypatch, capsys):
    def no_cuda(*args, **kwargs):
        raise AssertionError("attnc build must not touch torch.cuda")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", no_cuda)
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "elsewhere"))
    out_dir = tmp_path / "deploy"
    argv = ["build", "stdlib:causal", "--arch", "80", "--dtype", "fp16", "--head-dim", "64"]
    status = cli.main([*argv, "--kind", "prefill", "-o", str(out_dir)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "attnc build: 1 module(s) for sm_80: causal_fp16_d64" in captured.err
    assert "attnc build: causal_fp16_d64: built in" in captured.err
    (line,) = captured.out.splitlines()
    assert line.startswith("causal prefill float16 d64: ") and line.endswith("causal_fp16_d64.so")
    assert (out_dir / "compiled").is_dir()  # the compiled variant too
    entries = sorted(p.name for p in out_dir.iterdir())

    env = dict(os.environ, ATTNC_CACHE_DIR=str(out_dir), ATTNC_NVCC="/bin/false")
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_NVCC], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["causal_fp16_d64", "True"]
    assert sorted(p.name for p in out_dir.iterdir()) == entries  # nothing new was built

    again = cli.main([*argv, "--kind", "prefill", "-o", str(out_dir)])  # a cache hit
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
    ]
    for line in lines:
        library = line.split(": ", 1)[1]
        assert library.startswith(str(out_dir)) and (tmp_path / library).is_file()
        assert "sm_90a" in (tmp_path / library).with_name("built.ok").read_text()
