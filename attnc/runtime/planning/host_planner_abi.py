"""Owns: the Python mirror of the mask's range rows as both host planners read them
(``attnc/kernels/host/mask_range_rows.h``): the ``ATTNC_PR_*`` columns of a row and the ctypes
mirror of ``AttncRangeRows``, which the prefill planner's parameters and the decode step's
parameters embed (their ``sizeof`` checks at load cover it). The rows themselves are built by
``mask_ranges.tile_range_program``."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from attnc.runtime.planning.mask_ranges import RangeProgram

# Columns of one row (ATTNC_PR_*): the constraint cq*q_idx + ck*kv_idx + c >= 0 of
# conjunction ``term`` (-1: a wrap guard), c = c0 + q_len*q_len + kv_len*kv_len (+ the
# request's entry of extra column ``extra`` when >= 0).
PR_TERM, PR_CQ, PR_CK, PR_C0, PR_Q_LEN, PR_KV_LEN, PR_EXTRA = range(7)
PR_COLUMNS = 7

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


class RangeRows(ctypes.Structure):
    """Mirror of ``AttncRangeRows``."""

    _fields_ = [
        ("rows", _P),
        ("num_rows", _I64),
        ("num_terms", _I64),
        ("extra", _P),
        ("num_extra", _I64),
        ("extra_batch", _I64),
    ]

    def set(
        self, program: RangeProgram | None, extra: np.ndarray | None = None
    ) -> tuple[object, ...]:
        """Point at ``program``'s rows and the int64 ``[columns, batch]`` ``extra`` values
        (``program.extra``), or at no rows (None: no closed form). Returns what the caller
        keeps alive while the planner may read it."""
        if program is None:
            self.rows, self.num_rows, self.num_terms = None, 0, 0
            self.extra, self.num_extra, self.extra_batch = None, 0, 0
            return ()
        self.rows, self.num_rows = program.rows_ptr, program.rows.shape[0]
        self.num_terms = program.num_terms
        if extra is None:
            self.extra, self.num_extra, self.extra_batch = None, 0, 0
            return (program,)
        extra = np.ascontiguousarray(extra, dtype=np.int64)
        self.extra, self.num_extra, self.extra_batch = extra.ctypes.data, *extra.shape
        return (program, extra)
