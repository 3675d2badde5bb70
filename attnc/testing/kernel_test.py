"""``attnc test`` with a GPU: the prefill kernels against the float64 reference.

Accuracy rule (as in tests/gpu): ||o - ref64|| / ||ref64|| must be at most 3x the error of
the reference run in the kernel's dtype, plus 1e-3; the output is poisoned with NaN first so
unwritten elements fail.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attnc.compiler import ir
from attnc.compiler.pipeline import Compiled

SHAPES = (  # (q_len, kv_len, layout, page_size)
    (17, 17, "ragged", 1),
    (1, 577, "paged", 16),
    (127, 300, "ragged", 1),
    (64, 2049, "paged", 5),
)


@dataclass
class KernelTestReport:
    """Relative errors of the kernels on each shape (and the bound they had to meet)."""

    name: str
    rows: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every kernel's error within its bound."""
        return all(err <= bound for _, err, bound in self.rows)

    def summary(self) -> str:
        """One line: the verdict and each kernel's error against its bound."""
        status = "ok" if self.ok else "FAILED"
        cells = "; ".join(f"{what}: {err:.2e} (<= {bound:.2e})" for what, err, bound in self.rows)
        return f"{self.name}: kernels {status}: {cells}"


def _params(v: ir.VariantIR, sizes: Mapping[str, int], fixed: Mapping[str, object], rng) -> dict:
    """Random values of ``v``'s params; ``sizes`` holds the head counts, head_dim and the
    batch sizes (q_len, kv_len, batch_size) of a one-request batch."""
    out: dict[str, Any] = {}
    for p in v.params:
        if p.kind == "tensor":
            shape = [x if isinstance(x, int) else sizes[x] for x in p.dims]
            if p.dtype == ir.F32:
                out[p.name] = torch.rand(shape, device="cuda") * 0.5
            elif p.token_dim in ("kv_len", "q_len"):  # document ids: sorted runs
                ids = torch.randint(0, 4, shape, device="cuda", dtype=torch.int32)
                out[p.name] = torch.sort(ids, dim=0).values.contiguous()
            elif p.token_dim == "batch_size":  # per-request windows, prefixes
                out[p.name] = torch.randint(1, 257, shape, device="cuda", dtype=torch.int32)
            else:
                out[p.name] = torch.randint(0, 8, shape, device="cuda", dtype=torch.int32)
        elif p.name in fixed:
            out[p.name] = fixed[p.name]
        elif p.default is None:
            out[p.name] = (
                rng.uniform(0.5, 30.0)
                if p.dtype == ir.F32
                else rng.randint(1, 256)
                if p.dtype == ir.I32
                else True
            )
    return out


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    if torch.isnan(x).any():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def run_kernel_test(
    c: Compiled,
    *,
    seed: int = 0,
    fixed_params: Mapping[str, object] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    head_dim: int = 128,
) -> KernelTestReport:
    """Run the prefill kernels of ``c`` on a few shapes and layouts against the reference.
    Params are given to ``plan()`` too (per-token tensors the mask reads build its tile map)."""
    from attnc.runtime.reference import request_reference
    from attnc.runtime.variant import Variant
    from attnc.runtime.wrappers.prefill import BatchPrefillWrapper

    variant = Variant(c)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    report = KernelTestReport(c.variant.name)
    h_qo, h_kv = 8, 2
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    for q_len, kv_len, layout, page in SHAPES:
        sizes = {"num_qo_heads": h_qo, "num_kv_heads": h_kv, "head_dim": head_dim}
        sizes.update(q_len=q_len, kv_len=kv_len, batch_size=1)
        params = _params(c.variant, sizes, fixed_params or {}, rng)
        q = torch.randn(q_len, h_qo, head_dim, device="cuda", dtype=dtype)
        k = torch.randn(kv_len, h_kv, head_dim, device="cuda", dtype=dtype)
        v = torch.randn(kv_len, h_kv, head_dim, device="cuda", dtype=dtype)
        ref = request_reference(variant, q.double(), k.double(), v.double(), **params)
        same = request_reference(variant, q, k, v, **params)
        assert isinstance(ref, torch.Tensor) and isinstance(same, torch.Tensor)
        out = torch.full_like(q, float("nan"))
        wrapper = BatchPrefillWrapper(variant, workspace)
        qo_indptr = torch.tensor([0, q_len], dtype=torch.int32)
        if layout == "ragged":
            wrapper.plan(
                qo_indptr,
                torch.tensor([0, kv_len], dtype=torch.int32),
                h_qo,
                h_kv,
                head_dim,
                dtype=dtype,
                params=params,
            )
            got = wrapper.run(q, (k, v), out=out, **params)
        else:
            pages = (kv_len + page - 1) // page
            order = torch.randperm(pages, dtype=torch.int32)
            cache = torch.zeros(pages, 2, page, h_kv, head_dim, device="cuda", dtype=dtype)
            for i in range(kv_len):
                cache[order[i // page], 0, i % page] = k[i]
                cache[order[i // page], 1, i % page] = v[i]
            last = torch.tensor([kv_len - (pages - 1) * page], dtype=torch.int32)
            wrapper.plan(
                qo_indptr,
                torch.tensor([0, pages], dtype=torch.int32),
                h_qo,
                h_kv,
                head_dim,
                kv_indices=order.cuda(),
                kv_last_page_len=last,
                page_size=page,
                dtype=dtype,
                params=params,
            )
            got = wrapper.run(q, cache, out=out, **params)
        got = got[0] if isinstance(got, tuple) else got
        bound = 3 * _rel(same, ref) + 1e-3
        report.rows.append((f"{layout} q{q_len} kv{kv_len}", _rel(got, ref), bound))
    return report
