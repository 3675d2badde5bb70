"""Benchmarks for attnc against FlexAttention (Triton and FLASH backends), FA4, SDPA and
FlashInfer.

Run with ``python -m benchmarks --suite prefill|decode|batch|jit|all [--quick] [--out DIR]``.
Every module imports torch, triton and the systems under test lazily, so ``--help`` and the
workload/FLOP/report helpers work on a machine without a GPU.
"""
