"""The CLI's words for what it cannot write or build: ``attnc compile -o DIR`` into a folder
no file can be made in named the temporary file the write goes through (``.causal.cuh.
oh0qai59.tmp``), which the user never asked for; a failed build printed ``attnc: error:
attnc: nvcc failed`` (the build error's own prefix after the CLI's)."""

from __future__ import annotations

import os

import pytest
from fake_nvcc import installed

from attnc import cli


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_an_output_folder_no_file_can_be_made_in_is_named_with_the_file(capsys) -> None:
    assert cli.main(["compile", "stdlib:causal", "-o", "/proc/self"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("attnc: error: -o: cannot write /proc/self/causal.cuh: ")
    assert ".tmp" not in err


def test_a_failed_build_has_one_prefix(tmp_path, monkeypatch, capsys) -> None:
    with installed(tmp_path, monkeypatch):
        monkeypatch.setenv("FAKE_NVCC_MODE", "always")
        argv = ["build", "stdlib:causal", "--arch", "80", "--kind", "decode", "--head-dim", "64"]
        assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "attnc: error: " in err and "attnc: error: attnc:" not in err
