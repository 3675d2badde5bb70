"""Threads and shared workspaces on the device: ``Variant.prefill`` from two threads, each on
a stream of its own, with per-token document ids (a tile map each call), gives each call its
own documents' attention; two wrappers given one CUDA workspace are refused at ``run()``."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

import attnc
from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

HQ, HKV, D, LEN = 8, 2, 128, 512
CALLS = 150  # per thread
DOC_CAUSAL = """variant doc_causal {
    param doc: tensor<i32>[kv_len];
    mask = kv_idx <= q_pos && doc[kv_idx] == doc[q_pos];
}"""


def _qkv(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(LEN, h, D, generator=gen).to("cuda", torch.bfloat16) for h in (HQ, HKV, HKV)
    )


def _docs(cuts: list[int]) -> torch.Tensor:
    ids = torch.zeros(LEN, dtype=torch.int32)
    for i, cut in enumerate(cuts):
        ids[cut:] = i + 1
    return ids.cuda()


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2))


def test_variant_prefill_from_two_threads_on_their_own_streams() -> None:
    variant = attnc.load(source=DOC_CAUSAL)
    cases = []
    for seed, cuts in ((1, [100, 300]), (2, [37]), (3, [200, 201, 400]), (4, [])):
        q, k, v = _qkv(seed)
        doc = _docs(cuts)
        cases.append((q, k, v, doc, variant.reference(q, k, v, doc=doc)))
    torch.cuda.synchronize()
    results: dict[str, list[tuple[int, torch.Tensor]]] = {"a": [], "b": []}

    def calls(name: str, mine: list[tuple]) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for i in range(CALLS):
                q, k, v, doc, _ = mine[i % 2]
                results[name].append((i % 2, variant.prefill(q, k, v, doc=doc)))
        stream.synchronize()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between a call's plan and its launch
    try:
        threads = [
            threading.Thread(target=calls, args=("a", cases[:2])),
            threading.Thread(target=calls, args=("b", cases[2:])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    torch.cuda.synchronize()
    first = {"a": 0, "b": 2}
    wrong = [
        f"thread {name} call {i}"
        for name, outs in results.items()
        for i, (which, got) in enumerate(outs)
        if not _close(got, cases[first[name] + which][4])
    ]
    assert len(results["a"]) == len(results["b"]) == CALLS
    assert wrong == []


def test_two_wrappers_on_one_cuda_workspace() -> None:
    variant = attnc.load("stdlib:causal")
    workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    a, b = BatchPrefillWrapper(variant, workspace), BatchPrefillWrapper(variant, workspace)
    one = torch.tensor([0, LEN], dtype=torch.int32)
    two = torch.tensor([0, LEN // 2, LEN], dtype=torch.int32)
    a.plan(one, one, HQ, HKV, D)
    b.plan(two, two, HQ, HKV, D)
    q, k, v = _qkv(5)
    with pytest.raises(RuntimeError, match="workspace_buffer: another wrapper's plan"):
        a.run(q, (k, v))
    a.plan(one, one, HQ, HKV, D)
    assert _close(a.run(q, (k, v)), variant.reference(q, k, v))
