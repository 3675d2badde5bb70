"""``prefill_launch.build_args`` fills the same ``AttncPrefillArgs`` bytes as a field-by-field
fill from the plan's meta and the tensors (the oracle below), for ragged and paged layouts,
with and without LSE, map and page status; and the kept plan fields never leak from one call
into the next."""

import ctypes
import itertools

import pytest
import torch

from attnc.runtime import abi
from attnc.runtime.checks.page_status import pool_size
from attnc.runtime.wrappers import prefill_launch as pl


def _oracle(meta, tensors, sm_scale, params, params_size):
    q, k, v, o, lse, workspace = tensors
    m = dict(zip(pl.META_FIELDS, meta, strict=True))

    def ptr(t, off=0):
        return None if t is None or off < 0 else t.data_ptr() + off

    if m["kv_layout"] == abi.KV_RAGGED:
        page, tok, head = 0, k.stride(0), k.stride(1)
    elif m["kv_layout"] == abi.KV_PAGED_NHD:
        page, tok, head = k.stride(0), k.stride(1), k.stride(2)
    else:
        page, tok, head = k.stride(0), k.stride(2), k.stride(1)
    return abi.AttncPrefillArgs(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(), lse=ptr(lse),
        qo_indptr=ptr(workspace, m["off_qo_indptr"]), kv_indptr=ptr(workspace, m["off_kv_indptr"]),
        kv_indices=ptr(workspace, m["off_kv_indices"]),
        kv_last_page_len=ptr(workspace, m["off_kv_last_page_len"]),
        items=ptr(workspace, m["off_items"]), merge_items=ptr(workspace, m["off_merge_items"]),
        part_o=ptr(workspace, m["off_part_o"]), part_lse=ptr(workspace, m["off_part_lse"]),
        q_stride_tok=q.stride(0), q_stride_head=q.stride(1),
        o_stride_tok=o.stride(0), o_stride_head=o.stride(1),
        kv_stride_page=page, kv_stride_tok=tok, kv_stride_head=head,
        batch_size=m["batch_size"], num_work=m["num_work"], num_merge=m["num_merge"],
        num_qo_heads=m["num_qo_heads"], num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"],
        page_size=m["page_size"], kv_layout=m["kv_layout"], tile_q_tokens=m["tile_q_tokens"],
        sm_scale=sm_scale, variant_params=ctypes.addressof(params),
        variant_params_size=params_size, page_status=m["page_status"] or None,
        num_pages=pool_size(k.shape[0]),
        kv_token_start=ptr(workspace, m["off_kv_token_start"]),
        tile_map=ptr(workspace, m["off_tile_map"]),
        tile_map_start=ptr(workspace, m["off_tile_map_start"]),
        tile_map_kv_block=m["tile_map_kv_block"],
    )  # fmt: skip


class _Params(ctypes.Structure):
    _fields_ = [("x", ctypes.c_float)]


def _meta(layout, mapped, status, n):
    offs = [0, 64, 128 if layout != abi.KV_RAGGED else -1, 192 if layout != abi.KV_RAGGED else -1]
    return [2, 10 + n, n, 48, 16 if layout != abi.KV_RAGGED else 1, layout, 32, 8, 128,
            *offs, 256, 512, 1024 if n else -1, 2048 if n else -1, status, 4096,
            8192 if mapped else -1, 9000 if mapped else -1, 64]  # fmt: skip


def _tensors(layout, lse):
    q = torch.empty(96, 32, 128, dtype=torch.bfloat16)
    if layout == abi.KV_RAGGED:
        k = torch.empty(300, 8, 128, dtype=torch.bfloat16)
    elif layout == abi.KV_PAGED_NHD:
        k = torch.empty(20, 2, 16, 8, 128, dtype=torch.bfloat16)[:, 0]
    else:
        k = torch.empty(20, 2, 8, 16, 128, dtype=torch.bfloat16)[:, 1]
    v = torch.empty_like(k)  # its own address: a k/v swap shows
    out_lse = torch.empty(96, 32) if lse else None
    o = torch.empty(32, 96, 128, dtype=torch.bfloat16).transpose(0, 1)  # strides unlike q's
    workspace = torch.empty(1 << 16, dtype=torch.uint8)
    return pl.PrefillTensors(q, k, v, o, out_lse, workspace)


@pytest.mark.parametrize(
    "layout,mapped,status,lse,n",
    list(itertools.product(
        [abi.KV_RAGGED, abi.KV_PAGED_NHD, abi.KV_PAGED_HND], [False, True], [0, 12345],
        [False, True], [0, 3],
    )),
)  # fmt: skip
def test_build_args_bytes_equal_the_field_by_field_fill(layout, mapped, status, lse, n):
    meta = _meta(layout, mapped, status, n)
    tensors = _tensors(layout, lse)
    params = _Params(1.5)
    got = pl.build_args(meta, tensors, 0.125, params, 4)
    want = _oracle(meta, tensors, 0.125, params, 4)
    assert bytes(got) == bytes(want)


def test_kept_plan_fields_are_not_changed_by_a_launch():
    """Two launches of one plan on one workspace: the second's per-call fields are its own
    (no LSE now, new pointers and scale), and the kept plan fields stay unset per call."""
    meta = _meta(abi.KV_RAGGED, True, 7, 2)
    first = _tensors(abi.KV_RAGGED, True)
    params = _Params(1.0)
    a = pl.build_args(meta, first, 0.5, params, 4)
    second = first._replace(q=torch.empty_like(first.q), lse=None)
    b = pl.build_args(meta, second, 0.25, params, 4)
    assert a.lse is not None and b.lse is None and b.q != a.q and b.sm_scale == 0.25
    assert bytes(b) == bytes(_oracle(meta, second, 0.25, params, 4))
    kept = pl._plan_fields(tuple(meta), first.workspace.data_ptr())
    assert kept.q is None and kept.lse is None and kept.sm_scale == 0.0
