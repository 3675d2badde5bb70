"""Tensor reads of the score and the mask under compute-sanitizer's memcheck.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python tests/gpu/kernel_harness/memcheck_reads.py

(each tensor its own allocation, so a read past one is reported). The variant reads a
per-token tensor by key in its score (`w[kv_idx]`: the tail tile's keys past the request's end
must not read past `w`), a 64-entry tensor at every key and at indices read from another
tensor and a scalar param (bounds-checked reads), through both prefill templates and decode.
Prints each kernel's relative error against float64; memcheck prints the bad reads.
"""

import torch

import attnc
from attnc.runtime.wrappers.decode import BatchDecodeWrapper

SOURCE = """
variant memcheck_reads {
    param w: tensor<f32>[kv_len];
    param t: tensor<f32>[64];
    param idx: tensor<i32>[kv_len];
    param s: i32 = 0;
    score = score + w[kv_idx] + t[kv_idx] * 0.5 + t[idx[kv_idx]] * 0.25 + t[s];
    mask = kv_idx <= q_pos;
}
"""


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


def main() -> None:
    variant = attnc.load(source=SOURCE)
    hq, hkv, d = 8, 2, 128
    g = torch.Generator().manual_seed(1)
    for q_len, kv_len in ((300, 701), (1, 90)):
        q = torch.randn(q_len, hq, d, generator=g).to("cuda", torch.bfloat16)
        k = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
        v = torch.randn(kv_len, hkv, d, generator=g).to("cuda", torch.bfloat16)
        p = {
            "w": torch.randn(kv_len, generator=g).cuda(),
            "t": torch.randn(64, generator=g).cuda(),
            "idx": torch.randint(-100, 200, (kv_len,), generator=g).int().cuda(),
            "s": 1000,
        }
        ref = variant.reference(q.double(), k.double(), v.double(), **p)
        for backend in ("fa2", "sm90"):
            o = variant.prefill(q, k, v, backend=backend, **p)
            torch.cuda.synchronize()
            print(f"prefill {backend} {q_len}x{kv_len}: {_rel(o, ref):.2e}", flush=True)
    page, lens = 16, [700, 40, 1]
    pages = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
    ids = torch.arange(int(indptr[-1]), dtype=torch.int32)
    last = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
    cache = torch.randn(int(indptr[-1]), 2, page, hkv, d, generator=g).to("cuda", torch.bfloat16)
    q = torch.randn(len(lens), hq, d, generator=g).to("cuda", torch.bfloat16)
    total = sum(lens)
    p = {
        "w": torch.randn(total, generator=g).cuda(),
        "t": torch.randn(64, generator=g).cuda(),
        "idx": torch.randint(-100, 200, (total,), generator=g).int().cuda(),
        "s": -5,
    }
    wrapper = BatchDecodeWrapper(variant, torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    wrapper.plan(indptr, ids, last, hq, hkv, d, page)
    o = wrapper.run(q, cache, **p)
    torch.cuda.synchronize()
    start = 0
    for b, n in enumerate(lens):
        kv = cache[int(indptr[b]) : int(indptr[b + 1])]
        k, v = (kv[:, i].reshape(-1, hkv, d)[:n] for i in (0, 1))
        mine = {**p, "w": p["w"][start : start + n], "idx": p["idx"][start : start + n]}
        ref = variant.reference(q[b : b + 1].double(), k.double(), v.double(), **mine)
        print(f"decode request {b} ({n} keys): {_rel(o[b : b + 1], ref):.2e}", flush=True)
        start += n


if __name__ == "__main__":
    main()
