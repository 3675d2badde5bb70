"""Owns: the CTAs a prefill plan is scheduled over: how many the device holds at once for a
kernel shape (``device_ctas``) and how many the planner places items for the Hopper kernel's
alternating walk (``walk_ctas``)."""

from __future__ import annotations

import torch

from attnc.runtime.build.modules import PrefillModule
from attnc.runtime.planning.plan_params import MaskReads


def walk_ctas(backend: str, reads: MaskReads, ctas: int) -> int:
    """The planner's ``walk_ctas`` for a plan run by ``backend`` on ``ctas`` CTAs: the Hopper
    kernel takes a list without a tile map by the alternating walk (one CTA an SM), so its
    items are placed for it; a mask that reads token tensors makes its CTAs take items as they
    finish, and the FA2 kernel runs an item a CTA: both keep the heaviest-first list (0)."""
    return ctas if backend == "sm90" and not reads.needs_tile_map else 0


_CTAS: dict[tuple[str, int, int, int, int], int] = {}


def device_ctas(
    module: PrefillModule, device: torch.device, head_dim: int, group: int, max_q: int
) -> int:
    """CTAs of the kernel shape for (group, max_q) the device holds at once (SMs x per SM)."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (module.module_id, index, head_dim, group, module.tile_q_tokens(head_dim, group, max_q))
    found = _CTAS.get(key)
    if found is None:
        with torch.cuda.device(index):
            per_sm = module.ctas_per_sm(head_dim, group, max_q)
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        found = _CTAS[key] = max(per_sm, 1) * sms
    return found
