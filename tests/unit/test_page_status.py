"""The host side of the device page-id check, CPU only: the status word's packing, the error it
becomes, the wrappers' check() and plan() reading a fake status word, the debug switch, and
the decode args mirror (the kernels' side runs in tests/gpu/test_page_checks.py)."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

import attnc
from attnc.runtime import abi
from attnc.runtime.build.cache import INCLUDE_DIR
from attnc.runtime.checks import page_status
from attnc.runtime.checks.page_status import CLEAR, PageStatus, decode_status
from attnc.runtime.wrappers.decode import BatchDecodeWrapper
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

C_TO_CTYPES = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "float": ctypes.c_float}


def _packed(request: int, page_id: int) -> int:
    """What report_bad_page atomicMins into the word, as the int64 the tensor holds."""
    bits = (request << 32) | (page_id & 0xFFFF_FFFF)
    return bits - 2**64 if bits >= 2**63 else bits


def _fake_status(request: int, page_id: int) -> PageStatus:
    status = PageStatus(torch.device("cpu"))
    status.word.fill_(_packed(request, page_id))
    return status


def test_status_word_packing():
    assert decode_status(CLEAR) is None
    assert decode_status(_packed(3, 1000)) == (3, 1000)
    assert decode_status(_packed(0, 0)) == (0, 0)
    assert decode_status(_packed(7, -5)) == (7, -5)  # negative ids travel as uint32
    assert decode_status(_packed(2**31 - 1, 2**31 - 1)) == (2**31 - 1, 2**31 - 1)
    # atomicMin over the packed keys picks the lowest request first.
    keys = [(_packed(r, i) & (2**64 - 1)) for r, i in [(5, 1), (2, 900), (2, -1), (9, 0)]]
    assert decode_status(min(keys)) == (2, 900)


def test_error_names_kv_indices_request_and_id():
    err = page_status.page_id_error(4, 12345)
    assert isinstance(err, ValueError)
    assert re.search(r"kv_indices: request 4 uses page id 12345, outside", str(err))
    assert "NaN" in str(err)


def test_raise_if_set_raises_once_and_clears():
    status = _fake_status(6, 77)
    status.pending = True
    with pytest.raises(ValueError, match=r"kv_indices: request 6 uses page id 77\b"):
        status.raise_if_set()
    assert int(status.word.item()) == CLEAR and status.pending  # the plan still is unchecked
    status.raise_if_set()  # clear: nothing to report


def test_pool_size_fits_int32():
    assert page_status.pool_size(12) == 12
    assert page_status.pool_size(2**40) == 2**31 - 1


def test_debug_switch(monkeypatch):
    monkeypatch.delenv(page_status.DEBUG_ENV, raising=False)
    assert not page_status.debug_checks_enabled()
    monkeypatch.setenv(page_status.DEBUG_ENV, "0")
    assert not page_status.debug_checks_enabled()
    monkeypatch.setenv(page_status.DEBUG_ENV, "1")
    assert page_status.debug_checks_enabled()


def test_prefill_check_reads_the_status_word():
    variant = attnc.load("stdlib:vanilla")
    w = BatchPrefillWrapper(variant, torch.empty(1 << 16, dtype=torch.uint8))
    w.check()  # a fresh word is clear
    w._page_status.word.fill_(_packed(1, -3))
    with pytest.raises(ValueError, match=r"kv_indices: request 1 uses page id -3\b"):
        w.check()
    w.check()  # cleared by the report


def test_decode_plan_reports_before_planning():
    """plan() after runs with device page ids reads the word first: the error names the
    request even though the new page table is garbage (nothing else ran)."""
    w = object.__new__(BatchDecodeWrapper)
    w._page_status = _fake_status(2, 4096)
    w._page_status.pending = True
    w._launched = True  # a run() since the plan
    with pytest.raises(ValueError, match=r"kv_indices: request 2 uses page id 4096\b"):
        w.plan(None, None, None, 8, 8, 128, 16)  # type: ignore[arg-type]
    # The old plan stays in force (and unchecked): the next plan() reads again.
    assert w._page_status.pending and int(w._page_status.word.item()) == CLEAR
    w._page_status.word.fill_(_packed(0, 9))
    with pytest.raises(ValueError, match=r"request 0 uses page id 9\b"):
        w.check()


def test_decode_plan_skips_the_read_when_nothing_is_pending():
    """Host-checked page ids never set ``pending``: plan() does not read (or synchronise)."""
    w = object.__new__(BatchDecodeWrapper)
    w._page_status = _fake_status(2, 4096)
    w._planned_mask = type("M", (), {"values": {}})()
    w._fast = None
    w._plan_checked = lambda *a, **k: None  # the rest of plan() is not under test
    w.plan(None, None, None, 8, 8, 128, 16)  # type: ignore[arg-type]
    assert decode_status(int(w._page_status.word.item())) == (2, 4096)


def _header_fields(header: str, struct: str) -> list[tuple[str, type]]:
    text = (INCLUDE_DIR / "attnc" / header).read_text()
    body = re.search(rf"typedef struct {struct} \{{(.*?)\}} {struct};", text, re.S)
    assert body is not None
    fields = []
    for line in body.group(1).splitlines():
        decl = line.split("//")[0].strip()
        if not decl:
            continue
        m = re.fullmatch(r"((?:const\s+)?\w+)\s*(\*?)\s*(.*);", decl)
        assert m is not None, decl
        base, star, names = m.groups()
        for name in names.split(","):
            fields.append((name.strip(), ctypes.c_void_p if star else C_TO_CTYPES[base]))
    return fields


def test_decode_args_mirror_matches_header():
    fields = _header_fields("decode_args.h", "AttncDecodeArgs")
    assert fields[-3:-1] == [("page_status", ctypes.c_void_p), ("num_pages", ctypes.c_int32)]
    assert fields[-1] == ("kv_token_start", ctypes.c_void_p)
    assert [(n, t) for n, t in abi.AttncDecodeArgs._fields_] == fields
    text = (INCLUDE_DIR / "attnc" / "decode_args.h").read_text()
    version = re.search(r"#define ATTNC_DECODE_ABI_VERSION (\d+)", text)
    assert version is not None and int(version.group(1)) == abi.DECODE_ABI_VERSION


def test_prefill_args_carry_the_page_check_fields():
    fields = _header_fields("prefill_args.h", "AttncPrefillArgs")
    assert fields[-6:-4] == [("page_status", ctypes.c_void_p), ("num_pages", ctypes.c_int32)]


def test_status_clear_value_matches_header():
    text = (INCLUDE_DIR / "attnc" / "page_check.cuh").read_text()
    m = re.search(r"#define ATTNC_PAGE_STATUS_CLEAR (0x[0-9a-f]+)ull", text)
    assert m is not None and int(m.group(1), 16) == CLEAR & (2**64 - 1)


def test_launch_args_carry_pool_size_and_status_word():
    """Prefill: num_pages from the cache's page count and the wrapper's word from the plan's
    meta (ragged: the token count, which bounds the Hopper template's TMA map, and no word);
    decode: num_pages per call, also on the cached-call path."""
    from attnc.runtime.checks.kv import KvViews
    from attnc.runtime.wrappers import decode_calls, decode_launch, prefill_launch

    params = abi.params_struct(())()
    q = torch.zeros(4, 8, 64, dtype=torch.bfloat16)
    cache = torch.zeros(7, 2, 16, 2, 64, dtype=torch.bfloat16)
    k, v = cache[:, 0], cache[:, 1]
    meta = dict.fromkeys(prefill_launch.META_FIELDS, 0)
    meta.update(kv_layout=abi.KV_PAGED_NHD, page_status=4096)
    ws = torch.zeros(64, dtype=torch.uint8)
    paged = prefill_launch.PrefillTensors(q, k, v, q, None, ws)
    args = prefill_launch.build_args(list(meta.values()), paged, 0.1, params, 4)
    assert (args.num_pages, args.page_status) == (7, 4096)
    meta.update(kv_layout=abi.KV_RAGGED, page_status=0)
    flat = torch.zeros(30, 2, 64, dtype=torch.bfloat16)
    ragged = prefill_launch.PrefillTensors(q, flat, flat, q, None, ws)
    args = prefill_launch.build_args(list(meta.values()), ragged, 0.1, params, 4)
    assert (args.num_pages, args.page_status) == (30, None)

    d_args = abi.AttncDecodeArgs()
    views = KvViews(k, v, abi.KV_PAGED_NHD, 7, 16)
    decode_launch.fill_call_fields(d_args, q, views, q, None, params)
    assert d_args.num_pages == 7
    hit = decode_calls.remember_call(d_args, q, q, 7, params, {}, {})
    assert hit is not None
    d_args.num_pages = 99
    decode_calls.apply_call(d_args, hit)
    assert d_args.num_pages == 7
