// Owns: the per-element score hooks of one tile of mma fragments: the variant's score
// transform (identity, affine a * s + b folded into the exp2 multiplier, or general), the
// variant's mask and the ragged-end bound, turning raw dot products into log2-domain logits
// (softmax) or final weights (normalize = none). Shared by the prefill and decode kernels.
#pragma once

#include <math_constants.h>

#include "online_softmax.cuh"

namespace attnc {

// Scores of one tile -> log2-domain logits (softmax) or weights (no softmax), in place.
// kMasked: evaluate the bound kv_idx < kv1 and V::mask per element.
template <bool kMasked, class V, int MQ, int NS>
__device__ __forceinline__ void transform_scores(const V& var,
                                                 const typename V::Row (&rows)[MQ][2],
                                                 const float (&mult)[MQ][2],
                                                 float (&s)[MQ][NS][4], int kv0, int kv1,
                                                 int tq, float sm_scale) {
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const typename V::Row& row = rows[mi][e / 2];
        const int kv_idx = kv0 + n * 8 + 2 * tq + (e % 2);
        bool vis = true;
        if constexpr (kMasked) vis = kv_idx < kv1 && (!V::kHasMask || var.mask(row, kv_idx));
        const float raw = s[mi][n][e];
        float x;
        if constexpr (!V::kUseSoftmax) {
          x = var.score(row, raw * sm_scale, kv_idx);
          if constexpr (kMasked) x = vis ? x : 0.f;
        } else if constexpr (V::kScoreIsIdentity) {
          x = raw;  // scaled by mult inside the exp2
        } else if constexpr (V::kAffineScore) {
          x = fmaf(raw, mult[mi][e / 2], var.score_bias(row, kv_idx) * kLog2e);
        } else {
          x = var.score(row, raw * sm_scale, kv_idx) * kLog2e;
        }
        if constexpr (V::kUseSoftmax && kMasked) x = vis ? x : -CUDART_INF_F;
        s[mi][n][e] = x;
      }
    }
  }
}

}  // namespace attnc
