"""``overlaps_itself`` and ``shares_memory`` (the ``out=`` checks) against brute force over
every element address, on contiguous tensors (their fast path), views with size-1 and
broadcast (zero-stride) dims, transposes, slices and empty tensors."""

import itertools

import pytest
import torch

from attnc.runtime.checks.tensors import overlaps_itself, shares_memory


def _addresses(t):
    if t.numel() == 0:
        return []
    offs = [sum(i * s for i, s in zip(idx, t.stride(), strict=True))
            for idx in itertools.product(*(range(n) for n in t.shape))]  # fmt: skip
    return [t.data_ptr() + o * t.element_size() for o in offs]


def _views():
    base = torch.zeros(4 * 6 * 8, dtype=torch.bfloat16)
    x = base.view(4, 6, 8)
    return {
        "contiguous": x,
        "size-1 dim with odd stride": base[:48].as_strided((6, 1, 8), (8, 999, 1)),
        "transposed": x.transpose(0, 1),
        "sliced": x[:, 1:5, ::2],
        "broadcast": base[:8].view(1, 1, 8).expand(4, 6, 8),
        "zero stride": base[:8].as_strided((3, 8), (0, 1)),
        "overlapping rows": base.as_strided((5, 8), (4, 1)),
        "empty": x[:, :0],
        "second half": x[2:],
        "first half": x[:2],
    }


@pytest.mark.parametrize("name", list(_views()))
def test_overlaps_itself_matches_brute_force(name):
    t = _views()[name]
    addrs = _addresses(t)
    assert overlaps_itself(t) == (len(addrs) != len(set(addrs))), name


@pytest.mark.parametrize("a,b", list(itertools.product(_views(), repeat=2)))
def test_shares_memory_is_conservative(a, b):
    views = _views()  # one base: every pair shares the same storage
    ta, tb = views[a], views[b]
    if set(_addresses(ta)) & set(_addresses(tb)):
        assert shares_memory(ta, tb), (a, b)


def test_shares_memory_of_disjoint_contiguous_halves_is_false():
    views = _views()
    assert not shares_memory(views["first half"], views["second half"])
    assert shares_memory(views["contiguous"], views["second half"])
