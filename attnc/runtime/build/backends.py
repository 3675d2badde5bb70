"""Owns: which prefill kernel template serves a request.

Two templates build from the same generated functor and export the same C ABI
(``attnc/prefill_args.h``): ``"fa2"`` (mma.sync, sm_80 and newer) and ``"sm90"`` (wgmma, TMA and
warp specialisation, sm_90a only). ``"auto"`` (the default) takes ``"sm90"`` on a Hopper GPU for
every request it can serve and ``"fa2"`` otherwise; when it falls back, ``ATTNC_VERBOSE=1``
prints why. Naming a backend forces it: ``"sm90"`` on another arch, or for a request the
template cannot serve, is a ``ValueError`` that says why. ``ATTNC_PREFILL_BACKEND`` sets the
default for the whole process.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from attnc.runtime.build import jit, toolchain
from attnc.runtime.build.modules import (
    PrefillModule,
    get_prefill_module,
    get_prefill_sm90_module,
    sm90_prefill_available,
)
from attnc.runtime.checks.tensors import HEAD_DIMS

PREFILL_BACKENDS = ("auto", "fa2", "sm90")
# KV layouts the Hopper template serves (TMA for ragged tiles, a cp.async gather for pages).
SM90_KV_LAYOUTS = ("ragged", "paged")
SM90_HEAD_DIMS = HEAD_DIMS  # every head dim the runtime takes


@dataclass(frozen=True)
class PrefillChoice:
    """The module that serves a plan and its query tile (query tokens per work item)."""

    backend: str
    module: PrefillModule
    tile_q_tokens: int


def check_backend(backend: object) -> str:
    """``backend`` as given, checked (``None`` means the process default)."""
    name = "backend"
    if backend is None:
        name = "ATTNC_PREFILL_BACKEND (the default backend)"
        backend = os.environ.get("ATTNC_PREFILL_BACKEND", "auto") or "auto"
    if not isinstance(backend, str) or backend not in PREFILL_BACKENDS:
        raise ValueError(
            f"{name}: expected one of {', '.join(map(repr, PREFILL_BACKENDS))}, got {backend!r}"
        )
    return backend


def _sm90_refusal(kv_layout: str, head_dim: int, device: torch.device) -> str | None:
    """Why the Hopper template cannot serve this request (``None``: it can)."""
    if device.type != "cuda":
        return "the workspace is not on a CUDA device"
    if torch.cuda.get_device_capability(device)[0] != 9:
        return "the GPU is not a Hopper (sm_90) part"
    if not sm90_prefill_available():
        return "this install has no Hopper prefill template"
    if kv_layout not in SM90_KV_LAYOUTS:
        return f"{kv_layout} KV is not served by the Hopper template yet"
    if head_dim not in SM90_HEAD_DIMS:
        return f"head_dim {head_dim} is not served by the Hopper template"
    return None


def _arch_of(device: torch.device) -> str | None:
    """The arch to build for ``device`` (the workspace's GPU, which need not be the current
    one); None (the current device's) for a device that is not a GPU, which needs one present."""
    if device.type == "cuda":
        return toolchain.device_arch(device)
    if not torch.cuda.is_available():
        raise ValueError(
            f"workspace_buffer: on the {device.type} and this host has no CUDA device to build "
            "the prefill kernel for; put the workspace on a CUDA device"
        )
    return None


def choose_prefill_module(
    ir: object,
    backend: str,
    *,
    dtype: torch.dtype,
    head_dim: int,
    group: int,
    max_q_len: int,
    kv_layout: str,
    device: torch.device,
) -> PrefillChoice:
    """The prefill module for a plan: the Hopper one where ``backend`` allows and it serves
    the request, else FA2 (with the reason on stderr under ``ATTNC_VERBOSE``)."""
    hopper: PrefillModule | None = None  # the Hopper module, where it was asked
    if backend != "fa2":
        refusal = _sm90_refusal(kv_layout, head_dim, device)
        if refusal is None:
            hopper = get_prefill_sm90_module(ir, dtype, head_dim, "90a")
            tile = hopper.tile_q_tokens(head_dim, group, max_q_len)
            if tile > 0:
                return PrefillChoice("sm90", hopper, tile)
            refusal = f"no Hopper tile for head_dim {head_dim}, GQA group {group}"
        if backend == "sm90":
            raise ValueError(f"backend: 'sm90' cannot serve this request: {refusal}")
        if jit.verbose():
            print(f"attnc: prefill on the FA2 template: {refusal}", file=sys.stderr)
    module = get_prefill_module(ir, dtype, head_dim, _arch_of(device))
    tile = module.tile_q_tokens(head_dim, group, max_q_len)
    if tile < 1:
        raise ValueError(_group_refusal(module, hopper, head_dim, group))
    return PrefillChoice("fa2", module, tile)


def _group_refusal(
    fa2: PrefillModule, hopper: PrefillModule | None, head_dim: int, group: int
) -> str:
    """Why no prefill tile serves a GQA group: its query heads per KV head fill more rows than
    the widest query tile of the templates asked holds (a tile's rows are query tokens x the
    group; the Hopper template, where it runs, was asked first)."""
    widest = f"FA2's widest: {_widest_rows(fa2, head_dim)} rows"
    if hopper is not None:
        widest += f", the Hopper template's: {_widest_rows(hopper, head_dim)}"
    return (
        f"num_qo_heads / num_kv_heads: a GQA group of {group} query heads per KV head does "
        f"not fit the prefill kernels' query tiles ({widest}, at head_dim {head_dim})"
    )


def _widest_rows(module: PrefillModule, head_dim: int) -> int:
    """The rows of the module's widest query tile: one head per KV head, a long query."""
    return module.tile_q_tokens(head_dim, 1, 1 << 30)


def prebuild_prefill_module(
    ir: object,
    backend: str,
    *,
    dtype: torch.dtype,
    head_dim: int,
    kv_layout: str,
    device: torch.device,
) -> None:
    """Build (or find) the module ``choose_prefill_module`` takes for these arguments before
    the query tile is known: the Hopper one where the template serves the request, else FA2
    (nothing for ``backend="sm90"`` when refused: the choice raises that). Only the rare
    request whose GQA group fits no Hopper tile falls back to FA2 after this."""
    if backend != "fa2" and _sm90_refusal(kv_layout, head_dim, device) is None:
        get_prefill_sm90_module(ir, dtype, head_dim, "90a")
    elif backend != "sm90":
        get_prefill_module(ir, dtype, head_dim, _arch_of(device))
