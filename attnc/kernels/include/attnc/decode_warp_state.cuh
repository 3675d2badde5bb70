// Owns: a decode warp's running attention state for one work item (the hoisted rows and exp2
// multipliers of this lane's packed query rows, O fragments, reference max m, partial sums l):
// its start, the math of one KV tile through the warp-math headers shared with the prefill
// (warp_qk_pv.cuh, score_hooks.cuh, online_softmax.cuh), and the fixed-order combine of the
// four warps' states through shared memory.
// Each warp takes 16 keys of a 64-key tile and all 16 * MQ packed rows of the item.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "decode_item.cuh"
#include "online_softmax.cuh"
#include "score_hooks.cuh"
#include "smem_layout.cuh"
#include "variant_contract.cuh"
#include "warp_qk_pv.cuh"

namespace attnc {

template <class V, class Tile>
struct DecodeWarpState {
  static constexpr int MQ = Tile::kMmaQ;
  static constexpr int NO = Tile::kHeadDim / 8;  // n8 column blocks of O
  typename V::Row rows[MQ][2];  // this lane's rows: g and g + 8 of each m16 tile
  float mult[MQ][2];            // exp2 multiplier of the raw dot product (affine scores)
  float o[MQ][NO][4];
  float m[MQ][2];  // reference max, in the units of the logits (see warp_softmax_step)
  float l[MQ][2];  // this lane's part of the row sum

  // Hoists the rows of item `it` and clears O, m, l.
  __device__ __forceinline__ void start(const V& var, const DecodeItem& it, int group,
                                        float sm_scale) {
    hoist_rows(var, rows, mult, it.row0, 0, it.rows_valid, 0, it.kv_head, group, sm_scale);
    clear_softmax_state(o, m, l);
  }

  // Factor from the units of m to log2 units (identity scores keep raw dot products).
  __device__ __forceinline__ float m_scale(int mi, int h) const {
    return V::kScoreIsIdentity ? mult[mi][h] : 1.f;
  }
};

// One KV tile of this warp: keys [kv0, kv1) (kv1 - kv0 <= 16) at k_base / v_base (this
// lane's ldmatrix addresses in the stage), Q rows at q_base. partial: the tile is PARTIAL.
template <class V, class T, class Tile>
__device__ __forceinline__ void decode_warp_tile(const V& var, DecodeWarpState<V, Tile>& st,
                                                 uint32_t q_base, uint32_t k_base,
                                                 uint32_t v_base, int kv0, int kv1, bool partial,
                                                 float sm_scale) {
  using Layout = SwizzledRows<Tile::kHeadDim>;
  constexpr int NS = Tile::kWarpKv / 8;
  const int tq = threadIdx.x % 4;
  const uint32_t q_in_smem[1][1][4] = {};  // Q is read from shared memory
  float s[Tile::kMmaQ][NS][4];
  warp_qk<T, Layout, false>(s, q_in_smem, q_base, k_base);
  if (partial || kv1 - kv0 < Tile::kWarpKv) {
    transform_scores<true>(var, st.rows, st.mult, s, kv0, kv1, tq, sm_scale);
  } else {
    transform_scores<false>(var, st.rows, st.mult, s, kv0, kv1, tq, sm_scale);
  }
  if constexpr (V::kUseSoftmax) warp_softmax_step<V>(s, st.m, st.l, st.o, st.mult);
  warp_pv<T, Layout>(st.o, s, v_base);
}

// Slot `slot` of the combine exchange: O fragments at so, (m, l) per row in s_ml.
template <class V, class Tile>
__device__ __forceinline__ void decode_put_state(const DecodeWarpState<V, Tile>& st, float* so,
                                                 float2* s_ml, int slot) {
  constexpr int MQ = Tile::kMmaQ;
  constexpr int NO = DecodeWarpState<V, Tile>::NO;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      *reinterpret_cast<float4*>(so + ((mi * NO + n) * 32 + lane) * 4) =
          make_float4(st.o[mi][n][0], st.o[mi][n][1], st.o[mi][n][2], st.o[mi][n][3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
      s_ml[(slot * MQ * 2 + mi * 2 + h) * 32 + lane] = make_float2(st.m[mi][h], st.l[mi][h]);
  }
}

// Merges the state in slot `slot` into this warp's state.
template <class V, class Tile>
__device__ __forceinline__ void decode_take_state(DecodeWarpState<V, Tile>& st, const float* so,
                                                  const float2* s_ml, int slot) {
  constexpr int MQ = Tile::kMmaQ;
  constexpr int NO = DecodeWarpState<V, Tile>::NO;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
    float fa[2] = {1.f, 1.f};
    float fb[2] = {1.f, 1.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 x = s_ml[(slot * MQ * 2 + mi * 2 + h) * 32 + lane];
      if constexpr (V::kUseSoftmax) {
        const float c = st.m_scale(mi, h);
        const float mt = fmaxf(st.m[mi][h], x.x);
        const float mu = safe_max(mt);
        fa[h] = exp2f((st.m[mi][h] - mu) * c);
        fb[h] = exp2f((x.x - mu) * c);
        st.l[mi][h] = st.l[mi][h] * fa[h] + x.y * fb[h];
        st.m[mi][h] = mt;
      }
    }
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const float4 y = *reinterpret_cast<const float4*>(so + ((mi * NO + n) * 32 + lane) * 4);
      st.o[mi][n][0] = st.o[mi][n][0] * fa[0] + y.x * fb[0];
      st.o[mi][n][1] = st.o[mi][n][1] * fa[0] + y.y * fb[0];
      st.o[mi][n][2] = st.o[mi][n][2] * fa[1] + y.z * fb[1];
      st.o[mi][n][3] = st.o[mi][n][3] * fa[1] + y.w * fb[1];
    }
  }
}

// Combines the four warps' states into warp 0 in a fixed order, (w0 + w2) + (w1 + w3),
// through the stage just consumed (slot 0 in its K half at so0, slot 1 in its V half at so1).
// Each lane keeps its own fragment positions, so a state moves between two warps of identical
// layout without any reshuffle. Call with every thread of the CTA.
template <class V, class Tile>
__device__ __forceinline__ void decode_combine_warps(DecodeWarpState<V, Tile>& st, float* so0,
                                                     float* so1, float2* s_ml) {
  static_assert(Tile::kWarps == 4, "the combine tree is written for four warps");
  const int warp = threadIdx.x / 32;
  __syncthreads();  // every warp is done with the stage's K and V
  if (warp >= 2) {
    decode_put_state(st, warp == 2 ? so0 : so1, s_ml, warp - 2);
    asm volatile("bar.arrive 1, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    decode_take_state(st, warp == 0 ? so0 : so1, s_ml, warp);
    if (warp == 1) {
      decode_put_state(st, so1, s_ml, 1);  // the same words this lane just read
      asm volatile("bar.arrive 2, 64;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 2, 64;\n" ::: "memory");
      decode_take_state(st, so1, s_ml, 1);
    }
  }
}

}  // namespace attnc
