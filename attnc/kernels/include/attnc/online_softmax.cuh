// Owns: the numerics of the online softmax in the exp2 domain: fast exp2, reductions over
// the 4 lanes that hold one mma row, and the -inf guards (a row that has seen only masked
// keys keeps max -inf, contributes nothing and never produces NaN).
#pragma once

#include <math_constants.h>

namespace attnc {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max / sum over the 4 lanes (lane % 4) that share one row of an mma fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The max to subtract before exp2: 0 for a row without a visible key so that
// exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
__device__ __forceinline__ float safe_max(float m) { return m == -CUDART_INF_F ? 0.f : m; }

// Natural-log LSE of a finished row from its max m (in units that `scale` maps to log2) and
// its sum of exp2 terms; -inf for a row that saw no visible key.
__device__ __forceinline__ float row_lse(float m, float scale, float sum) {
  return sum > 0.f ? (m * scale + __log2f(sum)) * kLn2 : -CUDART_INF_F;
}

}  // namespace attnc
