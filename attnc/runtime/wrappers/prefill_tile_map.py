"""Owns: the tile map step of ``BatchPrefillWrapper.plan()`` for a mask that reads per-token
tensors: the param values the classifier needs, the map's place in the workspace, its build
(the module's ``attnc_build_tile_map`` on the device, or a host builder for a CPU workspace)
and the host copy the planner ranges and costs tiles by, through a pinned staging buffer the
wrapper keeps (``PinnedStaging``); or, for a plan that does not wait for the map
(``queue_tile_map``), the plan's copy, the classifier and the device step that cuts and orders
the planned items by the map, queued on the stream in one call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnc.runtime.abi import TILE_MAP_KV_BLOCK
from attnc.runtime.checks.params import TORCH_DTYPES, declared_shape
from attnc.runtime.planning import prefill_plan
from attnc.runtime.planning.plan_params import MaskReads, plan_value
from attnc.runtime.planning.tensor_stamps import own_write
from attnc.runtime.planning.tile_map import (
    AttncItemOrderArgs,
    AttncPlanUpload,
    AttncTileMapArgs,
    AttncTileMapCopies,
    build_on_device,
    point_into_workspace,
    queue_on_device,
)
from attnc.runtime.planning.workspace import ALIGN, ITEM_INTS, aligned
from attnc.runtime.wrappers import prefill_launch
from attnc.runtime.wrappers.cuda_stream import raw_stream

if TYPE_CHECKING:
    from attnc.runtime.variant import Variant

DEFAULT_MAP_SHARE = 8  # the map may take 1/8 of the workspace by default
DEFAULT_MAP_MAX = 64 << 20

# (values, q_lens, kv_lens, tile_q_tokens, kv_block) -> uint8 map: builds the map on the CPU
# (tests; a CPU workspace cannot launch the classifier).
HostMapBuilder = Callable[[Mapping[str, object], np.ndarray, np.ndarray, int, int], np.ndarray]


def default_map_reserve(workspace_bytes: int, reads: MaskReads) -> int:
    """Workspace bytes kept for the tile map at its end (0 when the mask needs no map)."""
    if not reads.needs_tile_map:
        return 0
    return min(workspace_bytes // DEFAULT_MAP_SHARE, DEFAULT_MAP_MAX) // ALIGN * ALIGN


def map_values(
    variant: Variant,
    reads: MaskReads,
    scalars: Mapping[str, object],
    tensors: Mapping[str, torch.Tensor],
    sizes: Mapping[str, int],
    device: torch.device,
) -> dict[str, object] | None:
    """One value per param for the classifier's ``Params`` struct, or None when the mask
    reads a param ``plan()`` was not given (then no map: tiles keep their closed-form
    classes). Params the mask does not read get placeholders: zeros (a zero tensor of the
    declared shape, so any read the functor's hoisting does stays in bounds)."""
    values: dict[str, object] = {}
    for decl in variant.params:
        given = plan_value(decl, scalars, tensors)
        if given is None:
            if decl.name in reads.params:
                return None
            if decl.kind == "tensor":
                shape = declared_shape(decl, sizes)
                given = torch.zeros(shape, dtype=TORCH_DTYPES[decl.dtype], device=device)
            else:
                given = {"f32": 0.0, "i32": 0, "bool": False}[decl.dtype]
        values[decl.name] = given
    return values


@dataclass(frozen=True)
class MapInputs:
    """What the map step needs from ``plan()``: the checked host index arrays and shape."""

    qo_indptr: torch.Tensor  # CPU int32 [batch + 1]
    kv_indptr: torch.Tensor  # CPU int32 [batch + 1]
    q_lens: np.ndarray  # int64 [batch] (the planner's buffers: read at once)
    kv_lens: np.ndarray  # int64 [batch]
    map_starts: np.ndarray  # int64 [batch + 1]: PrefillPlanner.map_starts of the lengths
    tile_q_tokens: int
    heads: tuple[int, int, int]  # num_qo_heads, num_kv_heads, head_dim
    sm_scale: float


class PinnedStaging:
    """A wrapper's page-locked host buffer for the map step's copies (the head lists up, the
    map down), grown when a plan needs more; reused after the step's synchronisation. Its
    numpy views are kept with it (making them costs more than the copies they feed)."""

    def __init__(self) -> None:
        self.tensor = torch.empty(0, dtype=torch.uint8, device="cpu")
        self.bytes = np.empty(0, dtype=np.uint8)
        self.words = np.empty(0, dtype=np.int32)

    def get(self, nbytes: int) -> torch.Tensor:
        """At least ``nbytes`` pinned bytes (the contents are undefined)."""
        if self.tensor.numel() < nbytes:
            size = max(nbytes, 2 * self.tensor.numel()) // ALIGN * ALIGN + ALIGN
            self.tensor = torch.empty(size, dtype=torch.uint8, pin_memory=True, device="cpu")
            self.bytes = self.tensor.numpy()
            self.words = self.bytes.view(np.int32)
        return self.tensor


def build_tile_map(
    module: object,
    workspace: torch.Tensor,
    inputs: MapInputs,
    values: Mapping[str, object],
    reads: MaskReads,
    map_reserve: int,
    host_builder: HostMapBuilder | None = None,
    staging: PinnedStaging | None = None,
    host_workspace: np.ndarray | None = None,
    writing: Callable[[], None] = lambda: None,
) -> np.ndarray:
    """Build the map into the workspace's map region; return its uint8 host copy
    (``host_workspace``: the numpy view of a CPU workspace). ``writing`` is called once the
    map is known to fit, before the region is first written: a refusal before it leaves the
    region (and so the plan reading it) as it was."""
    starts = inputs.map_starts
    entries = int(starts[-1])
    prefill_plan.check_map_fits(entries, map_reserve)
    offset = prefill_plan.map_region_offset(workspace.numel(), map_reserve)
    if host_builder is not None or not workspace.is_cuda:
        if host_builder is None:
            raise ValueError("tile map: a CPU workspace needs a host map builder")
        q_lens, kv_lens = inputs.q_lens.copy(), inputs.kv_lens.copy()
        host = np.asarray(
            host_builder(values, q_lens, kv_lens, inputs.tile_q_tokens, TILE_MAP_KV_BLOCK),
            dtype=np.uint8,
        )
        host = np.ascontiguousarray(host[:entries])
        writing()
        if workspace.device.type == "cpu":
            view = host_workspace if host_workspace is not None else workspace.numpy()
            view[offset : offset + entries] = host
        else:
            region = workspace[offset : offset + entries]
            own_write(region, lambda: region.copy_(torch.from_numpy(host)))
        return host
    staging = staging if staging is not None else PinnedStaging()
    writing()
    return _launch(module, workspace, inputs, starts, values, reads, offset, staging)


def classifier_args(
    module: object, inputs: MapInputs, values: Mapping[str, object], reads: MaskReads
) -> tuple[AttncTileMapArgs, object]:
    """The classifier's arguments (device pointers unset) and the packed variant params they
    point to (keep it alive until the launch returns)."""
    batch = inputs.qo_indptr.shape[0] - 1
    params = prefill_launch.pack_params(module, values)  # type: ignore[arg-type]
    hq, hkv, d = inputs.heads
    args = AttncTileMapArgs(
        variant_params=ctypes.addressof(params),
        variant_params_size=ctypes.sizeof(params),
        batch_size=batch,
        num_qo_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        tile_q_tokens=inputs.tile_q_tokens,
        kv_block=TILE_MAP_KV_BLOCK,
        mask_heads=hq if reads.reads_heads else 1,
        num_entries=int(inputs.map_starts[-1]),
        sm_scale=inputs.sm_scale,
    )
    return args, params


def queue_tile_map(
    module: object,
    workspace: torch.Tensor,
    inputs: MapInputs,
    values: Mapping[str, object],
    reads: MaskReads,
    map_reserve: int,
    plan: tuple[int, int, Mapping[str, int], int],
) -> bool:
    """Queue on the workspace's current stream, in one call into the module: the plan's
    packed lists copied to the workspace (``plan``: the address and bytes of the page-locked
    buffer holding them, their regions, the item count), the classifier into the map region,
    then the step that cuts each item's KV range to its map row and orders the items by their
    non-EMPTY columns (cut into scratch bytes after the map, then written back in order).
    Nothing waits. False (nothing queued) when the map and the scratch do not fit in
    ``map_reserve``: the caller copies the plan, builds the map and waits instead."""
    lists, lists_bytes, regions, num_items = plan
    entries = int(inputs.map_starts[-1])
    scratch = aligned(entries)
    if scratch + 4 * ITEM_INTS * num_items > map_reserve:
        return False
    offset = prefill_plan.map_region_offset(workspace.numel(), map_reserve)
    base = workspace.data_ptr()
    args, params = classifier_args(module, inputs, values, reads)
    point_into_workspace(args, base, {**regions, "tile_map": offset})
    order = AttncItemOrderArgs(
        items=base + regions["items"],
        scratch=base + offset + scratch,
        tile_map=args.tile_map,
        tile_map_start=args.tile_map_start,
        kv_token_start=args.kv_token_start,
        num_items=num_items,
        batch_size=inputs.qo_indptr.shape[0] - 1,
        kv_block=TILE_MAP_KV_BLOCK,
    )
    upload = AttncPlanUpload(host=lists, device=base, bytes=lists_bytes)
    queue_on_device(module, args, order, upload, raw_stream(workspace.device))
    del params  # copied by the launch
    return True


def _launch(
    module: object,
    workspace: torch.Tensor,
    inputs: MapInputs,
    starts: np.ndarray,
    values: Mapping[str, object],
    reads: MaskReads,
    offset: int,
    staging: PinnedStaging,
) -> np.ndarray:
    """Copy the head lists, launch the classifier, copy the map back and wait (one call into
    the module), through ``staging``: the head lists at its start, the map after them."""
    batch = inputs.qo_indptr.shape[0] - 1
    head = prefill_plan.head_layout(batch)
    entries = int(starts[-1])
    args, params = classifier_args(module, inputs, values, reads)
    pinned = staging.get(head.total_bytes + entries)
    words = staging.words
    offsets = head.offsets
    words[: head.total_bytes // 4] = 0
    words[offsets["qo_indptr"] // 4 :][: batch + 1] = inputs.qo_indptr.numpy()
    words[offsets["kv_indptr"] // 4 :][: batch + 1] = inputs.kv_indptr.numpy()
    kv_start = words[offsets["kv_token_start"] // 4 :][: batch + 1]
    kv_start[0] = 0
    np.cumsum(inputs.kv_lens, out=kv_start[1:])
    words[offsets["tile_map_start"] // 4 :][: batch + 1] = starts
    base = pinned.data_ptr()
    copies = AttncTileMapCopies(
        heads_host=base,
        heads_device=workspace.data_ptr(),
        heads_bytes=head.total_bytes,
        map_host=base + head.total_bytes,
    )
    stream = raw_stream(workspace.device)
    build_on_device(
        module,
        workspace.data_ptr(),
        {**offsets, "tile_map": offset},
        args,
        stream,
        copies,
    )  # the one synchronisation of a plan with a map
    return staging.bytes[head.total_bytes : head.total_bytes + entries]
