// Owns: the score hooks of a variant on mma fragments: the row-level hoisting of a lane's
// packed query rows (V::row and the exp2 multiplier of affine scores), and per element of a
// tile the score transform (identity, affine a * s + b folded into the exp2 multiplier, its
// bias stepped from key to key when linear in kv_idx, or general), the variant's mask and the
// ragged-end bound, turning raw dot products into log2-domain logits (softmax) or final
// weights (normalize = none). Shared by the prefill and decode kernels.
#pragma once

#include <math_constants.h>

#include "online_softmax.cuh"

namespace attnc {

// Row-level hoisting for this lane's rows (g and g + 8 of each of its MQ m16 tiles, g = lane
// / 4): packed row p = row_base + min(first_row + 16 * mi + g + 8 * h, rows_valid - 1) (rows
// past the tile repeat the last valid one) is query token tok0 + p / group of head kv_head *
// group + p % group; mult is the exp2 multiplier of its raw dot products (affine scores).
template <class V, int MQ>
__device__ __forceinline__ void hoist_rows(const V& var, typename V::Row (&rows)[MQ][2],
                                           float (&mult)[MQ][2], int row_base, int first_row,
                                           int rows_valid, int tok0, int kv_head, int group,
                                           float sm_scale) {
  const int g = (threadIdx.x % 32) / 4;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row_base + min(first_row + mi * 16 + g + 8 * h, rows_valid - 1);
      rows[mi][h] = var.row(tok0 + r / group, kv_head * group + r % group);
      mult[mi][h] = V::kAffineScore ? var.score_scale(rows[mi][h]) * sm_scale * kLog2e : 1.f;
    }
  }
}

// Where transform_tile's element hooks get the tensor values a variant reads at indices of
// kv_idx alone (V::KeyValues). Per 8-key block of the tile, a lane takes the values of its
// pair of keys (pair(off): offset off and off + 1 from the tile's first key, off even), then
// each hook takes the pair and which of the two keys (i) it is given. DirectKeys: nothing is
// taken and V's plain hooks read the tensors themselves. TileKeys: the pair's values, staged
// once per tile in shared memory (the Hopper producer, sm90/staged_keys.cuh), passed to V's
// *_at hooks.
struct DirectKeys {
  struct Pair {};
  __device__ __forceinline__ Pair pair(int) const { return Pair(); }
  template <class V>
  __device__ __forceinline__ bool mask(const V& var, const typename V::Row& row, int kv_idx,
                                       const Pair&, int) const {
    return var.mask(row, kv_idx);
  }
  template <class V>
  __device__ __forceinline__ float score_bias(const V& var, const typename V::Row& row,
                                              int kv_idx, const Pair&, int) const {
    return var.score_bias(row, kv_idx);
  }
  template <class V>
  __device__ __forceinline__ float score_log2(const V& var, const typename V::Row& row, float raw,
                                              int kv_idx, const Pair&, int, float sm_scale) const {
    return variant_score_log2(var, row, raw, kv_idx, sm_scale);
  }
  template <bool kPoly = false, class V>
  __device__ __forceinline__ float score_raw(const V& var, const typename V::Row& row, float raw,
                                             int kv_idx, const Pair&, int, float sm_scale) const {
    return variant_score_raw<kPoly>(var, row, raw, kv_idx, sm_scale);
  }
};

template <class V>
struct TileKeys {
  using Values = typename V::KeyValues;
  static constexpr int kWords = static_cast<int>(sizeof(Values) / 4);
  static_assert(sizeof(Values) == 4 * kWords && kWords > 0,
                "attnc: KeyValues holds 4-byte fields (f32 and i32 reads)");
  uint32_t block;  // shared-memory address of the tile's first key's values (16-byte aligned)

  struct Pair {
    Values k[2];
  };
  // Volatile loads, so they stay after the barrier wait that publishes the block.
  __device__ __forceinline__ Pair pair(int off) const {
    uint32_t w[2 * kWords];
    const uint32_t addr = block + static_cast<uint32_t>(off) * sizeof(Values);
    if constexpr (kWords % 2 == 0) {
#pragma unroll
      for (int j = 0; j < kWords / 2; ++j)
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(w[4 * j]), "=r"(w[4 * j + 1]), "=r"(w[4 * j + 2]), "=r"(w[4 * j + 3])
                     : "r"(addr + 16 * j));
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j)
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                     : "=r"(w[2 * j]), "=r"(w[2 * j + 1])
                     : "r"(addr + 8 * j));
    }
    Pair p;
    __builtin_memcpy(&p, w, sizeof(p));
    return p;
  }
  __device__ __forceinline__ bool mask(const V& var, const typename V::Row& row, int kv_idx,
                                       const Pair& p, int i) const {
    return var.mask_at(row, kv_idx, p.k[i]);
  }
  __device__ __forceinline__ float score_bias(const V& var, const typename V::Row& row,
                                              int kv_idx, const Pair& p, int i) const {
    return var.score_bias_at(row, kv_idx, p.k[i]);
  }
  __device__ __forceinline__ float score_log2(const V& var, const typename V::Row& row, float raw,
                                              int kv_idx, const Pair& p, int i,
                                              float sm_scale) const {
    return variant_score_log2_at(var, row, raw, kv_idx, p.k[i], sm_scale);
  }
  template <bool kPoly = false>
  __device__ __forceinline__ float score_raw(const V& var, const typename V::Row& row, float raw,
                                             int kv_idx, const Pair& p, int i,
                                             float sm_scale) const {
    return variant_score_raw_at<kPoly>(var, row, raw, kv_idx, p.k[i], sm_scale);
  }
};

// What a kernel's score hooks read a tile's key values through: TileKeys over the tile's block
// in shared memory where the kernel stages them (kStaged), else DirectKeys (the hooks read the
// tensors themselves).
template <class V, bool kStaged>
struct KeySource {
  using Type = DirectKeys;
  __device__ __forceinline__ static Type at(uint32_t) { return DirectKeys(); }
};
template <class V>
struct KeySource<V, true> {
  using Type = TileKeys<V>;
  __device__ __forceinline__ static Type at(uint32_t block) { return TileKeys<V>{block}; }
};

// The steepest stepped bias, in log2 units a key, that transform_scores steps from a lane's
// first key; steeper rows are evaluated per element (see there).
constexpr float kMaxStepPerKey = 16.f;

// Per-row terms of transform_scores, relative to a lane's first key: the row's interval of
// keys on masked tiles (lo, hi), and an affine bias linear in kv_idx (bias0 at the first key,
// step per key).
template <int MQ>
struct RowTerms {
  int lo[MQ][2] = {}, hi[MQ][2] = {};
  float bias0[MQ][2] = {}, step[MQ][2] = {};
};

// The element loop of transform_scores. kRowInterval: the mask is the interval of terms.lo /
// hi; kStepBias: the bias is terms.bias0 + terms.step * (key offset), else evaluated per
// element (V::score_bias or the general score). kRawPoly: every kRawPoly-th column block of a
// variant without softmax takes the exp2_poly form of its score (kRawPolyEvery; 0: none).
template <bool kMasked, bool kRowInterval, bool kStepBias, class V, int MQ, int NS,
          bool kStepUnits = false, bool kRawScore = false, int kRawPoly = 0,
          class Keys = DirectKeys>
__device__ __forceinline__ void transform_tile(const V& var,
                                               const typename V::Row (&rows)[MQ][2],
                                               const float (&mult)[MQ][2],
                                               float (&s)[MQ][NS][4], int kv0, int kv1, int tq,
                                               float sm_scale, const RowTerms<MQ>& terms,
                                               const Keys& keys = Keys()) {
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      // A tile reads key values where the score reads by key, or where the mask is evaluated.
      typename Keys::Pair pair{};
      if constexpr (kMasked || variant_score_reads_by_key<V>::value)
        pair = keys.pair(n * 8 + 2 * tq);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const typename V::Row& row = rows[mi][e / 2];
        const int kv_idx = kv0 + n * 8 + 2 * tq + (e % 2);
        // The key the score functions see: past a tail's end (kv1, masked) a score that
        // reads a tensor by key sees the tile's last key, so its reads stay in the request.
        int kv_score = kv_idx;
        if constexpr (kMasked && variant_score_reads_by_key<V>::value)
          kv_score = kv_idx < kv1 ? kv_idx : kv1 - 1;
        bool vis = true;
        if constexpr (kRowInterval) {
          const int lane_off = n * 8 + (e % 2);  // from the lane's first key
          vis = lane_off >= terms.lo[mi][e / 2] && lane_off < terms.hi[mi][e / 2];
        } else if constexpr (kMasked && variant_mask_reads_tokens<V>::value) {
          // Evaluated for every element, at an index kept inside the request, so the
          // tensor loads of the tile issue together (no branch per element).
          vis = (kv_idx < kv1) & keys.mask(var, row, kv_idx < kv1 ? kv_idx : kv1 - 1, pair, e % 2);
        } else if constexpr (kMasked) {
          vis = kv_idx < kv1 && (!V::kHasMask || keys.mask(var, row, kv_idx, pair, e % 2));
        }
        const float raw = s[mi][n][e];
        float x;
        if constexpr (!V::kUseSoftmax) {
          x = poly_column(n, kRawPoly)
                  ? keys.template score_raw<kRawPoly != 0>(var, row, raw, kv_score, pair, e % 2,
                                                           sm_scale)
                  : keys.score_raw(var, row, raw, kv_score, pair, e % 2, sm_scale);
          if constexpr (kMasked) x = vis ? x : 0.f;
        } else if constexpr (V::kScoreIsIdentity || kRawScore) {
          x = raw;  // scaled by mult inside the exp2
        } else if constexpr (kStepUnits) {
          // In units of the row's step: mult holds the exp2 multiplier over the step, and the
          // bias at the lane's first key (over the step) joins the softmax once per row.
          x = fmaf(raw, mult[mi][e / 2], static_cast<float>(n * 8 + (e % 2)));
        } else if constexpr (kStepBias) {
          const float lane_off = static_cast<float>(n * 8 + (e % 2));
          x = fmaf(raw, mult[mi][e / 2],
                   fmaf(terms.step[mi][e / 2], lane_off, terms.bias0[mi][e / 2]));
        } else if constexpr (V::kAffineScore) {
          x = fmaf(raw, mult[mi][e / 2], keys.score_bias(var, row, kv_score, pair, e % 2) * kLog2e);
        } else {
          x = keys.score_log2(var, row, raw, kv_score, pair, e % 2, sm_scale);
        }
        if constexpr (V::kUseSoftmax && kMasked) x = vis ? x : -CUDART_INF_F;
        s[mi][n][e] = x;
      }
    }
  }
}

// The interval of keys of each row (V::row_kv_range, cut at kv1), relative to `base`.
template <class V, int MQ>
__device__ __forceinline__ void row_interval_terms(const V& var,
                                                   const typename V::Row (&rows)[MQ][2], int kv1,
                                                   int base, RowTerms<MQ>& terms) {
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const KvRange rr = var.row_kv_range(rows[mi][h]);
      terms.lo[mi][h] = rr.begin - base;
      terms.hi[mi][h] = (rr.end < kv1 ? rr.end : kv1) - base;
    }
}

// Scores of one tile -> log2-domain logits (softmax) or weights (no softmax), in place.
// kMasked: evaluate the bound kv_idx < kv1 and V::mask per element. kPerRowTerms: compute
// terms once per row and tile, relative to this lane's first key kv0 + 2 * tq, and reach each
// element from them: on masked tiles the row's interval of keys (when V gives one,
// row_kv_range), on every tile the affine bias and its step (when V gives one,
// score_bias_step). The Hopper consumers opt in; the FA2 and decode kernels have no registers
// to spare for these terms. kRawScore: the scores stay raw (only the mask and the bound apply;
// their softmax multiplies and offsets them per row, kRowsScaled of warp_softmax_rows_at).
template <bool kMasked, bool kPerRowTerms = false, bool kRawScore = false, class V, int MQ,
          int NS, class Keys = DirectKeys>
__device__ __forceinline__ void transform_scores(const V& var,
                                                 const typename V::Row (&rows)[MQ][2],
                                                 const float (&mult)[MQ][2],
                                                 float (&s)[MQ][NS][4], int kv0, int kv1,
                                                 int tq, float sm_scale,
                                                 const Keys& keys = Keys()) {
  const int base = kv0 + 2 * tq;  // this lane's first key
  RowTerms<MQ> terms;
  // A mask that is exactly an interval of keys per row: the row's bounds once, relative to
  // this lane's first key, then two compares with constants per element.
  constexpr bool kRowInterval =
      kPerRowTerms && kMasked && V::kHasMask && variant_row_interval<V>::value;
  if constexpr (kRowInterval) row_interval_terms(var, rows, kv1, base, terms);
  // An affine bias linear in kv_idx: its value at this lane's first key (which may lie past
  // kv1; score_bias is safe there) and its step, once per row; then one FFMA per element,
  // the key's offset from the first key being a constant. A row whose value or step is not
  // finite (a slope of inf or NaN, or one whose log2 step overflows) would turn that FFMA into
  // NaN (inf * 0, inf - inf) where the bias itself is +-inf; a row steeper than kMaxStepPerKey
  // would keep the f32 rounding of its bias at the lane's first key (up to step x the tile's
  // width, 2^-24 of it) in the logits of its last keys, where the reference's bias is near 0
  // (at the limit about 1.2e-4 log2 units on 128-key tiles). Such a warp's tile evaluates the
  // bias per element, as the reference does.
  constexpr bool kStepBias = !kRawScore && kPerRowTerms && V::kUseSoftmax && V::kAffineScore &&
                             !V::kScoreIsIdentity && variant_bias_step<V>::value;
  if constexpr (kStepBias) {
    bool steppable = true;
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        terms.bias0[mi][h] = var.score_bias(rows[mi][h], base) * kLog2e;
        terms.step[mi][h] = var.score_bias_step(rows[mi][h]) * kLog2e;
        // A NaN or infinite step fails the compare.
        steppable = steppable && isfinite(terms.bias0[mi][h]) &&
                    fabsf(terms.step[mi][h]) <= kMaxStepPerKey;
      }
    // Decided for the whole warp, so the branch stays uniform (the fallback is cold code).
    // Every lane of the warp reaches this vote: the kernels call transform_scores from
    // warp-uniform control flow (all 32 lanes, the full mask below).
    if (!__all_sync(0xffffffffu, steppable)) {
      transform_tile<kMasked, kRowInterval, false>(var, rows, mult, s, kv0, kv1, tq, sm_scale,
                                                   terms, keys);
      return;
    }
  }
  // The Hopper consumers (kPerRowTerms) move part of a raw score's exp2s to the FMA pipe.
  constexpr int kRawPoly = kPerRowTerms ? kRawPolyEvery<V> : 0;
  transform_tile<kMasked, kRowInterval, kStepBias, V, MQ, NS, false, kRawScore, kRawPoly>(
      var, rows, mult, s, kv0, kv1, tq, sm_scale, terms, keys);
}

// A variant whose bias is stepped (linear in kv_idx) keeps its logits in units of each
// row's step instead of log2 units on the Hopper template: one FFMA per
// element (score times the exp2 multiplier over the step, plus the key's offset from the
// lane's first key) instead of two, and the bias at the lane's first key over the step, r0,
// once per row and tile (warp_softmax_rows_in_units adds it to the row max and the shift).
// Head_dim 64 only, where the softmax is the larger share of a tile: ALiBi 8K 6.9% and 2K
// 5.1% faster there; at 128 (on three consumers) 8K was 1.2% slower, and at 256 1.6%
// (RESULTS.md runs 47 and 48).
template <class V, int HEAD_DIM>
constexpr bool kStepUnitsVariant = HEAD_DIM == 64 && V::kUseSoftmax && V::kAffineScore &&
                                   !V::kScoreIsIdentity && variant_bias_step<V>::value;

// The smallest step a row may be held in units of (smaller ones keep log2 units).
constexpr float kMinStepPerKey = 5.421010862427522e-20f;  // 2^-64

// Scores of one tile in units of each row's step `units` (mult_over_units: the exp2
// multiplier over it; per_unit: 1 / the step in log2 units, NaN where the warp is not in
// units), and each row's offset r0, the bias at this lane's first key over the step. r0 is
// evaluated at that key, not stepped from key 0: near the diagonal it is small, so its f32
// rounding is too (from key 0 it carried ulp(q) x the step into every logit and the LSE).
// Where some lane's r0 is not finite (a warp not in units, whose units are 1, or a bias not
// finite at the key) the warp's tile evaluates the bias per element, in units, with r0 = 0.
template <bool kMasked, class V, int MQ, int NS, class Keys = DirectKeys>
__device__ __forceinline__ void transform_scores_in_units(
    const V& var, const typename V::Row (&rows)[MQ][2], const float (&mult_over_units)[MQ][2],
    const float (&units)[MQ][2], const float (&per_unit)[MQ][2], float (&s)[MQ][NS][4], int kv0,
    int kv1, int tq, float sm_scale, float (&r0)[MQ][2], const Keys& keys = Keys()) {
  const int base = kv0 + 2 * tq;
  RowTerms<MQ> terms;
  constexpr bool kRowInterval = kMasked && V::kHasMask && variant_row_interval<V>::value;
  if constexpr (kRowInterval) row_interval_terms(var, rows, kv1, base, terms);
  bool finite = true;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r0[mi][h] = var.score_bias(rows[mi][h], base) * kLog2e * per_unit[mi][h];
      finite = finite && isfinite(r0[mi][h]);
    }
  if (__all_sync(0xffffffffu, finite)) {
    transform_tile<kMasked, kRowInterval, false, V, MQ, NS, true>(
        var, rows, mult_over_units, s, kv0, kv1, tq, sm_scale, terms, keys);
    return;
  }
  float mult[MQ][2], scale[MQ][2];
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mult[mi][h] = mult_over_units[mi][h] * units[mi][h];
      scale[mi][h] = units[mi][h] == 1.f ? 1.f : __fdividef(1.f, units[mi][h]);
      r0[mi][h] = 0.f;
    }
  transform_tile<kMasked, kRowInterval, false>(var, rows, mult, s, kv0, kv1, tq, sm_scale, terms,
                                               keys);
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][n][e] *= scale[mi][e / 2];
}

}  // namespace attnc
