"""The C++ decode planner (``attnc_decode_check``, ``attnc_decode_step``) runs with the GIL
released: it copies the caller's ``kv_indptr`` and ``kv_last_page_len`` once, and its checks,
the KV lengths and the page-id copy read that copy. Another thread writing ``kv_indptr[-1]``
during the call can no longer raise the page count past ``max_pages`` after the capacity
check (the page-id copy then ran past the workspace's page-id region).

The reads are counted with a hardware watchpoint (``perf_event_open``, a breakpoint event
that counts this thread's loads of one entry): one read of each watched entry per call,
where the checks read ``kv_indptr[-1]`` up to four times before (the capacity check and the
page-id count each read it anew). The watchpoint is tried on a numpy read first; the tests
skip where the kernel gives none. Reads are counted in units of one memcpy of the table (a
memcpy may load an entry twice, by overlapping loads)."""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Callable

import decode_plan_harness as h
import numpy as np
import pytest

from attnc.runtime.planning import decode_plan_library

pytestmark = pytest.mark.nvcc

if not h.have_nvcc():
    pytest.skip("nvcc not found", allow_module_level=True)

_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
_ENABLE, _DISABLE, _RESET = 0x2400, 0x2401, 0x2403  # PERF_EVENT_IOC_*
_LIBC = ctypes.CDLL(None, use_errno=True)


class _Watch:
    """Counts this thread's reads (and writes) of the 4 bytes at ``address``."""

    def __init__(self, address: int) -> None:
        attr = bytearray(72)  # PERF_ATTR_SIZE_VER1
        struct.pack_into("IIQ", attr, 0, 5, 72, 0)  # PERF_TYPE_BREAKPOINT
        # disabled, exclude_kernel, exclude_hv; HW_BREAKPOINT_RW; the address and length
        struct.pack_into("QII", attr, 40, 1 | 1 << 5 | 1 << 6, 0, 3)
        struct.pack_into("QQ", attr, 56, address, 4)
        buf = ctypes.create_string_buffer(bytes(attr), len(attr))
        fd = -1 if _PERF_EVENT_OPEN is None else _LIBC.syscall(_PERF_EVENT_OPEN, buf, 0, -1, -1, 0)
        if fd < 0:
            pytest.skip(f"no hardware watchpoint: {os.strerror(ctypes.get_errno())}")
        self.fd = fd

    def count(self, fn: Callable[[], object]) -> int:
        """How many accesses to the watched bytes ``fn()`` makes."""
        _LIBC.ioctl(self.fd, _RESET, 0)
        _LIBC.ioctl(self.fd, _ENABLE, 0)
        try:
            fn()
        finally:
            _LIBC.ioctl(self.fd, _DISABLE, 0)
        return struct.unpack("q", os.read(self.fd, 8))[0]

    def close(self) -> None:
        os.close(self.fd)


def _reads(v: np.ndarray, index: int, fn: Callable[[], object]) -> int:
    """Reads of ``v[index]`` by ``fn()``, in units of what one memcpy of the whole of ``v``
    reads of it (1: ``fn`` read it as one copy does; a memcpy's loads of an entry depend on
    the table's size and the C library). Skips where a numpy read of it is not counted."""
    w = _Watch(v.ctypes.data + 4 * (index % v.shape[0]))
    try:
        if w.count(lambda: int(v[index])) != 1:
            pytest.skip("the hardware watchpoint does not count reads here")
        dst = ctypes.create_string_buffer(v.nbytes)
        one_copy = w.count(lambda: ctypes.memmove(dst, v.ctypes.data, v.nbytes))
        if one_copy < 1:
            pytest.skip("the hardware watchpoint does not count a memcpy's reads here")
        got = w.count(fn)
        return got // one_copy if got % one_copy == 0 else got
    finally:
        w.close()


@pytest.fixture
def planner():
    """A decode planner (max_batch 8, 64 page ids), its CUDA calls switched to memcpys into a
    host buffer."""
    p, _, lay = h.planner(8, 1024, 16, workspace=1 << 22, max_pages=64)
    p.configure(1, 32, 8, 1, 16, 64, lay.max_part_rows(128), 16, lay.max_items)
    stage, ws = np.zeros(1 << 12, np.uint8), np.zeros(1 << 22, np.uint8)  # a host "workspace"
    p.set_stage(stage, stage.ctypes.data, stage.shape[0])
    p.bind(ws.ctypes.data, ws.ctypes.data + lay.page_ids, 0)
    decode_plan_library.fake_cuda(1)
    yield p
    p.wait()
    decode_plan_library.fake_cuda(0)


# Five requests (page 16): KV lengths 37, 32, 49, 0, 18.
INDPTR, LAST = [0, 3, 5, 9, 9, 11], [5, 16, 1, 3, 2]
CAPACITY = "the workspace capacity of 64 page ids (max_num_pages)"


def _tables(indptr: list[int], last: list[int]) -> tuple[np.ndarray, ...]:
    return (np.array(indptr, np.int32), np.array(last, np.int32), np.arange(80, dtype=np.int32))


def _calls(p, tables):
    """check and step of the tables (host page ids, then on the device), each as a thunk."""
    pairs = [(a.ctypes.data, a.shape[0]) for a in tables]
    for on_device in (False, True):
        yield f"check (ids on the device: {on_device})", lambda d=on_device: p.check(*pairs, d)
        yield f"step (ids on the device: {on_device})", lambda d=on_device: p.step(*pairs, d, 0)


@pytest.mark.parametrize("index", [-1, 0])
def test_a_good_plan_reads_each_table_entry_once(planner, index):
    """The first and last entries of kv_indptr and kv_last_page_len: one read each (the
    copy), by the check and by the step, page ids on the host or the device."""
    tables = _tables(INDPTR, LAST)
    for name, call in _calls(planner, tables):
        assert _reads(tables[0], index, call) == 1, name
        assert _reads(tables[1], index, call) == 1, name
    kv = planner.check(*[(a.ctypes.data, a.shape[0]) for a in tables], False)
    assert kv.tolist() == [37, 32, 49, 0, 18]
    assert planner.result.nnz == 11


@pytest.mark.parametrize(
    ("indptr", "last", "message"),
    [
        ([0, 3, 5, 9, 9, 65], LAST, f"kv_indices: 65 pages exceed {CAPACITY}"),
        ([0, 3, 5, 9, 9, 90], LAST, f"kv_indices: 90 pages exceed {CAPACITY}"),
        (
            INDPTR,
            [5, 16, 17, 3, 2],
            "kv_last_page_len: kv_last_page_len[2]=17 is outside [1, page_size=16]",
        ),
        (
            [0, 3, 2, 9, 9, 11],
            LAST,
            "kv_indptr: must be non-decreasing, but kv_indptr[2]=2 < kv_indptr[1]=3",
        ),
    ],
    ids=["capacity", "capacity and short ids", "last page", "decreasing"],
)
def test_a_refused_plan_reads_kv_indptr_once_and_keeps_its_message(planner, indptr, last, message):
    """A refused table: the message it had, and kv_indptr[-1] read once (the copy) whichever
    check fails."""
    tables = _tables(indptr, last)
    for name, call in _calls(planner, tables):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message, name
        assert _reads(tables[0], -1, lambda c=call: pytest.raises(ValueError, c)) == 1, name


def _resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc/self/statm")
def test_a_table_over_max_batch_is_refused_without_a_copy(planner):
    """A table of more requests than max_batch is refused by the capacity check whatever its
    entries hold: it is not copied, so the thread's scratch does not keep 40 MB of it (it
    did, until the thread ended)."""
    n = 5_000_000
    tables = (np.arange(n + 1, dtype=np.int32), np.ones(n, np.int32), np.arange(4, dtype=np.int32))
    pairs = [(a.ctypes.data, a.shape[0]) for a in tables]
    before = _resident_bytes()
    for call in (lambda: planner.check(*pairs, False), lambda: planner.step(*pairs, False, 0)):
        with pytest.raises(ValueError, match="exceeds max_batch_size=8"):
            call()
    assert _resident_bytes() - before < 8 << 20
