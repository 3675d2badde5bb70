"""Per-request prefix-LM windows in one batch (examples/prefix_lm_windows.attn): each request
has its own prefix length, read as prefix[batch]. The fp64 reference of request b equals the
stdlib prefix_lm reference with prefix_len = prefix[b]; on a GPU one BatchPrefillWrapper runs
the whole ragged batch (plan sizes each request's KV ranges from the per-request values).

    python examples/prefix_lm_windows.py
"""

from __future__ import annotations

from pathlib import Path

import torch

import attnc
from attnc.runtime.reference import request_reference

SPEC = str(Path(__file__).with_name("prefix_lm_windows.attn"))
HEADS_QO, HEADS_KV, HEAD_DIM = 8, 2, 64
Q_LENS, KV_LENS = [40, 1, 96, 17], [40, 200, 96, 300]
PREFIX = [8, 150, 0, 64]


def main() -> None:
    g = torch.Generator().manual_seed(0)
    variant = attnc.load(SPEC)
    prefix_lm = attnc.load("stdlib:prefix_lm")
    prefix = torch.tensor(PREFIX, dtype=torch.int32)
    q = torch.randn(sum(Q_LENS), HEADS_QO, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(sum(KV_LENS), HEADS_KV, HEAD_DIM, generator=g, dtype=torch.float64)
    v = torch.randn(sum(KV_LENS), HEADS_KV, HEAD_DIM, generator=g, dtype=torch.float64)
    qo = [0, *torch.tensor(Q_LENS).cumsum(0).tolist()]
    kv = [0, *torch.tensor(KV_LENS).cumsum(0).tolist()]
    refs = []
    for b in range(len(Q_LENS)):
        qs, ks = slice(qo[b], qo[b + 1]), slice(kv[b], kv[b + 1])
        ref = request_reference(variant, q[qs], k[ks], v[ks], prefix=prefix, batch=b)
        same = prefix_lm.reference(q[qs], k[ks], v[ks], prefix_len=PREFIX[b])
        err = (ref - same).abs().max().item()
        print(f"request {b} (prefix {PREFIX[b]}): reference vs prefix_lm: {err:.2e}")
        assert err < 1e-12
        refs.append(ref)
    if not torch.cuda.is_available():
        print("no CUDA device: the kernels were not run")
        return
    dt, dev = torch.bfloat16, "cuda"
    wrapper = attnc.BatchPrefillWrapper(
        variant, torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    )
    qo_indptr = torch.tensor(qo, dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor(kv, dtype=torch.int32, device=dev)
    prefix_d = prefix.to(dev)
    wrapper.plan(
        qo_indptr, kv_indptr, HEADS_QO, HEADS_KV, HEAD_DIM, dtype=dt, params={"prefix": prefix_d}
    )
    out = wrapper.run(q.to(dev, dt), (k.to(dev, dt), v.to(dev, dt)), prefix=prefix_d)
    err = (out.double().cpu() - torch.cat(refs)).abs().max().item()
    print(f"CUDA BatchPrefillWrapper (whole batch) vs reference: {err:.2e}")
    assert err < 5e-2


if __name__ == "__main__":
    main()
