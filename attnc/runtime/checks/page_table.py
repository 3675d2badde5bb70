"""Owns: the words of every page-table and index-list check (``kv_indptr``, ``qo_indptr``,
``kv_last_page_len``, ``kv_indices``), as ``ValueError`` builders, and the mapping of the
decode planner's page-table error codes (``attnc/abi_codes.h``: ``ATTNC_PT_*``) onto them.

The decode wrapper's checks run in C++ (``attnc/kernels/host/decode_step.h``) and come back
as a code plus the offending index and values; the prefill checks run in Python
(``checks/tensors.py``). Both word their failures here, so a message exists once.
"""

from __future__ import annotations

from attnc.runtime import abi
from attnc.runtime.planning.workspace import CapacityError


def indptr_empty(name: str = "kv_indptr") -> ValueError:
    """An indptr without entries."""
    return ValueError(f"{name}: needs at least one entry (batch + 1)")


def indptr_start(first: int, name: str = "kv_indptr") -> ValueError:
    """An indptr that does not start at 0."""
    return ValueError(f"{name}: must start at 0, got {first}")


def indptr_decreasing(i: int, at: int, before: int, name: str = "kv_indptr") -> ValueError:
    """``name[i] < name[i - 1]``."""
    return ValueError(
        f"{name}: must be non-decreasing, but {name}[{i}]={at} < {name}[{i - 1}]={before}"
    )


def wrong_count(name: str, expected: int, got: int) -> ValueError:
    """An index list with another number of entries than the batch needs."""
    return ValueError(f"{name}: expected {expected} entries, got {got}")


def last_range(i: int, value: int, page_size: int) -> ValueError:
    """A ``kv_last_page_len`` entry outside ``[1, page_size]`` for a request with pages."""
    return ValueError(
        f"kv_last_page_len: kv_last_page_len[{i}]={value} is outside [1, page_size={page_size}]"
    )


def batch_capacity(batch: int, max_batch: int) -> CapacityError:
    """More requests than the decode wrapper holds."""
    return CapacityError(f"kv_indptr: batch {batch} exceeds max_batch_size={max_batch}")


def page_capacity(nnz: int, max_pages: int) -> CapacityError:
    """More page ids than the decode workspace holds."""
    return CapacityError(
        f"kv_indices: {nnz} pages exceed the workspace capacity of "
        f"{max_pages} page ids (max_num_pages)"
    )


def indices_short(entries: int, nnz: int) -> ValueError:
    """Fewer page ids than ``kv_indptr[-1]``."""
    return ValueError(f"kv_indices: has {entries} entries, but kv_indptr[-1] = {nnz}")


def index_negative(lo: int) -> ValueError:
    """A negative page id."""
    return ValueError(f"kv_indices: page index {lo} is negative")


def planner_error(
    code: int, index: int, value: int, value2: int, page_size: int, max_batch: int, max_pages: int
) -> ValueError:
    """The error of a failed page-table check of the decode planner (``ATTNC_PT_*`` ``code``
    with the index and values it reported)."""
    if code == abi.PT_INDPTR_EMPTY:
        return indptr_empty()
    if code == abi.PT_INDPTR_START:
        return indptr_start(value)
    if code == abi.PT_INDPTR_DECREASING:
        return indptr_decreasing(index, value, value2)
    if code == abi.PT_LAST_COUNT:
        return wrong_count("kv_last_page_len", index, value)
    if code == abi.PT_LAST_RANGE:
        return last_range(index, value, page_size)
    if code == abi.PT_BATCH_CAPACITY:
        return batch_capacity(value, max_batch)
    if code == abi.PT_PAGE_CAPACITY:
        return page_capacity(value, max_pages)
    if code == abi.PT_INDICES_SHORT:
        return indices_short(value, value2)
    if code == abi.PT_INDEX_NEGATIVE:
        return index_negative(value)
    raise AssertionError(f"decode plan: unknown page-table error code {code}")
