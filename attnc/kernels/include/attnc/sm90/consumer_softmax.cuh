// Owns: the online-softmax step of a Hopper consumer warpgroup on one S tile held as wgmma
// accumulators (the mma.sync C layout, so rows g and g + 8 of each warp, 4 lanes per row):
// warp_softmax_rows of online_softmax.cuh (reference max with rescale slack, row
// sums), and the O rescale factors -- returned instead of applied, because O is still being
// accumulated by an in-flight wgmma when the step runs.
#pragma once

#include "../online_softmax.cuh"

namespace attnc {
namespace sm90 {

// The share of a consumer's softmax exp2s that exp2_poly computes (kExp2PolyEvery), except
// where it made ptxas spill: three consumers at head_dim 64 (160 registers a thread, 128 keys
// a stage; tests/codegen/test_sm90_compile.py checks every stdlib variant for spills).
template <class V, class Shape>
constexpr int kConsumerExp2PolyEvery =
    Shape::kConsumers == 3 && Shape::kHeadDim == 64 ? 0 : kExp2PolyEvery<V>;

// s: log2-domain logits in, weights out. Returns whether any row of this warp must rescale O
// (then by alpha[h] for row h); m, l as in warp_softmax_step. Every kPolyEvery-th column block
// takes its exp2s from exp2_poly (kConsumerExp2PolyEvery; 0: none).
template <class V, int kPolyEvery, int NS>
__device__ __forceinline__ bool softmax_step(float (&s)[1][NS][4], float (&m)[1][2],
                                             float (&l)[1][2], const float (&mult)[1][2],
                                             float (&alpha)[2]) {
  float a[1][2];
  const bool moved = warp_softmax_rows<V, kPolyEvery>(s, m, l, mult, a);
  alpha[0] = a[0][0];
  alpha[1] = a[0][1];
  return moved;
}

// softmax_step for logits in units of each row's step (warp_softmax_rows_in_units).
template <int NS>
__device__ __forceinline__ bool softmax_step_in_units(float (&s)[1][NS][4], float (&m)[1][2],
                                                      float (&l)[1][2],
                                                      const float (&units)[1][2],
                                                      const float (&r0)[1][2],
                                                      float (&alpha)[2]) {
  float a[1][2];
  const bool moved = warp_softmax_rows_in_units(s, m, l, units, r0, a);
  alpha[0] = a[0][0];
  alpha[1] = a[0][1];
  return moved;
}

// softmax_step for raw scores with a per-row multiplier c and offset r0, m in log2 units
// (warp_softmax_rows_at's kRowsScaled).
template <int NS>
__device__ __forceinline__ bool softmax_step_scaled(float (&s)[1][NS][4], float (&m)[1][2],
                                                    float (&l)[1][2], const float (&c)[1][2],
                                                    const float (&r0)[1][2], float (&alpha)[2]) {
  float a[1][2];
  const bool moved = warp_softmax_rows_at<kRowsScaled>(s, m, l, c, r0, a);
  alpha[0] = a[0][0];
  alpha[1] = a[0][1];
  return moved;
}

template <int NO>
__device__ __forceinline__ void rescale_o(float (&o)[1][NO][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < NO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[0][n][e] *= alpha[e / 2];
}

}  // namespace sm90
}  // namespace attnc
