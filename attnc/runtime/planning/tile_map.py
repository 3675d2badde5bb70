"""Owns: the plan-time tile map of a mask that reads per-token tensors: its layout (request
b's rows at ``starts[b]``, ``[q tiles][ceil(kv_len / 64)]`` uint8 classes; the starts are the
host planner's, ``PrefillPlanner.map_starts``), the launch of the module's generated classifier
(``attnc_build_tile_map``, attnc/tile_map_builder.cuh) on the workspace, the queued steps of a
plan that does not wait for its map (``attnc_queue_tile_map``: the plan's lists up, the
classifier, then the step that cuts and orders the plan's items by the map,
attnc/item_map_order.cuh), and the per-query-tile summary of a host copy of the map that
``BatchPrefillWrapper.tile_map`` returns: the host planner's own, which ranges and costs tiles
by it (EMPTY blocks are neither loaded nor costed). The numpy oracles of the starts and the
summary are tests/tile_map_oracle.py's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from attnc.dsl.limits import MAX_KV_TOKENS, MAX_QUERY_TOKENS
from attnc.runtime.abi import PLAN_CAPACITY, PLAN_OK, TILE_MAP_KV_BLOCK
from attnc.runtime.checks.tensors import check_int
from attnc.runtime.planning import prefill_plan_library

assert MAX_KV_TOKENS == MAX_QUERY_TOKENS  # the one limit the summary's message names

TILE_MAP_ABI_VERSION = 4  # attnc/tile_map_args.h ATTNC_TILE_MAP_ABI_VERSION

_P = ctypes.c_void_p
_I32 = ctypes.c_int32
_N = TypeVar("_N", int, np.ndarray)  # one request's length, or an array of one per request


class AttncTileMapArgs(ctypes.Structure):
    """Field-for-field mirror of ``AttncTileMapArgs`` (attnc/tile_map_args.h)."""

    _fields_ = [
        ("tile_map", _P),
        ("tile_map_start", _P),
        ("qo_indptr", _P),
        ("kv_token_start", _P),
        ("variant_params", _P),
        ("variant_params_size", ctypes.c_int64),
        ("batch_size", _I32),
        ("num_qo_heads", _I32),
        ("num_kv_heads", _I32),
        ("head_dim", _I32),
        ("tile_q_tokens", _I32),
        ("kv_block", _I32),
        ("mask_heads", _I32),
        ("num_entries", _I32),
        ("sm_scale", ctypes.c_float),
    ]


class AttncItemOrderArgs(ctypes.Structure):
    """Field-for-field mirror of ``AttncItemOrderArgs`` (attnc/item_map_order.cuh)."""

    _fields_ = [
        ("items", _P),
        ("scratch", _P),
        ("tile_map", _P),
        ("tile_map_start", _P),
        ("kv_token_start", _P),
        ("num_items", _I32),
        ("batch_size", _I32),
        ("kv_block", _I32),
    ]


class AttncTileMapCopies(ctypes.Structure):
    """Field-for-field mirror of ``AttncTileMapCopies`` (attnc/tile_map_args.h): the head lists
    copied up before the classifier, the map copied down after it (page-locked host memory)."""

    _fields_ = [
        ("heads_host", _P),
        ("heads_device", _P),
        ("heads_bytes", ctypes.c_int64),
        ("map_host", _P),
    ]


class AttncPlanUpload(ctypes.Structure):
    """Field-for-field mirror of ``AttncPlanUpload`` (attnc/tile_map_args.h): the plan's packed
    lists, from page-locked host memory into the workspace."""

    _fields_ = [("host", _P), ("device", _P), ("bytes", ctypes.c_int64)]


def map_entries(q_len: _N, kv_len: _N, tile_q_tokens: int, kv_block: int = TILE_MAP_KV_BLOCK) -> _N:
    """The tiles (bytes) of the map of a request of ``q_len`` queries and ``kv_len`` keys: its
    query tiles times its KV blocks (ints, or int64 arrays of one entry per request)."""
    return -(-q_len // tile_q_tokens) * -(-kv_len // kv_block)


def point_into_workspace(
    args: AttncTileMapArgs, workspace_ptr: int, offsets: Mapping[str, int]
) -> None:
    """Point the classifier's arguments at the workspace regions ``offsets`` names:
    ``tile_map``, ``tile_map_start``, ``qo_indptr`` and ``kv_token_start``."""
    args.tile_map = workspace_ptr + offsets["tile_map"]
    args.tile_map_start = workspace_ptr + offsets["tile_map_start"]
    args.qo_indptr = workspace_ptr + offsets["qo_indptr"]
    args.kv_token_start = workspace_ptr + offsets["kv_token_start"]


def build_on_device(
    module: object,
    workspace_ptr: int,
    offsets: dict[str, int],
    args: AttncTileMapArgs,
    stream: int,
    copies: AttncTileMapCopies | None = None,
) -> None:
    """Launch the module's classifier on ``stream``; ``offsets`` name the workspace regions
    ``tile_map``, ``tile_map_start``, ``qo_indptr`` and ``kv_token_start``. With ``copies``
    the module also copies the head lists up first and the map down after, and waits for the
    stream: one call for the whole step."""
    argtypes = [ctypes.POINTER(AttncTileMapArgs), ctypes.POINTER(AttncTileMapCopies), _P]
    fn = _entry(module, "attnc_build_tile_map", argtypes)
    point_into_workspace(args, workspace_ptr, offsets)
    step = None if copies is None else ctypes.byref(copies)
    module.raise_on_error(fn(ctypes.byref(args), step, ctypes.c_void_p(stream)))  # type: ignore[attr-defined,operator]


def _entry(module: object, name: str, argtypes: list[object]) -> object:
    """The module's ``name`` with ctypes signatures set, its tile-map ABI checked once."""
    lib = module.lib  # type: ignore[attr-defined]
    fn = getattr(lib, name)
    if fn.argtypes is None:
        lib.attnc_tile_map_abi_version.restype = ctypes.c_int
        found = int(lib.attnc_tile_map_abi_version())
        if found != TILE_MAP_ABI_VERSION:
            raise RuntimeError(
                f"tile map: module ABI {found}, this runtime expects {TILE_MAP_ABI_VERSION}"
            )
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return fn


def queue_on_device(
    module: object,
    args: AttncTileMapArgs,
    order: AttncItemOrderArgs,
    upload: AttncPlanUpload,
    stream: int,
) -> None:
    """Queue on ``stream``, in one call into the module: the plan's lists up (``upload``), the
    classifier (``args``, its pointers set), then the step that cuts each work item's KV range
    to its map row and orders the items by their non-EMPTY map columns, largest first
    (``order``, pointing into the workspace). Nothing waits."""
    argtypes = [
        ctypes.POINTER(AttncTileMapArgs),
        ctypes.POINTER(AttncItemOrderArgs),
        ctypes.POINTER(AttncPlanUpload),
        _P,
    ]
    fn = _entry(module, "attnc_queue_tile_map", argtypes)
    status = fn(ctypes.byref(args), ctypes.byref(order), ctypes.byref(upload), _P(stream))  # type: ignore[operator]
    module.raise_on_error(status)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class TileMapSummary:
    """Per query tile (requests in order, tiles in order within each): the flat index of its
    map row, its first and one-past-last non-empty column (both 0 when all EMPTY), and the
    cumulative count of non-empty entries over the whole map (for chunk costs)."""

    row_start: np.ndarray  # int64 [tiles]
    first: np.ndarray  # int64 [tiles]
    end: np.ndarray  # int64 [tiles]
    cumulative: np.ndarray  # int64 [entries + 1]
    kv_block: int

    def visible_tokens(self, tile: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
        """KV tokens of non-empty blocks that overlap ``[begin, end)`` for each tile (blocks
        counted whole: the kernel loads a block whole)."""
        b = self.kv_block
        c0 = np.asarray(begin, dtype=np.int64) // b
        c1 = np.maximum(-(-np.asarray(end, dtype=np.int64) // b), c0)
        base = self.row_start[tile]
        return (self.cumulative[base + c1] - self.cumulative[base + c0]) * b


def summarize(
    tile_map: np.ndarray,
    q_lens: np.ndarray,
    kv_lens: np.ndarray,
    tile_q_tokens: int,
    kv_block: int = TILE_MAP_KV_BLOCK,
) -> TileMapSummary:
    """The ``TileMapSummary`` of a host copy of the map (uint8 ``[entries]``) for requests of
    ``q_lens`` queries and ``kv_lens`` keys, as the host planner ranges and costs tiles by it
    (``attnc_prefill_map_summary``: the planner's ``map_rows``,
    attnc/kernels/host/prefill_plan_ranges.h). ``tile_q_tokens`` and ``kv_block`` are ints
    from 1 to 2**31 - 1, the lengths from 0 to the kernels' token limit (``MAX_KV_TOKENS``)."""
    tile_q_tokens = check_int("tile_q_tokens", tile_q_tokens)
    kv_block = check_int("kv_block", kv_block)
    q = np.ascontiguousarray(q_lens, dtype=np.int64)
    kv = np.ascontiguousarray(kv_lens, dtype=np.int64)
    m = np.ascontiguousarray(tile_map, dtype=np.uint8)
    if q.ndim != 1 or kv.shape != q.shape or m.ndim != 1:
        raise ValueError(
            f"tile map summary: q_lens of shape {list(q.shape)}, kv_lens of shape "
            f"{list(kv.shape)} and a map of shape {list(m.shape)}: expected 1-D, the lengths "
            "of one shape"
        )
    p = prefill_plan_library.PrefillParams(
        batch=q.shape[0], q_lens=q.ctypes.data, kv_lens=kv.ctypes.data, lens_cap=q.shape[0],
        tile_q_tokens=tile_q_tokens, tile_map=m.ctypes.data, tile_map_len=m.shape[0],
        kv_block=kv_block,
    )  # fmt: skip
    summary_of = prefill_plan_library.library().attnc_prefill_map_summary
    counts = np.zeros(2, np.int64)  # query tiles, map entries: sized by a call without room
    rc = summary_of(ctypes.byref(p), counts.ctypes.data, 0, 0, None, None, None, None)
    tiles, entries = int(counts[0]), int(counts[1])
    out = np.zeros((3, tiles), np.int64)  # row_start, first, end
    cumulative = np.zeros(entries + 1, np.int64)
    if rc == PLAN_CAPACITY:  # the counts are known: the call with room for them
        tiles_out = (out[0].ctypes.data, out[1].ctypes.data, out[2].ctypes.data)
        sized = (ctypes.byref(p), counts.ctypes.data, tiles, entries + 1)
        rc = summary_of(*sized, *tiles_out, cumulative.ctypes.data)
    if rc != PLAN_OK:
        raise ValueError(
            f"tile map summary: a map of {m.shape[0]} bytes for {q.shape[0]} requests of "
            f"{tile_q_tokens}-token query tiles and {kv_block}-key blocks: the lengths must be "
            f"from 0 to {MAX_KV_TOKENS} and the map as long as the batch needs"
        )
    return TileMapSummary(out[0], out[1], out[2], cumulative, kv_block)
