// Owns: the warp-level math of one KV tile of the FA2 prefill, on mma fragments held in
// registers (lane = threadIdx.x % 32 owns rows lane/4 and lane/4 + 8 of each m16 tile):
// S = Q K^T, the per-element score transform and mask, the online-softmax step (exp2 domain,
// -inf guards, O rescale), and O += P V with P reused as the A operand.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "mma.cuh"
#include "online_softmax.cuh"

namespace attnc {

// S = Q K^T for MQ m16 row tiles x NS n8 key blocks. Q fragments come from q_frag when
// kQInRegs (dimensions [MQ][D/16][4]) or from the swizzled Q tile at q_base; K from k_base.
template <class T, class Layout, bool kQInRegs, int MQ, int NS, int QM, int QK>
__device__ __forceinline__ void warp_qk(float (&s)[MQ][NS][4], const uint32_t (&q_frag)[QM][QK][4],
                                        uint32_t q_base, uint32_t k_base) {
  constexpr int KD = Layout::kChunks / 2;  // k-steps of 16 over the head dim
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    uint32_t a[MQ][4];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[mi][e] = q_frag[mi][kk][e];
      } else {
        mma::ldmatrix_x4(a[mi], Layout::walk(q_base, 2 * mi, 2 * kk));
      }
    }
#pragma unroll
    for (int nn = 0; nn < NS / 2; ++nn) {
      uint32_t b[4];
      mma::ldmatrix_x4(b, Layout::walk(k_base, 2 * nn, 2 * kk));
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
        mma::mma_16816<T>(s[mi][2 * nn], a[mi], b[0], b[1]);
        mma::mma_16816<T>(s[mi][2 * nn + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

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

// Slack of the running max, in log2 units of the weights: a row keeps its reference max m
// until a tile's max exceeds it by more than this, so weights exp2(s - m) stay below
// 2^kRescaleSlack (exact in fp32, and in bf16/fp16 after packing: 2^8 is far from overflow)
// and O, l are rescaled only when some row of the warp moves by more than that (after the
// first visible tile of a row that is rare). 0 rescales whenever a row max grows.
#ifndef ATTNC_PREFILL_RESCALE_SLACK
#define ATTNC_PREFILL_RESCALE_SLACK 8
#endif

// One online-softmax step over a tile of log2-domain logits s (replaced by the weights p):
// running reference row max m (in the units of s; see ATTNC_PREFILL_RESCALE_SLACK), running
// partial row sum l (this lane's columns only; summed over the 4 lanes of a row at the end), O
// rescaled by exp2((m_old - m_new) * c) when a reference max moves.
template <class V, int MQ, int NS, int NO>
__device__ __forceinline__ void warp_softmax_step(float (&s)[MQ][NS][4], float (&m)[MQ][2],
                                                  float (&l)[MQ][2], float (&o)[MQ][NO][4],
                                                  const float (&mult)[MQ][2]) {
  constexpr float kSlack = static_cast<float>(ATTNC_PREFILL_RESCALE_SLACK);
  float alpha[MQ][2];
  bool rescale = false;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(s[mi][0][2 * h], s[mi][0][2 * h + 1]);
#pragma unroll
      for (int n = 1; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[mi][n][2 * h], s[mi][n][2 * h + 1]));
      mx = quad_max(mx);
      const float c = V::kScoreIsIdentity ? mult[mi][h] : 1.f;
      // Move the reference max only when the tile's max exceeds it by more than the slack
      // (always from -inf to a finite max; never while both are -inf: the NaN compares false).
      const bool move = (mx - m[mi][h]) * c > kSlack;
      const float m_ref = move ? mx : m[mi][h];
      alpha[mi][h] = move ? fast_exp2((m[mi][h] - mx) * c) : 1.f;
      rescale = rescale || move;
      m[mi][h] = m_ref;
      const float shift = -safe_max(m_ref) * c;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(fmaf(s[mi][n][2 * h + e], c, shift));
          s[mi][n][2 * h + e] = p;
          sum += p;
        }
      }
      l[mi][h] = fmaf(l[mi][h], alpha[mi][h], sum);
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

// O += P V: the fp32 weights of two neighbouring n8 blocks, packed to 16-bit pairs, are the
// A fragment of one k16 step; V comes transposed from the swizzled tile at v_base.
template <class T, class Layout, int MQ, int NS, int NO>
__device__ __forceinline__ void warp_pv(float (&o)[MQ][NO][4], const float (&p)[MQ][NS][4],
                                        uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < NS / 2; ++kk) {
    uint32_t a[MQ][4];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
      a[mi][0] = mma::Dtype<T>::pack(p[mi][2 * kk][0], p[mi][2 * kk][1]);
      a[mi][1] = mma::Dtype<T>::pack(p[mi][2 * kk][2], p[mi][2 * kk][3]);
      a[mi][2] = mma::Dtype<T>::pack(p[mi][2 * kk + 1][0], p[mi][2 * kk + 1][1]);
      a[mi][3] = mma::Dtype<T>::pack(p[mi][2 * kk + 1][2], p[mi][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < NO / 2; ++dn) {
      uint32_t b[4];
      mma::ldmatrix_x4_trans(b, Layout::walk(v_base, 2 * kk, 2 * dn));
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
        mma::mma_16816<T>(o[mi][2 * dn], a[mi], b[0], b[1]);
        mma::mma_16816<T>(o[mi][2 * dn + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

}  // namespace attnc
