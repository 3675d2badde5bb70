"""A long-lived process loading many distinct variants: the analyses memo (``results._KNOWN``)
and the compile cache's decoded entries (``variant_cache._SEEN``) kept every one (1000 loads of
distinct sources: 1005 entries each, every Compiled alive, 15.8 MB). The memo now lives as
long as its Compiled does, and the decoded entries are bounded."""

from __future__ import annotations

import gc

import pytest

import attnc
from attnc.compiler import results
from attnc.runtime.build import variant_cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _source(i: int) -> str:
    return f"variant memo_probe_{i} {{ score = score * {i + 2}.0; }}"


def _probes_known() -> int:
    """The analyses memo's entries of this file's variants (other tests' live variants keep
    theirs)."""
    return sum(ir.name.startswith("memo_probe_") for ir in list(results._KNOWN.keys()))


def test_loading_many_distinct_variants_keeps_a_bounded_memo(cache_dir) -> None:
    count = variant_cache._SEEN_ENTRIES + 20
    for i in range(count):
        attnc.load(source=_source(i))  # compiled and written to the cache
    for i in range(count):
        attnc.load(source=_source(i))  # read back from the cache
    gc.collect()
    assert len(variant_cache._SEEN) <= variant_cache._SEEN_ENTRIES
    assert _probes_known() <= variant_cache._SEEN_ENTRIES


def test_a_live_variant_keeps_its_analyses_remembered(cache_dir) -> None:
    kept = attnc.load(source=_source(1000))
    for i in range(variant_cache._SEEN_ENTRIES + 5):
        attnc.load(source=_source(2000 + i))
    gc.collect()
    assert results.known(kept.compiled.variant) is kept.compiled


def test_equal_ir_keeps_the_analyses_of_the_live_variant(cache_dir) -> None:
    """Two variants of equal IR with Compiled objects of their own (the second decoded after
    the first's cache entry was dropped): remembering the second replaced the first's, and
    when the second went, the first's analyses were gone while it lived."""
    kept = attnc.load(source=_source(3000))
    for i in range(variant_cache._SEEN_ENTRIES + 5):
        attnc.load(source=_source(4000 + i))  # the first's decoded entry is dropped
    other = attnc.load(source=_source(3000))
    assert other.compiled is not kept.compiled and other.ir == kept.ir
    del other
    for i in range(variant_cache._SEEN_ENTRIES + 5):
        attnc.load(source=_source(5000 + i))
    gc.collect()
    assert results.known(kept.compiled.variant) is kept.compiled
