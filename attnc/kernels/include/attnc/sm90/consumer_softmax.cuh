// Owns: the online-softmax step of a Hopper consumer warpgroup on one S tile held as wgmma
// accumulators (the mma.sync C layout, so rows g and g + 8 of each warp, 4 lanes per row):
// running reference max with the rescale slack of online_softmax.cuh, row sums, and the O
// rescale factors -- returned instead of applied, because O is still being accumulated by an
// in-flight wgmma when the step runs.
#pragma once

#include "../online_softmax.cuh"

#ifndef ATTNC_RESCALE_SLACK
#define ATTNC_RESCALE_SLACK 8
#endif

namespace attnc {
namespace sm90 {

// s: log2-domain logits in, weights out. Returns whether any row of this warp must rescale O
// (then by alpha[h] for row h); m, l as in warp_softmax_step.
template <class V, int NS>
__device__ __forceinline__ bool softmax_step(float (&s)[1][NS][4], float (&m)[1][2],
                                             float (&l)[1][2], const float (&mult)[1][2],
                                             float (&alpha)[2]) {
  constexpr float kSlack = static_cast<float>(ATTNC_RESCALE_SLACK);
  bool rescale = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(s[0][0][2 * h], s[0][0][2 * h + 1]);
#pragma unroll
    for (int n = 1; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[0][n][2 * h], s[0][n][2 * h + 1]));
    mx = quad_max(mx);
    const float c = V::kScoreIsIdentity ? mult[0][h] : 1.f;
    // NaN (both -inf) compares false: the reference stays -inf.
    const bool move = (mx - m[0][h]) * c > kSlack;
    const float m_ref = move ? mx : m[0][h];
    alpha[h] = move ? fast_exp2((m[0][h] - mx) * c) : 1.f;
    rescale = rescale || move;
    m[0][h] = m_ref;
    const float shift = -safe_max(m_ref) * c;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(s[0][n][2 * h + e], c, shift));
        s[0][n][2 * h + e] = p;
        sum += p;
      }
    }
    l[0][h] = fmaf(l[0][h], alpha[h], sum);
  }
  return __any_sync(0xffffffffu, rescale);
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
