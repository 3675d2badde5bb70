"""Owns: the words of every page-table and index-list check (``kv_indptr``, ``qo_indptr``,
``kv_last_page_len``, ``kv_indices``, a request's tokens against the kernels' limit), as
``ValueError`` builders, and the mapping of the host planners' error codes
(``attnc/abi_codes.h``: ``ATTNC_PT_*``) onto them.

Both planners check the int32 host arrays in C++ (``attnc/kernels/host/page_table_check.h``,
used by ``decode_step.h`` and ``prefill_plan_check.h``) and report a failure as a code plus
the offending index and values (``planner_error`` words it). The Python checks
(``checks/tensors.py``, ``checks/limits.py``) word theirs here too, so a message exists once.
"""

from __future__ import annotations

from collections.abc import Callable

from attnc.dsl.limits import MAX_KV_TOKENS, MAX_QUERY_TOKENS
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


def indptr_count(kv_entries: int, qo_entries: int) -> ValueError:
    """A ``kv_indptr`` with another number of entries than ``qo_indptr``."""
    return ValueError(f"kv_indptr: has {kv_entries} entries, qo_indptr has {qo_entries}")


def too_many_tokens(
    name: str, what: str, request: int, tokens: int, limit: int, detail: str = ""
) -> ValueError:
    """Request ``request`` of indptr ``name`` holds ``tokens`` ``what`` tokens, past
    ``limit``; ``detail`` says more of it."""
    return ValueError(
        f"{name}: request {request} holds {tokens} {what} tokens{detail}, more than "
        f"the kernels' limit {limit} (int32 less a margin for their tile arithmetic)"
    )


def pages_detail(pages: int, page_size: int) -> str:
    """The ``detail`` of :func:`too_many_tokens` for a paged request."""
    return f" ({pages} pages of page_size={page_size})"


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
    code: int,
    index: int,
    value: int,
    value2: int,
    page_size: int,
    max_batch: int = 0,
    max_pages: int = 0,
) -> ValueError:
    """The error of a failed check of a host planner (``ATTNC_PT_*`` ``code`` with the index
    and values it reported; ``max_batch`` and ``max_pages``: the decode workspace's)."""
    words: dict[int, Callable[[], ValueError]] = {
        abi.PT_INDPTR_EMPTY: lambda: indptr_empty(),
        abi.PT_INDPTR_START: lambda: indptr_start(value),
        abi.PT_INDPTR_DECREASING: lambda: indptr_decreasing(index, value, value2),
        abi.PT_LAST_COUNT: lambda: wrong_count("kv_last_page_len", index, value),
        abi.PT_LAST_RANGE: lambda: last_range(index, value, page_size),
        abi.PT_BATCH_CAPACITY: lambda: batch_capacity(value, max_batch),
        abi.PT_PAGE_CAPACITY: lambda: page_capacity(value, max_pages),
        abi.PT_INDICES_SHORT: lambda: indices_short(value, value2),
        abi.PT_INDEX_NEGATIVE: lambda: index_negative(value),
        abi.PT_QO_INDPTR_EMPTY: lambda: indptr_empty("qo_indptr"),
        abi.PT_QO_INDPTR_START: lambda: indptr_start(value, "qo_indptr"),
        abi.PT_QO_INDPTR_DECREASING: lambda: indptr_decreasing(index, value, value2, "qo_indptr"),
        abi.PT_INDPTR_COUNT: lambda: indptr_count(value, value2),
        abi.PT_QUERY_TOKENS: lambda: too_many_tokens(
            "qo_indptr", "query", index, value, MAX_QUERY_TOKENS
        ),
        abi.PT_KV_TOKENS: lambda: too_many_tokens(
            "kv_indptr", "KV", index, value, MAX_KV_TOKENS,
            pages_detail(value2, page_size) if value2 >= 0 else "",
        ),
    }  # fmt: skip
    make = words.get(code)
    if make is None:
        raise AssertionError(f"host planner: unknown page-table error code {code}")
    return make()
