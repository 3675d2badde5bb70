"""Planner (work list order, paged lengths, workspace packing) and host-side validation."""

import shutil as _shutil

import pytest
import torch
from prefill_plan_helpers import PlanShape, kv_lengths_paged, make_host_plan
from prefill_schedule_oracle import pack_int32

from attnc.runtime.checks import tensors
from attnc.runtime.checks.kv import paged_kv, ragged_kv
from attnc.runtime.planning import workspace

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(_shutil.which("nvcc") is None, reason="nvcc not found (host planner)"),
]


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def test_kv_lengths_paged():
    kv_indptr = torch.tensor([0, 3, 3, 4])
    last = torch.tensor([2, 9, 16])
    assert kv_lengths_paged(kv_indptr, last, 16).tolist() == [34, 0, 16]


def test_workspace_layout_and_pack():
    layout = workspace.place_int32({"a": 3, "b": 65, "c": 0, "d": 1})
    assert layout.offsets == {"a": 0, "b": 256, "c": 768, "d": 768}
    assert layout.total_bytes == 1024
    buf = pack_int32(layout, {"a": torch.tensor([1, 2, 3]), "d": torch.tensor([-7])})
    assert buf[0:12].view(torch.int32).tolist() == [1, 2, 3]
    assert buf[768:772].view(torch.int32).tolist() == [-7]


def test_make_host_plan_paged():
    shape = PlanShape(4, 2, 64, tile_q_tokens=16, num_ctas=264, workspace_bytes=1 << 20)
    host = make_host_plan(
        torch.tensor([0, 3, 20]), torch.tensor([0, 2, 3]), torch.tensor([4, 1, 7]),
        torch.tensor([5, 1]), 8, shape,
    )  # fmt: skip
    assert host.kv_lens.tolist() == [13, 1]
    # (request, q tile, kv head) heaviest first: request 1's two tiles cost 16+1 and 1+1.
    items = host.schedule.items[:, :3].tolist()
    assert items == [[1, 0, 0], [1, 0, 1], [0, 0, 0], [0, 0, 1], [1, 1, 0], [1, 1, 1]]
    assert host.max_page == 7 and host.paged and host.qo_indptr.size == 3
    assert host.schedule.num_items == 6
    assert host.schedule.num_merge == 0
    buf = host.packed()
    off = host.layout.offsets
    assert buf[off["kv_indices"] : off["kv_indices"] + 12].view(torch.int32).tolist() == [4, 1, 7]
    items_bytes = buf[off["items"] : off["items"] + 6 * 32].view(torch.int32).view(6, 8)
    assert items_bytes[:, :3].tolist() == items


def test_make_host_plan_workspace_too_small():
    shape = PlanShape(4, 2, 64, tile_q_tokens=16, num_ctas=264, workspace_bytes=512)
    with pytest.raises(ValueError, match="workspace_buffer: has 512 bytes, the work lists need"):
        make_host_plan(torch.tensor([0, 3]), torch.tensor([0, 3]), None, None, 1, shape)


@pytest.mark.parametrize(
    ("indptr", "message"),
    [
        (i32(1, 2), "qo_indptr: must start at 0, got 1"),
        (i32(0, 5, 3), "qo_indptr: must be non-decreasing, but qo_indptr[2]=3 < qo_indptr[1]=5"),
        (torch.tensor([0, 1]), "qo_indptr: dtype must be torch.int32, got torch.int64"),
        (i32(0, 1).reshape(1, 2), "qo_indptr: must be 1-D, got shape [1, 2]"),
        (i32(), "qo_indptr: needs at least one entry (batch + 1)"),
    ],
)
def test_bad_indptr(indptr, message):
    with pytest.raises(ValueError) as e:
        tensors.check_indptr("qo_indptr", indptr)
    assert str(e.value) == message


def test_kv_indices_checks():
    with pytest.raises(ValueError, match="kv_indices: has 2 entries, but kv_indptr\\[-1\\] = 3"):
        tensors.check_kv_indices(i32(0, 1), 3)
    with pytest.raises(ValueError, match="kv_indices: page index -1 is negative"):
        tensors.check_kv_indices(i32(0, -1), 2)
    assert tensors.check_kv_indices(i32(3, 1, 99), 2).tolist() == [3, 1]
    with pytest.raises(ValueError) as e:
        tensors.check_pages_in_range(8, 8)
    assert str(e.value) == "kv_indices: page index 8 out of range for a cache of 8 pages"


def test_last_page_len_checks():
    kv_indptr = torch.tensor([0, 2, 2])
    assert tensors.check_last_page_len(i32(16, 0), kv_indptr, 16).tolist() == [16, 0]
    with pytest.raises(ValueError) as e:
        tensors.check_last_page_len(i32(17, 0), kv_indptr, 16)
    assert str(e.value) == "kv_last_page_len: kv_last_page_len[0]=17 is outside [1, page_size=16]"
    with pytest.raises(ValueError, match="kv_last_page_len: expected 2 entries, got 1"):
        tensors.check_last_page_len(i32(3), kv_indptr, 16)


def test_heads():
    tensors.check_heads(8, 2, 128)
    with pytest.raises(ValueError, match="head_dim: must be one of \\[64, 128, 256\\], got 96"):
        tensors.check_heads(8, 2, 96)
    with pytest.raises(ValueError, match="num_qo_heads: 6 is not a multiple of num_kv_heads 4"):
        tensors.check_heads(6, 4, 64)


def test_data_tensor_checks():
    q = torch.zeros(3, 2, 64, dtype=torch.bfloat16)
    assert tensors.check_data_tensor("q", q, (3, 2, 64), "cpu") is q
    with pytest.raises(ValueError, match="q: must be on a cuda device, got cpu"):
        tensors.check_data_tensor("q", q, (3, 2, 64))
    with pytest.raises(
        ValueError, match="q: dtype must be torch.bfloat16 or torch.float16, got torch.float32"
    ):
        tensors.check_data_tensor("q", q.float(), (3, 2, 64), "cpu")
    with pytest.raises(ValueError, match="q: expected shape \\[3, 4, 64\\], got \\[3, 2, 64\\]"):
        tensors.check_data_tensor("q", q, (3, 4, 64), "cpu")
    strided = torch.zeros(3, 2, 128, dtype=torch.float16)[..., ::2]
    with pytest.raises(ValueError, match="q: the last dim must be contiguous"):
        tensors.check_data_tensor("q", strided, (3, 2, 64), "cpu")
    with pytest.raises(
        ValueError, match="k: dtype torch.float16 differs from q dtype torch.bfloat16"
    ):
        tensors.check_same_kind("k", strided, "q", q)


def test_ragged_and_paged_kv_views():
    k = torch.zeros(5, 2, 64, dtype=torch.float16)
    views = ragged_kv((k, k.clone()), 2, 64, "cpu")
    assert views.layout == 0 and views.k.shape == (5, 2, 64)
    with pytest.raises(ValueError, match="v: expected shape \\[5, 2, 64\\], got \\[4, 2, 64\\]"):
        ragged_kv((k, k[:4]), 2, 64, "cpu")
    nhd = torch.zeros(7, 2, 16, 2, 64, dtype=torch.float16)
    views = paged_kv(nhd, "NHD", 16, 2, 64, "cpu")
    assert (views.layout, views.num_pages) == (1, 7)
    assert views.v.data_ptr() == nhd[:, 1].data_ptr()
    hnd = torch.zeros(7, 2, 16, 64, dtype=torch.float16)
    views = paged_kv((hnd, hnd.clone()), "HND", 16, 2, 64, "cpu")
    assert views.layout == 2
    with pytest.raises(
        ValueError, match="kv: expected shape \\[\\*, 2, 16, 2, 64\\], got \\[7, 2, 2, 16, 64\\]"
    ):
        paged_kv(torch.zeros(7, 2, 2, 16, 64, dtype=torch.float16), "NHD", 16, 2, 64, "cpu")
