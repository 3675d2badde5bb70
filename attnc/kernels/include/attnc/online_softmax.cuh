// Owns: the online softmax in the exp2 domain on a warp's mma fragments: fast exp2,
// reductions over the 4 lanes that hold one mma row, the -inf guards (a row that has seen only
// masked keys keeps max -inf, contributes nothing and never produces NaN), the per-tile step
// (running max with rescale slack, row sums, O rescale), the sink of a row (its start and its
// term in the denominator) and the end of a finished row (1 / sum, LSE, whether it saw a key;
// NaN sums stay NaN). Shared by the prefill and decode kernels.
#pragma once

#include <math_constants.h>

#include <cmath>

#include "exp2_poly.cuh"
#include "variant_contract.cuh"

namespace attnc {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();  // -INFINITY in host and device code

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

// exp2 and log2 of the row ends: the hardware approximations on the device, the precise
// functions on the host (host tests run the same code).
ATTNC_HD float row_exp2(float x) { return ATTNC_DEVICE_OR_HOST(fast_exp2(x), exp2f(x)); }

ATTNC_HD float row_log2(float x) { return ATTNC_DEVICE_OR_HOST(__log2f(x), log2f(x)); }

// Sinks. A row that owns its variant's sink (the rows of an unsplit item; the merge kernel
// adds the sink to split ones) starts its online softmax with the reference max m at the sink
// (m never falls below it, O stays 0, no rescale), and the sink's weight joins the sum:
// - at the start (l = 1 on one lane of the row, rescaled with l like any weight) when V has
//   no output transform: nothing is left to do at the end;
// - at the end (finish_softmax_row: + exp2((m_sink - m) * c) <= 1) when V has one, so that l
//   still tells whether the row saw a key (V::output is not applied to a row that saw none).
template <class V>
constexpr bool kSinkAtEnd = variant_has_sink<V>::value && V::kHasOutput;

// A sink logit (natural-log units, variant_sink) in the units of a row's running max m (c
// maps those units to log2: the exp2 multiplier for identity scores, 1 otherwise).
ATTNC_HD float sink_logit_in_m_units(float sink, float c) { return sink * kLog2e / c; }

// The sink logit of a row in m units (sink_logit_in_m_units); -inf for a variant without a
// sink.
template <class V>
ATTNC_HD float sink_in_m_units(const V& var, const typename V::Row& row, float c) {
  if constexpr (variant_has_sink<V>::value) {
    return sink_logit_in_m_units(variant_sink(var, row), c);
  } else {
    (void)var;
    (void)row;
    (void)c;
    return kNegInf;
  }
}

// One row of an item that owns the sink starts at it (see kSinkAtEnd), given the row's sink
// logit `sink` (natural-log units, variant_sink) and c (as for sink_logit_in_m_units): m = the
// sink in m units, and unless kSinkAtEnd<V> the sink's weight 1 in l on the row's `owner` lane (one
// lane of the row over all lanes and warps whose states are later combined); O stays 0. A
// sink of -inf needs no special case: the first finite key rescales that 1 by exp2(-inf) = 0,
// and a row without keys ends with O 0 and LSE -inf.
template <class V>
ATTNC_HD void start_row_at_sink(float sink, float c, float& m, float& l, bool owner) {
  m = sink_logit_in_m_units(sink, c);
  if constexpr (!kSinkAtEnd<V>) l = owner ? 1.f : 0.f;
}

// Every row of an item that owns the sink starts at it (start_row_at_sink).
template <class V, int MQ>
ATTNC_HD void start_rows_at_sink(const V& var, const typename V::Row (&rows)[MQ][2],
                                 const float (&mult)[MQ][2], float (&m)[MQ][2],
                                 float (&l)[MQ][2], bool owner) {
  if constexpr (!variant_has_sink<V>::value) return;  // m, l stay as they are
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      start_row_at_sink<V>(variant_sink(var, rows[mi][h]),
                           V::kScoreIsIdentity ? mult[mi][h] : 1.f, m[mi][h], l[mi][h], owner);
}

// The end of a finished softmax row: the factor 1 / denominator for O, the natural-log LSE and
// whether the row saw a key (V::output applies only then).
struct SoftmaxRowEnd {
  float inv;
  float lse;
  bool seen;
};

// Row with reference max m (units that c maps to log2), sum of its weights `sum` (all lanes;
// with the sink's unless kSinkAtEnd) and, when kSink (= kSinkAtEnd<V>), the sink m_sink (same
// units as m, m >= m_sink; -inf: this row does not own a sink) to add now. Only a zero total
// means "no key seen": O 0 and LSE -inf (a row with a sink and no key: O 0, LSE = sink). A NaN
// sum (a NaN score the mask kept) gives NaN O and NaN LSE, like the reference. `seen` (the
// sum without the sink is not 0) is meaningful when the sink is added here or there is none.
template <bool kSink>
ATTNC_HD SoftmaxRowEnd finish_softmax_row(float m, float c, float sum, float m_sink) {
  SoftmaxRowEnd e;
  e.seen = sum != 0.f;
  float total = sum;
  if constexpr (kSink) {
    total += m_sink == kNegInf ? 0.f : row_exp2((m_sink - m) * c);
  } else {
    (void)m_sink;
  }
  const bool empty = total == 0.f;
  e.inv = empty ? 0.f : 1.f / total;
  e.lse = empty ? kNegInf : (m * c + row_log2(total)) * kLn2;
  return e;
}

// The end of one output row of V, shared by the epilogues: {1, 0, seen} without softmax;
// else the row's reference max m, this lane's part l_lane of its sum and c (units of m to
// log2) finished with finish_softmax_row, the sink included when owns_sink (rows of unsplit
// items: the merge kernel adds it to split ones). NaN, NaN, unseen when `poisoned`.
template <class V>
__device__ __forceinline__ SoftmaxRowEnd output_row_end(const V& var, const typename V::Row& row,
                                                        float m, float l_lane, float c,
                                                        bool owns_sink, bool poisoned) {
  float inv = 1.f;
  float lse = 0.f;
  bool seen = true;
  if constexpr (V::kUseSoftmax) {
    constexpr bool kSink = kSinkAtEnd<V>;
    const float m_sink = kSink && owns_sink ? sink_in_m_units(var, row, c) : -CUDART_INF_F;
    const SoftmaxRowEnd end = finish_softmax_row<kSink>(m, c, quad_sum(l_lane), m_sink);
    seen = end.seen;
    inv = end.inv;
    lse = end.lse;
  }
  if (poisoned) {
    inv = CUDART_NAN_F;
    lse = CUDART_NAN_F;
    seen = false;
  }
  return SoftmaxRowEnd{inv, lse, seen};
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
      m[mi][h] = kNegInf;
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

// The largest logit of row half h (row g or g + 8 of the fragment) among this lane's columns.
// Taken as a tree (depth 1 + ceil(log2 NS) instead of NS): the same value in any order, NaNs
// included (fmaxf drops a NaN operand), and a shorter chain ahead of the exp2s.
template <int NS>
__device__ __forceinline__ float lane_row_max(const float (&s)[NS][4], int h) {
  float v[NS];
#pragma unroll
  for (int n = 0; n < NS; ++n) v[n] = fmaxf(s[n][2 * h], s[n][2 * h + 1]);
#pragma unroll
  for (int w = 1; w < NS; w *= 2)
#pragma unroll
    for (int n = 0; n + w < NS; n += 2 * w) v[n] = fmaxf(v[n], v[n + w]);
  return v[0];
}

// Row half h of one mma row block s of log2-domain logits with its reference max m already
// decided: the logits become the weights p = exp2(s * c - m * c), whose sum (this lane's
// columns) is added to l after l is rescaled by alpha. Every kPolyEvery-th block of 8 columns
// takes its exp2 from exp2_poly (0: none, see kExp2PolyEvery).
template <int kPolyEvery, int NS>
__device__ __forceinline__ void row_weights_shifted(float (&s)[NS][4], int h, float shift,
                                                    float c, float alpha, float& l);

template <int kPolyEvery, int NS>
__device__ __forceinline__ void row_weights(float (&s)[NS][4], int h, float m, float c,
                                            float alpha, float& l) {
  row_weights_shifted<kPolyEvery>(s, h, -safe_max(m) * c, c, alpha, l);
}

// As row_weights, with the exp2's shift given: p = exp2(s * c + shift).
template <int kPolyEvery, int NS>
__device__ __forceinline__ void row_weights_shifted(float (&s)[NS][4], int h, float shift,
                                                    float c, float alpha, float& l) {
  float sum = 0.f;
#pragma unroll
  for (int n = 0; n < NS; ++n) {
    const bool poly = poly_column(n, kPolyEvery);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float x = fmaf(s[n][2 * h + e], c, shift);
      const float p = poly ? exp2_poly(x) : fast_exp2(x);
      s[n][2 * h + e] = p;
      sum += p;
    }
  }
  l = fmaf(l, alpha, sum);
}

// The online-softmax step of a warp's rows on one tile of log2-domain logits s (replaced by
// the weights): a row's reference max m moves to the tile's row max only when that exceeds it
// by more than ATTNC_RESCALE_SLACK (always from -inf to a finite max; never while both are
// -inf: the NaN compares false), and alpha = exp2((m_old - m_new) * c) is the factor l (done
// here) and O (by the caller) need; 1 when m stays. Returns whether some row of the warp moved.
// A row moves only if the lane holding its max sees its own columns exceed m + slack, so one
// warp vote on the lanes' own maxima decides whether any row can move: in the steady state
// (no row moves) the tile skips the shuffles of the row maxima, and the weights, sums and
// alphas are exactly those of the full step. The logit of an element, by kForm:
// - kRowsPlain: s * c[mi][h] log2 units, m in units of c (r0 unread);
// - kRowsInUnits: (s + r0[mi][h]) * c[mi][h], m in units of c (warp_softmax_rows_in_units);
// - kRowsScaled: s * c[mi][h] + r0[mi][h], m in log2 units, c > 0 (raw scores whose stepped
//   bias the QK GEMM added from the tile's first key, kGemmBiasVariant: one FFMA and one exp2
//   per element, as for an identity score; c = 1, r0 = 0 takes logits in log2 units).
enum SoftmaxRowsForm { kRowsPlain, kRowsInUnits, kRowsScaled };
template <SoftmaxRowsForm kForm, int kPolyEvery = 0, int MQ, int NS>
__device__ __forceinline__ bool warp_softmax_rows_at(float (&s)[MQ][NS][4], float (&m)[MQ][2],
                                                     float (&l)[MQ][2], const float (&c)[MQ][2],
                                                     const float (&r0)[MQ][2],
                                                     float (&alpha)[MQ][2]) {
  constexpr float kSlack = static_cast<float>(ATTNC_RESCALE_SLACK);
  constexpr bool kLog2M = kForm == kRowsScaled;  // m in log2 units
  float mx[MQ][2];
  bool exceeds = false;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[mi][h] = lane_row_max(s[mi], h);
      if constexpr (kForm == kRowsInUnits) mx[mi][h] += r0[mi][h];
      if constexpr (kLog2M) {
        mx[mi][h] = fmaf(mx[mi][h], c[mi][h], r0[mi][h]);
        exceeds = exceeds || mx[mi][h] - m[mi][h] > kSlack;
      } else {
        exceeds = exceeds || (mx[mi][h] - m[mi][h]) * c[mi][h] > kSlack;
      }
      alpha[mi][h] = 1.f;
    }
  const bool any_moves = __any_sync(0xffffffffu, exceeds);
  if (any_moves) {
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float row_max = quad_max(mx[mi][h]);
        if constexpr (kLog2M) {
          if (row_max - m[mi][h] > kSlack) {
            alpha[mi][h] = fast_exp2(m[mi][h] - row_max);
            m[mi][h] = row_max;
          }
        } else if ((row_max - m[mi][h]) * c[mi][h] > kSlack) {
          alpha[mi][h] = fast_exp2((m[mi][h] - row_max) * c[mi][h]);
          m[mi][h] = row_max;
        }
      }
  }
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kLog2M) {
        row_weights_shifted<kPolyEvery>(s[mi], h, r0[mi][h] - safe_max(m[mi][h]), c[mi][h],
                                        alpha[mi][h], l[mi][h]);
      } else if constexpr (kForm == kRowsInUnits) {
        row_weights_shifted<kPolyEvery>(s[mi], h, (r0[mi][h] - safe_max(m[mi][h])) * c[mi][h],
                                        c[mi][h], alpha[mi][h], l[mi][h]);
      } else {
        row_weights<kPolyEvery>(s[mi], h, m[mi][h], c[mi][h], alpha[mi][h], l[mi][h]);
      }
    }
  return any_moves;
}

template <class V, int kPolyEvery = 0, int MQ, int NS>
__device__ __forceinline__ bool warp_softmax_rows(float (&s)[MQ][NS][4], float (&m)[MQ][2],
                                                  float (&l)[MQ][2], const float (&mult)[MQ][2],
                                                  float (&alpha)[MQ][2]) {
  float c[MQ][2];  // the units of m: the identity score's multiplier, else log2 units (1)
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) c[mi][h] = V::kScoreIsIdentity ? mult[mi][h] : 1.f;
  return warp_softmax_rows_at<kRowsPlain, kPolyEvery>(s, m, l, c, c, alpha);
}

// warp_softmax_rows for logits held in units of c[mi][h] (a row's step, kStepUnitsVariant)
// relative to an offset r0[mi][h] per row and lane: the logit of an element is
// (s + r0) * c log2 units, and m is kept in the units of s + r0.
template <int kPolyEvery = 0, int MQ, int NS>
__device__ __forceinline__ bool warp_softmax_rows_in_units(
    float (&s)[MQ][NS][4], float (&m)[MQ][2], float (&l)[MQ][2], const float (&c)[MQ][2],
    const float (&r0)[MQ][2], float (&alpha)[MQ][2]) {
  return warp_softmax_rows_at<kRowsInUnits, kPolyEvery>(s, m, l, c, r0, alpha);
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
  // Rescaling by exactly 1 changes nothing: skip it when no row of the warp moved.
  if (warp_softmax_rows<V>(s, m, l, mult, alpha)) {
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][n][e] *= alpha[mi][e / 2];
  }
}

}  // namespace attnc
