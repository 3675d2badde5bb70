// Owns: a stepped bias computed by the Hopper prefill's QK GEMM (kGemmBiasVariant,
// prefill_sm90_config.cuh): its two shared-memory blocks (16 columns each, interleaved layout,
// smem_desc.cuh): the key offsets, written once per CTA (row j holds j), and the rows'
// coefficients step / mult as three 16-bit pieces, written by each consumer for its rows when
// an item starts, with the choice, per warp and item, of whether its rows take them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../mma.cuh"
#include "../score_hooks.cuh"
#include "prefill_sm90_config.cuh"
#include "smem_desc.cuh"

namespace attnc {
namespace sm90 {

// Whether variant V's kernel of this CTA shape computes its stepped bias in the QK GEMM: the
// shapes that hold the bias blocks (three consumers at head_dim 128).
template <class V, class Shape>
constexpr bool kBiasInGemm = kGemmBiasVariant<V, Shape::kHeadDim> && Shape::kHasBiasBlocks;

// The largest coefficient step / mult (raw-score units per key) the pieces carry: they stay
// normal fp16 numbers, and coefficient x key index stays far inside f32.
constexpr float kMaxBiasCoefficient = 16384.f;

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                             uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d)
               : "memory");
}

// Writes both bias blocks at kernel start: the key offsets (row j holds j, exact in T up to
// 256, in columns 0, 1 and 2; 0 elsewhere) and the row coefficients all 0 (columns 8 to 15 stay
// 0). Every thread of the CTA writes its share; the caller fences the proxies and syncs before
// a wgmma reads them.
template <class T, class Shape>
__device__ __forceinline__ void write_bias_blocks(uint32_t k_block, uint32_t q_block) {
  for (int i = threadIdx.x; i < 2 * (Shape::kKvTile + Shape::kRows); i += Shape::kThreads) {
    const bool key = i < 2 * Shape::kKvTile;
    const int r = (key ? i : i - 2 * Shape::kKvTile) / 2, chunk = i % 2;
    const float j = static_cast<float>(r);
    const bool offsets = key && chunk == 0;
    st_shared_v4((key ? k_block : q_block) + interleaved_offset(r, chunk),
                 offsets ? mma::Dtype<T>::pack(j, j) : 0u, offsets ? mma::Dtype<T>::pack(j, 0.f) : 0u,
                 0u, 0u);
  }
}

// x rounded to T and back.
template <class T>
__device__ __forceinline__ float round_to(float x);
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ float round_to<half>(float x) {
  return __half2float(__float2half_rn(x));
}

// Consumer wg's rows of this thread (g and g + 8 of its warp; the lanes with tq = 0 write)
// into the coefficient block: the pieces hi, mid, lo of each row's step / mult in columns 0, 1
// and 2, whose products with the key offsets sum to coefficient x j within 2^-24 of it. Returns
// whether this warp's rows take the bias in the GEMM: every row's step within kMaxStepPerKey
// log2 units a key, its multiplier finite and positive, its coefficient within
// kMaxBiasCoefficient (NaN fails the compares); otherwise the warp's rows get 0 and its tiles
// evaluate the bias per element. Every lane of the warp must call it, after the warpgroup's
// last S of the previous item has completed (issue_q_rows' barrier); wait_q_rows makes the rows
// visible to the item's first S.
template <class V, class T>
__device__ __forceinline__ bool write_bias_rows(const V& var, const typename V::Row (&rows)[2],
                                                const float (&mult)[2], uint32_t q_block,
                                                int wg) {
  float coef[2];
  bool ok = true;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float step = var.score_bias_step(rows[h]) * kLog2e;
    coef[h] = step / mult[h];
    ok = ok && fabsf(step) <= kMaxStepPerKey && mult[h] > 0.f && mult[h] <= 3.0e38f &&
         fabsf(coef[h]) <= kMaxBiasCoefficient;
  }
  const bool in_gemm = __all_sync(0xffffffffu, ok);
  if (threadIdx.x % 4 == 0) {
    const int first = 64 * wg + 16 * ((threadIdx.x / 32) % 4) + (threadIdx.x % 32) / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float c = in_gemm ? coef[h] : 0.f;
      const float hi = round_to<T>(c);
      const float mid = round_to<T>(c - hi);
      const float lo = c - hi - mid;
      st_shared_v4(q_block + interleaved_offset(first + 8 * h, 0), mma::Dtype<T>::pack(hi, mid),
                   mma::Dtype<T>::pack(lo, 0.f), 0u, 0u);
    }
  }
  return in_gemm;
}

}  // namespace sm90
}  // namespace attnc
