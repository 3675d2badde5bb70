"""Packed documents (examples/packed_documents.attn): 8 documents of random lengths packed
into one training sequence, causal inside each document. The fp64 reference of the packed
sequence equals plain causal attention run on each document alone; on a GPU the kernel runs
the packed sequence (single prefill, and BatchPrefillWrapper with the tile map built by plan).

    python examples/packed_documents.py
"""

from __future__ import annotations

from pathlib import Path

import torch

import attnc
from attnc.runtime.reference import request_reference

SPEC = str(Path(__file__).with_name("packed_documents.attn"))
HEADS_QO, HEADS_KV, HEAD_DIM, TOKENS, DOCS = 8, 2, 64, 512, 8


def document_ids(g: torch.Generator) -> tuple[torch.Tensor, list[int]]:
    cuts = sorted(torch.randperm(TOKENS - 1, generator=g)[: DOCS - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, TOKENS], strict=True)]
    ids = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])
    return ids, lengths


def main() -> None:
    g = torch.Generator().manual_seed(0)
    doc, lengths = document_ids(g)
    q = torch.randn(TOKENS, HEADS_QO, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(TOKENS, HEADS_KV, HEAD_DIM, generator=g, dtype=torch.float64)
    v = torch.randn(TOKENS, HEADS_KV, HEAD_DIM, generator=g, dtype=torch.float64)
    variant = attnc.load(SPEC)
    print(variant, "-", f"documents of {lengths} tokens")
    packed = request_reference(variant, q, k, v, doc=doc)
    causal = attnc.load("stdlib:causal")
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    alone = torch.cat(
        [
            causal.reference(q[a:b], k[a:b], v[a:b])
            for a, b in zip(starts[:-1], starts[1:], strict=True)
        ]
    )
    err = (packed - alone).abs().max().item()
    print(f"packed reference vs causal per document: {err:.2e}")
    assert err < 1e-12
    if not torch.cuda.is_available():
        print("no CUDA device: the kernels were not run")
        return
    dt, dev = torch.bfloat16, "cuda"
    qd, kd, vd, docd = q.to(dev, dt), k.to(dev, dt), v.to(dev, dt), doc.to(dev)
    out = variant.prefill(qd, kd, vd, doc=docd)
    err = (out.double().cpu() - packed).abs().max().item()
    print(f"CUDA single prefill vs reference: {err:.2e}")
    assert err < 5e-2
    wrapper = attnc.BatchPrefillWrapper(
        variant, torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    )
    indptr = torch.tensor([0, TOKENS], dtype=torch.int32, device=dev)
    wrapper.plan(indptr, indptr, HEADS_QO, HEADS_KV, HEAD_DIM, dtype=dt, params={"doc": docd})
    out = wrapper.run(qd, (kd, vd), doc=docd)
    err = (out.double().cpu() - packed).abs().max().item()
    print(f"CUDA BatchPrefillWrapper vs reference: {err:.2e}")
    assert err < 5e-2


if __name__ == "__main__":
    main()
