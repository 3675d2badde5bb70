// Owns: warp-level tensor-core primitives for sm80+: mma.sync m16n8k16 with 16-bit inputs
// (bf16 or fp16) and fp32 accumulators, ldmatrix x4 (plain and transposed), and packing two
// floats into one 32-bit register of 16-bit values.
//
// Fragment layouts (lane = threadIdx.x % 32, g = lane / 4, t = lane % 4):
//   A 16x16: a0 = (row g, cols 2t..2t+1), a1 = (row g+8, same), a2 = (row g, cols 8+2t..),
//            a3 = (row g+8, cols 8+2t..)
//   B 16x8:  b0 = (k rows 2t..2t+1, col g), b1 = (k rows 8+2t.., col g)
//   C 16x8:  c0, c1 = (row g, cols 2t, 2t+1); c2, c3 = (row g+8, same cols)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace attnc {
namespace mma {

template <class T>
struct Dtype;

template <>
struct Dtype<__nv_bfloat16> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct Dtype<half> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// d += a * b for one 16x8x16 tile.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

// The one mma.sync m16n8k16 statement; PTX_TYPE ("bf16" or "f16") names both input types.
#define ATTNC_MMA_16816_ASM(PTX_TYPE, d, a, b0, b1)                                   \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 " \
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"    \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  ATTNC_MMA_16816_ASM("bf16", d, a, b0, b1);
}

template <>
__device__ __forceinline__ void mma_16816<half>(float (&d)[4], const uint32_t (&a)[4],
                                                uint32_t b0, uint32_t b1) {
  ATTNC_MMA_16816_ASM("f16", d, a, b0, b1);
}

#undef ATTNC_MMA_16816_ASM

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit values; lanes 8i..8i+7 give the row addresses of matrix i,
// and r[i] receives (row lane/4, elements 2*(lane%4), +1) of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Same, each 8x8 matrix transposed: r[i] receives (rows 2*(lane%4), +1; column lane/4).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace mma
}  // namespace attnc
