"""benchmarks/clients/generate_bench.py on the CPU with a tiny model: the JSON it writes,
the soft-cap switch of its ``sdpa`` row, and attnc's tokens against eager's."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

TINY = ["--device", "cpu", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
        "--head-dim", "16", "--vocab", "128", "--batch", "3", "--prompt", "24",
        "--new-tokens", "5", "--window", "8", "--ragged"]  # fmt: skip


def test_generate_bench_writes_tokens_per_s_and_ratios(tmp_path):
    pytest.importorskip("transformers")
    from benchmarks.clients import generate_bench

    out = tmp_path / "gen.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            generate_bench.main([*TINY, "--impl", "attnc", "eager", "sdpa", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    report = json.loads(out.read_text())
    rows = report["results"]
    assert set(rows) == {"attnc", "eager", "sdpa"}
    for row in rows.values():
        assert row["steps"] == 5 and not row["truncated"] and row["tokens_per_s"] > 0
    assert rows["eager"]["same_tokens_as_first"] == 1.0  # float32: attnc gives eager's tokens
    assert set(report["ratios"]) == {"attnc/eager", "attnc/eager decode", "attnc/sdpa",
                                     "attnc/sdpa decode"}  # fmt: skip
    assert report["config"]["budget"] == 480.0


def test_budget_truncates_and_skips(tmp_path):
    pytest.importorskip("transformers")
    from benchmarks.clients import generate_bench

    args = generate_bench.parse_args([*TINY, "--impl", "eager", "--budget", "0"])
    report = generate_bench.run(args)
    assert report["results"] == {"eager": {"skipped": "the --budget ran out"}}
