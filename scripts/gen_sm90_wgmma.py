"""Writes attnc/kernels/include/attnc/sm90/wgmma_ops.cuh: the wgmma.mma_async wrappers for
m64nNk16 (N in 64, 128, 256), bf16/fp16 inputs, fp32 accumulators, A from a shared-memory
descriptor (ss) or from registers (rs). Run from the repository root after changing N_VALUES."""

from __future__ import annotations

from pathlib import Path

N_VALUES = (64, 128, 256)
TYPES = {"__nv_bfloat16": "bf16", "half": "f16"}
OUT = Path("attnc/kernels/include/attnc/sm90/wgmma_ops.cuh")

HEADER = """\
// Owns: the wgmma.mma_async instructions the Hopper prefill issues, one wrapper per
// (input type, N): D[64 x N] (+)= A[64 x 16] * B[16 x N] with fp32 accumulators d[N / 8][4]
// (warp w of the warpgroup holds rows 16w + lane / 4 and 16w + lane / 4 + 8; block j holds
// columns 8j + 2 * (lane % 4) and the next one: the mma.sync C layout repeated along N).
//   ss: A and B from shared-memory descriptors (both K-major).
//   rs: A from four registers (the mma.sync m16n8k16 A fragment of the warp's 16 rows), B from
//       a descriptor; kTransB = 1 reads B MN-major (rows of B along K are contiguous in N).
// scale_d = 0 overwrites D, 1 accumulates. Written by scripts/gen_sm90_wgmma.py.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace attnc {
namespace sm90 {

template <class T, int N>
struct Wgmma;
"""


def operands(n: int) -> str:
    regs = n // 2
    items = [f'"+f"(d[{i // 4}][{i % 4}])' for i in range(regs)]
    lines = []
    for i in range(0, regs, 4):
        lines.append("          " + ", ".join(items[i : i + 4]))
    return ",\n".join(lines)


def reg_list(n: int) -> str:
    regs = n // 2
    names = [f"%{i}" for i in range(regs)]
    chunks = [", ".join(names[i : i + 16]) for i in range(0, regs, 16)]
    return ',"\n          "'.join(chunks)


def spec(ctype: str, ptx: str, n: int) -> str:
    regs = n // 2
    body = f"""
template <>
struct Wgmma<{ctype}, {n}> {{
  __device__ __forceinline__ static void ss(float (&d)[{n // 8}][4], uint64_t desc_a,
                                            uint64_t desc_b, int scale_d) {{
    asm volatile(
        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{"
          "{reg_list(n)}"
        "}}, %{regs}, %{regs + 1}, p, 1, 1, 0, 0;\\n}}\\n"
        : {operands(n).lstrip()}
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }}
  template <int kTransB>
  __device__ __forceinline__ static void rs(float (&d)[{n // 8}][4], const uint32_t (&a)[4],
                                            uint64_t desc_b, int scale_d) {{
    asm volatile(
        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{"
          "{reg_list(n)}"
        "}}, {{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1, %{regs + 6};\\n}}\\n"
        : {operands(n).lstrip()}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB));
  }}
}};
"""
    return body


def main() -> None:
    text = HEADER
    for ctype, ptx in TYPES.items():
        for n in N_VALUES:
            text += spec(ctype, ptx, n)
    text += "\n}  // namespace sm90\n}  // namespace attnc\n"
    OUT.write_text(text)


if __name__ == "__main__":
    main()
