// Owns: the online softmax in the exp2 domain on a warp's mma fragments: fast exp2,
// reductions over the 4 lanes that hold one mma row, the -inf guards (a row that has seen only
// masked keys keeps max -inf, contributes nothing and never produces NaN), the per-tile step
// (running max with rescale slack, row sums, O rescale) and the LSE of a finished row. Shared
// by the prefill and decode kernels.
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

// A warp's running state before its first tile: O 0, reference max -inf, row sums 0.
template <int MQ, int NO>
__device__ __forceinline__ void clear_softmax_state(float (&o)[MQ][NO][4], float (&m)[MQ][2],
                                                    float (&l)[MQ][2]) {
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][n][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mi][h] = -CUDART_INF_F;
      l[mi][h] = 0.f;
    }
  }
}

// Slack of the running max, in log2 units of the weights: a row keeps its reference max m
// until a tile's max exceeds it by more than this, so weights exp2(s - m) stay below
// 2^kRescaleSlack (exact in fp32, and in bf16/fp16 after packing: 2^8 is far from overflow)
// and O, l are rescaled only when some row of the warp moves by more than that (after the
// first visible tile of a row that is rare). 0 rescales whenever a row max grows.
// (ATTNC_PREFILL_RESCALE_SLACK, its former name, is still honoured.)
#ifndef ATTNC_RESCALE_SLACK
#ifdef ATTNC_PREFILL_RESCALE_SLACK
#define ATTNC_RESCALE_SLACK ATTNC_PREFILL_RESCALE_SLACK
#else
#define ATTNC_RESCALE_SLACK 8
#endif
#endif

// One row half h (row g or g + 8 of the fragment) of one mma row block s of log2-domain
// logits through the online-softmax step: the reference max m moves to the tile's max only
// when that exceeds it by more than ATTNC_RESCALE_SLACK (always from -inf to a finite max;
// never while both are -inf: the NaN compares false); the logits become the weights p, whose
// sum (this lane's columns) is added to l after l is rescaled by alpha = exp2((m_old - m_new)
// * c), the factor O needs too (1 when m stays). Returns whether m moved.
template <class V, int NS>
__device__ __forceinline__ bool softmax_row_step(float (&s)[NS][4], int h, float& m, float& l,
                                                 float mult, float& alpha) {
  constexpr float kSlack = static_cast<float>(ATTNC_RESCALE_SLACK);
  float mx = fmaxf(s[0][2 * h], s[0][2 * h + 1]);
#pragma unroll
  for (int n = 1; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
  mx = quad_max(mx);
  const float c = V::kScoreIsIdentity ? mult : 1.f;
  const bool move = (mx - m) * c > kSlack;
  const float m_ref = move ? mx : m;
  alpha = move ? fast_exp2((m - mx) * c) : 1.f;
  m = m_ref;
  const float shift = -safe_max(m_ref) * c;
  float sum = 0.f;
#pragma unroll
  for (int n = 0; n < NS; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = fast_exp2(fmaf(s[n][2 * h + e], c, shift));
      s[n][2 * h + e] = p;
      sum += p;
    }
  }
  l = fmaf(l, alpha, sum);
  return move;
}

// One online-softmax step over a tile of log2-domain logits s (replaced by the weights p):
// running reference row max m (in the units of s; see ATTNC_RESCALE_SLACK), running
// partial row sum l (this lane's columns only; summed over the 4 lanes of a row at the end), O
// rescaled by exp2((m_old - m_new) * c) when a reference max moves.
template <class V, int MQ, int NS, int NO>
__device__ __forceinline__ void warp_softmax_step(float (&s)[MQ][NS][4], float (&m)[MQ][2],
                                                  float (&l)[MQ][2], float (&o)[MQ][NO][4],
                                                  const float (&mult)[MQ][2]) {
  float alpha[MQ][2];
  bool rescale = false;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool moved =
          softmax_row_step<V, NS>(s[mi], h, m[mi][h], l[mi][h], mult[mi][h], alpha[mi][h]);
      rescale = rescale || moved;
    }
  }
  // Rescaling by exactly 1 changes nothing: skip it when no row of the warp needs it.
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][n][e] *= alpha[mi][e / 2];
  }
}

}  // namespace attnc
