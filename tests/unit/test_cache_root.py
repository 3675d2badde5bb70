"""The cache root when it cannot be had: a relative ``ATTNC_CACHE_DIR`` while the working
directory is gone. Loading a variant failed with a bare ``[Errno 2] No such file or
directory`` (the parser tables and compiled IR are optional caches); now those caches are
skipped, and what needs the root (a module build) gets an error naming the variable."""

from __future__ import annotations

import pytest
import torch

import attnc
from attnc.cache_root import cache_dir
from attnc.dsl import parser_cache


@pytest.fixture
def no_working_directory(tmp_path, monkeypatch):
    # torch's math libraries load their parts on first use, by paths a removed working
    # directory breaks (the process exits): load them first.
    torch.ones(4, 4) @ torch.ones(4, 4)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.setenv("ATTNC_CACHE_DIR", "relcache")
    monkeypatch.delenv("ATTNC_COMPILE_CACHE", raising=False)


def test_the_root_is_refused_by_the_variables_name(no_working_directory) -> None:
    with pytest.raises(ValueError, match=r"^ATTNC_CACHE_DIR: 'relcache' is a relative path"):
        cache_dir()


def test_sources_load_without_the_caches(no_working_directory) -> None:
    sentinel = object()
    assert parser_cache.cached_parser('start: "a"', {}, lambda: sentinel) is sentinel  # type: ignore[arg-type, return-value]
    v = attnc.load(source="variant no_root_here { mask = kv_idx <= q_pos; }")
    assert v.name == "no_root_here"
