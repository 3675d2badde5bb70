"""Ceilings of the card, measured in the same run: copy bandwidth and bf16 GEMM rate."""

from __future__ import annotations

from benchmarks.timing import bench_ms


def copy_tbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy rate in TB/s, counting bytes read plus bytes written."""
    import torch

    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms, _ = bench_ms([lambda: dst.copy_(src)])
    return 2 * nbytes / (ms * 1e-3) / 1e12


def matmul_tflops(n: int = 8192) -> float:
    """bf16 n x n x n matrix product rate (cuBLAS through torch) in TFLOP/s."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    ms, _ = bench_ms([lambda: torch.matmul(a, b, out=out)])
    return 2 * n**3 / (ms * 1e-3) / 1e12


def measure(quick: bool = False) -> dict[str, float]:
    """Both ceilings; smaller sizes with ``quick``."""
    import torch

    result = {
        "copy_tbps": copy_tbps(256 << 20 if quick else 1 << 30),
        "matmul_tflops": matmul_tflops(8192),
    }
    torch.cuda.empty_cache()
    return result
