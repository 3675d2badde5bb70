"""Owns: the host side of the device page-id check (``attnc/page_check.cuh``): a wrapper's
8-byte status word in device memory, reading it at a host sync point (``plan()`` after runs
that used device-resident page ids, ``check()``, every ``run()`` under ``ATTNC_DEBUG_CHECKS``),
the ``ValueError`` that names ``kv_indices``, the request and the page id, and clearing it.

The kernels never dereference a page id outside ``[0, num_pages)``: they zero-fill its rows,
write the rows of the work items that met it as NaN (O and LSE) and atomicMin
``(request << 32) | (uint32) id`` into the word, so it holds the lowest bad request. The
word's address stays fixed for the wrapper's lifetime (CUDA graphs replay it); ``run()``
itself never reads it (no synchronisation on the eager path).
"""

from __future__ import annotations

import torch

from attnc.dsl.limits import I32_MAX
from attnc.verbose import env_flag

# ATTNC_PAGE_STATUS_CLEAR (all ones) as the int64 the status tensor holds.
CLEAR = -1
DEBUG_ENV = "ATTNC_DEBUG_CHECKS"


def debug_checks_enabled() -> bool:
    """True when ``ATTNC_DEBUG_CHECKS`` is on (:func:`attnc.verbose.env_flag`): ``run()`` then
    synchronises after each launch and raises a page-id error at once."""
    return env_flag(DEBUG_ENV)


def decode_status(value: int) -> tuple[int, int] | None:
    """(request, page id) packed in a status ``value``; None when it is clear."""
    if value == CLEAR:
        return None
    bits = value & 0xFFFF_FFFF_FFFF_FFFF
    request = bits >> 32
    page_id = bits & 0xFFFF_FFFF
    if page_id >= 2**31:
        page_id -= 2**32
    return request, page_id


def page_id_error(request: int, page_id: int) -> ValueError:
    """The error a set status word becomes."""
    return ValueError(
        f"kv_indices: request {request} uses page id {page_id}, outside the KV cache's pages "
        f"[0, num_pages) (found on the device by an earlier run(): the page was not read, and "
        f"the output and LSE rows of that request were written as NaN)"
    )


def pool_size(num_pages: int) -> int:
    """``num_pages`` for the int32 ``num_pages`` field: a ragged KV's token count clamped
    (it has no page ids; a paged cache of more pages is refused by ``checks.kv``)."""
    return min(int(num_pages), I32_MAX)


class PageStatus:
    """One wrapper's status word: ``ptr`` goes into the launch arguments; ``pending`` marks
    that the current plan's page ids were not checked on the host, so the next ``plan()``
    reads the word before replacing it."""

    def __init__(self, device: torch.device) -> None:
        self.word = torch.full((1,), CLEAR, dtype=torch.int64, device=device)
        self.ptr = self.word.data_ptr()
        self.pending = False

    def read(self) -> int:
        """The word's value after every launch queued so far on its device has finished
        (synchronises the device)."""
        if self.word.device.type == "cuda":
            torch.cuda.synchronize(self.word.device)
        return int(self.word.item())

    def raise_if_set(self) -> None:
        """Synchronise, and when a kernel reported a bad page id, clear the word and raise
        the ``ValueError`` naming ``kv_indices``, the request and the id."""
        found = decode_status(self.read())
        if found is not None:
            self.word.fill_(CLEAR)
            raise page_id_error(*found)

    def check_after_run(self) -> None:
        """The debug-mode check after a launch (skipped while a CUDA graph is captured)."""
        if self.word.device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            self.raise_if_set()
