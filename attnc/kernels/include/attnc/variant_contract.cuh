// Owns: the interface between a generated variant functor and the kernel templates:
// the shared value types (RequestInfo, KvRange, TileClass) and the compile-time check
// `check_variant_contract<V>()` that every template calls with readable messages.
//
// A generated variant is a struct V with:
//   struct Params;   scalar params and tensor pointers, fields in the order of the
//                    runtime param list (f32 -> float, i32 -> int, bool -> int,
//                    tensor -> const float* / const int*; tensors are dense row-major).
//   struct Row;      values hoisted per (query row, query head): one per packed tile row.
//   static constexpr bool kUseSoftmax;      false for `normalize = none`
//   static constexpr bool kHasMask;         false: every (q, kv) pair is visible
//   static constexpr bool kScoreIsIdentity; true: score(row, s, kv) == s
//   static constexpr bool kAffineScore;     true: score(row, s, kv) == score_scale(row) * s
//                                           + score_bias(row, kv) (kernels fold the scale
//                                           into the exp2 multiplier)
//   static constexpr bool kHasOutput;       false: output(row, o) == o
//   V(const Params& params, const RequestInfo& request);   request-level hoisting
//   Row   row(int q_idx, int qo_head) const;              row-level hoisting
//   float score(const Row&, float s, int kv_idx) const;   s = dot(q, k) * sm_scale
//   float score_scale(const Row&) const;                  affine a (1 if not affine)
//   float score_bias(const Row&, int kv_idx) const;       affine b (0 if not affine)
//   bool  mask(const Row&, int kv_idx) const;             true = visible
//   float output(const Row&, float o) const;              finished output element
//   KvRange   kv_range(int q_idx_begin, int q_idx_end) const;
//             half-open kv range that any query in [q_idx_begin, q_idx_end) of any head
//             may see, already clipped to [0, kv_len); empty when begin >= end.
//   TileClass classify(int q_idx0, int q_idx1, int kv0, int kv1) const;
//             class of the tile [q_idx0, q_idx1) x [kv0, kv1) (half-open) over all heads:
//             kEmpty (no visible pair), kFull (all visible), kPartial (evaluate mask()).
// Optional members (a functor without them compiles as if they were false / absent; read them
// through the traits below, never directly):
//   static constexpr bool kHasSink;         true: sink(row) is an extra logit of every row
//   static constexpr int kScoreTranscendentals;  hardware-approximated functions the score
//                                           evaluates per element (tanh, exp, ...)
//   static constexpr bool kPolyScoreRaw;    true: score_raw and score_raw_at are templates on
//                                           bool kPolyExp2 (true: exp / sigmoid by exp2_poly)
//   float sink(const Row&) const;           natural-log units, like score(); -INFINITY when
//                                           kHasSink is false (kernels skip it at compile time)
//   KvRange row_kv_range(const Row&) const;  present only when the mask is exactly an interval
//                                           of kv_idx for each query row: mask(row, kv) ==
//                                           (begin <= kv < end) for kv in [0, kv_len); kernels
//                                           test that on PARTIAL tiles (variant_row_interval)
//   float score_log2(const Row&, float raw, int kv_idx) const;
//                                           score(row, raw * sm_scale, kv_idx) * log2(e) as one
//                                           simplified expression of the raw dot product (its
//                                           constants folded and hoisted); read it through
//                                           variant_score_log2
//   float score_raw(const Row&, float raw, int kv_idx) const;
//                                           without softmax: score(row, raw * sm_scale,
//                                           kv_idx) as one simplified expression of the raw
//                                           dot product; read it through variant_score_raw
//   static constexpr bool kMaskReadsTokens; true: the mask reads a kv_len / q_len tensor, so
//                                           classify() answers kPartial for every non-empty tile
//                                           (tile maps give the exact classes)
//   static constexpr bool kScoreReadsByKey; true: the score reads a tensor at an index built
//                                           from kv_idx; kernels then call score, score_bias,
//                                           score_log2 and score_raw only with keys of the
//                                           request (kv_idx < kv_len, the compiler's index
//                                           checks assume it); read it through
//                                           variant_score_reads_by_key
//   static constexpr bool kTouchKeyReads;   true: the score or mask reads tensors at indices of
//                                           kv_idx alone, and `void touch_key_reads(int kv_idx)
//                                           const` prefetches them (bounds-checked) into L1, for
//                                           a kernel to issue ahead of the scores; read it
//                                           through variant_touches_key_reads
//   struct KeyValues; static constexpr bool kHasKeyValues;
//                                           what the score and mask compute from the key
//                                           alone (tensor reads at indices of kv_idx and the
//                                           arithmetic on them; 4-byte fields, f32 or i32, a
//                                           condition as 0 / 1): `KeyValues key_values(int
//                                           kv_idx) const` computes them (reads
//                                           bounds-checked where a guard is needed to keep
//                                           them inside), and score_at, score_log2_at,
//                                           score_raw_at, score_bias_at and mask_at take the
//                                           plain hook's arguments plus `const KeyValues&` and
//                                           return what the plain hook does, without reading
//                                           (those of them whose plain twin V has); read it
//                                           through variant_has_key_values
//   static constexpr bool kBiasStep;        true: the affine bias is linear in kv_idx with a
//                                           per-row step; read it through variant_bias_step
//   float score_bias_step(const Row&) const;
//                                           d score_bias / d kv_idx (natural-log units):
//                                           score_bias(row, kv + k) == score_bias(row, kv) +
//                                           k * score_bias_step(row) up to f32 rounding, and
//                                           score_bias is safe to call at any int kv (a lane's
//                                           first key may lie past a tile's end); 0 without
//                                           kBiasStep
// All member functions are __host__ __device__ so host harnesses can test them.
#pragma once

#ifdef __CUDACC__
#define ATTNC_HD __host__ __device__ __forceinline__
#else
#define ATTNC_HD inline
#endif

// In an ATTNC_HD function: DEVICE_EXPR in device code (hardware approximations), HOST_EXPR in
// host code (the precise functions the host harness computes with).
#ifdef __CUDA_ARCH__
#define ATTNC_DEVICE_OR_HOST(DEVICE_EXPR, HOST_EXPR) (DEVICE_EXPR)
#else
#define ATTNC_DEVICE_OR_HOST(DEVICE_EXPR, HOST_EXPR) (HOST_EXPR)
#endif

#include <type_traits>

namespace attnc {

// What a functor knows about the request (one sequence of the batch) it works on.
struct RequestInfo {
  int batch;         // index of the request in the batch
  int q_len;         // query tokens of this request
  int kv_len;        // key/value tokens of this request
  int num_qo_heads;
  int num_kv_heads;
  int head_dim;
  float sm_scale;
  int q_start;       // flattened index of the request's first query token (qo_indptr[batch])
  int kv_start;      // flattened index of the request's first KV token (kv_token_start[batch])
};

// First flattened KV token of request `batch` from a kv_token_start array (NULL: 0).
ATTNC_HD int kv_token_start_of(const int* kv_token_start, int batch) {
  return kv_token_start != nullptr ? kv_token_start[batch] : 0;
}

struct KvRange {
  int begin;  // first visible kv_idx
  int end;    // one past the last visible kv_idx
};

enum class TileClass : int { kEmpty = 0, kFull = 1, kPartial = 2 };

// variant_has_sink<V>::value: V declares `kHasSink` and it is true.
template <typename V, typename = void>
struct variant_has_sink : std::false_type {};
template <typename V>
struct variant_has_sink<V, std::void_t<decltype(V::kHasSink)>>
    : std::integral_constant<bool, V::kHasSink> {};

// variant_mask_reads_tokens<V>::value: V declares `kMaskReadsTokens` and it is true.
template <typename V, typename = void>
struct variant_mask_reads_tokens : std::false_type {};
template <typename V>
struct variant_mask_reads_tokens<V, std::void_t<decltype(V::kMaskReadsTokens)>>
    : std::integral_constant<bool, V::kMaskReadsTokens> {};

// variant_score_reads_by_key<V>::value: V declares `kScoreReadsByKey` and it is true.
template <typename V, typename = void>
struct variant_score_reads_by_key : std::false_type {};
template <typename V>
struct variant_score_reads_by_key<V, std::void_t<decltype(V::kScoreReadsByKey)>>
    : std::integral_constant<bool, V::kScoreReadsByKey> {};

// variant_has_key_values<V>::value: V declares `kHasKeyValues` and it is true.
template <typename V, typename = void>
struct variant_has_key_values : std::false_type {};
template <typename V>
struct variant_has_key_values<V, std::void_t<decltype(V::kHasKeyValues)>>
    : std::integral_constant<bool, V::kHasKeyValues> {};

// variant_touches_key_reads<V>::value: V declares `kTouchKeyReads` and it is true.
template <typename V, typename = void>
struct variant_touches_key_reads : std::false_type {};
template <typename V>
struct variant_touches_key_reads<V, std::void_t<decltype(V::kTouchKeyReads)>>
    : std::integral_constant<bool, V::kTouchKeyReads> {};

// variant_bias_step<V>::value: V declares `kBiasStep` and it is true.
template <typename V, typename = void>
struct variant_bias_step : std::false_type {};
template <typename V>
struct variant_bias_step<V, std::void_t<decltype(V::kBiasStep)>>
    : std::integral_constant<bool, V::kBiasStep> {};

// variant_score_transcendentals<V>::value: how many hardware-approximated functions (tanh,
// exp, sigmoid, ...) V's score evaluates per element, as V declares in
// `kScoreTranscendentals` (0 when it does not). Such a score shares the MUFU pipe with the
// softmax's exp2, which kernels may then move partly to the FMA pipe (exp2_poly).
template <typename V, typename = void>
struct variant_score_transcendentals : std::integral_constant<int, 0> {};
template <typename V>
struct variant_score_transcendentals<V, std::void_t<decltype(V::kScoreTranscendentals)>>
    : std::integral_constant<int, V::kScoreTranscendentals> {};

// variant_row_interval<V>::value: V has `KvRange row_kv_range(const Row&) const`.
template <typename V, typename = void>
struct variant_row_interval : std::false_type {};
template <typename V>
struct variant_row_interval<V, std::void_t<decltype(std::declval<const V&>().row_kv_range(
                                   std::declval<const typename V::Row&>()))>>
    : std::true_type {};

// The mask of (row, kv_idx) as kernels test it on PARTIAL tiles: the row's interval of keys
// when V gives one (variant_row_interval), else V::mask.
template <typename V>
ATTNC_HD bool variant_row_mask(const V& var, const typename V::Row& row, int kv_idx) {
  if constexpr (variant_row_interval<V>::value) {
    const KvRange rr = var.row_kv_range(row);
    return rr.begin <= kv_idx && kv_idx < rr.end;
  } else {
    return var.mask(row, kv_idx);
  }
}

// variant_has_score_log2<V>::value: V has `float score_log2(const Row&, float, int) const`.
template <typename V, typename = void>
struct variant_has_score_log2 : std::false_type {};
template <typename V>
struct variant_has_score_log2<
    V, std::void_t<decltype(std::declval<const V&>().score_log2(
           std::declval<const typename V::Row&>(), 0.f, 0))>> : std::true_type {};

// The score of raw dot product `raw` in log2 units: V::score_log2 when V has it, else
// score(row, raw * sm_scale, kv_idx) * log2(e).
template <typename V>
ATTNC_HD float variant_score_log2(const V& var, const typename V::Row& row, float raw,
                                  int kv_idx, float sm_scale) {
  if constexpr (variant_has_score_log2<V>::value) {
    (void)sm_scale;
    return var.score_log2(row, raw, kv_idx);
  } else {
    return var.score(row, raw * sm_scale, kv_idx) * 1.4426950408889634f;
  }
}

// variant_has_score_raw<V>::value: V has `float score_raw(const Row&, float, int) const`.
template <typename V, typename = void>
struct variant_has_score_raw : std::false_type {};
template <typename V>
struct variant_has_score_raw<
    V, std::void_t<decltype(std::declval<const V&>().score_raw(
           std::declval<const typename V::Row&>(), 0.f, 0))>> : std::true_type {};

// variant_has_poly_score_raw<V>::value: V declares `kPolyScoreRaw` and it is true: its
// score_raw (and score_raw_at) are templates on `bool kPolyExp2`, which with true take their
// exp / sigmoid from exp2_poly on the device.
template <typename V, typename = void>
struct variant_has_poly_score_raw : std::false_type {};
template <typename V>
struct variant_has_poly_score_raw<V, std::void_t<decltype(V::kPolyScoreRaw)>>
    : std::integral_constant<bool, V::kPolyScoreRaw> {};

// The weight of raw dot product `raw` of a variant without softmax: V::score_raw when V has
// it (with kPoly, its exp2_poly form: only for variant_has_poly_score_raw), else
// score(row, raw * sm_scale, kv_idx).
template <bool kPoly = false, typename V>
ATTNC_HD float variant_score_raw(const V& var, const typename V::Row& row, float raw,
                                 int kv_idx, float sm_scale) {
  if constexpr (kPoly) {
    static_assert(variant_has_poly_score_raw<V>::value, "attnc: no exp2_poly form of score_raw");
    (void)sm_scale;
    return var.template score_raw<true>(row, raw, kv_idx);
  } else if constexpr (variant_has_score_raw<V>::value) {
    (void)sm_scale;
    return var.score_raw(row, raw, kv_idx);
  } else {
    return var.score(row, raw * sm_scale, kv_idx);
  }
}

// variant_score_log2 and variant_score_raw of a variant with key values (V::KeyValues), from
// the values `key` of kv_idx instead of reads (V's *_at hooks).
template <typename V>
ATTNC_HD float variant_score_log2_at(const V& var, const typename V::Row& row, float raw,
                                     int kv_idx, const typename V::KeyValues& key,
                                     float sm_scale) {
  if constexpr (variant_has_score_log2<V>::value) {
    (void)sm_scale;
    return var.score_log2_at(row, raw, kv_idx, key);
  } else {
    return var.score_at(row, raw * sm_scale, kv_idx, key) * 1.4426950408889634f;
  }
}
template <bool kPoly = false, typename V>
ATTNC_HD float variant_score_raw_at(const V& var, const typename V::Row& row, float raw,
                                    int kv_idx, const typename V::KeyValues& key,
                                    float sm_scale) {
  if constexpr (kPoly) {
    static_assert(variant_has_poly_score_raw<V>::value, "attnc: no exp2_poly form of score_raw");
    (void)sm_scale;
    return var.template score_raw_at<true>(row, raw, kv_idx, key);
  } else if constexpr (variant_has_score_raw<V>::value) {
    (void)sm_scale;
    return var.score_raw_at(row, raw, kv_idx, key);
  } else {
    return var.score_at(row, raw * sm_scale, kv_idx, key);
  }
}

// The sink logit of a row in natural-log units; -INFINITY for a variant without a sink (the
// member is only instantiated when variant_has_sink<V> holds).
template <typename V>
ATTNC_HD float variant_sink(const V& var, const typename V::Row& row) {
  if constexpr (variant_has_sink<V>::value) {
    return var.sink(row);
  } else {
    (void)var;
    (void)row;
    return -__builtin_huge_valf();
  }
}

// The optional sink members, checked only when the variant declares kHasSink = true.
template <typename V, bool kOn = variant_has_sink<V>::value>
struct SinkContract {
  static constexpr bool ok = true;
};
template <typename V>
struct SinkContract<V, true> {
  static_assert(std::is_same<decltype(std::declval<const V&>().sink(
                                 std::declval<const typename V::Row&>())),
                             float>::value,
                "attnc variant: kHasSink needs `float sink(const Row&) const`");
  static_assert(V::kUseSoftmax, "attnc variant: a sink needs softmax normalisation");
  static constexpr bool ok = true;
};

// The optional bias-step members, checked only when the variant declares kBiasStep = true.
template <typename V, bool kOn = variant_bias_step<V>::value>
struct BiasStepContract {
  static constexpr bool ok = true;
};
template <typename V>
struct BiasStepContract<V, true> {
  static_assert(std::is_same<decltype(std::declval<const V&>().score_bias_step(
                                 std::declval<const typename V::Row&>())),
                             float>::value,
                "attnc variant: kBiasStep needs `float score_bias_step(const Row&) const`");
  static_assert(V::kAffineScore, "attnc variant: a bias step needs an affine score");
  static constexpr bool ok = true;
};

template <typename V>
struct VariantContract {
  static_assert(std::is_same<decltype(V::kUseSoftmax), const bool>::value,
                "attnc variant: missing `static constexpr bool kUseSoftmax`");
  static_assert(std::is_same<decltype(V::kHasMask), const bool>::value,
                "attnc variant: missing `static constexpr bool kHasMask`");
  static_assert(std::is_same<decltype(V::kScoreIsIdentity), const bool>::value,
                "attnc variant: missing `static constexpr bool kScoreIsIdentity`");
  static_assert(std::is_same<decltype(V::kAffineScore), const bool>::value,
                "attnc variant: missing `static constexpr bool kAffineScore`");
  static_assert(std::is_same<decltype(V::kHasOutput), const bool>::value,
                "attnc variant: missing `static constexpr bool kHasOutput`");
  static_assert(!V::kScoreIsIdentity || V::kAffineScore,
                "attnc variant: an identity score must also be declared affine (a=1, b=0)");
  static_assert(std::is_constructible<V, const typename V::Params&, const RequestInfo&>::value,
                "attnc variant: needs a constructor V(const Params&, const RequestInfo&)");
  static_assert(std::is_same<decltype(std::declval<const V&>().row(0, 0)), typename V::Row>::value,
                "attnc variant: needs `Row row(int q_idx, int qo_head) const`");
  static_assert(std::is_same<decltype(std::declval<const V&>().score(
                                 std::declval<const typename V::Row&>(), 0.f, 0)),
                             float>::value,
                "attnc variant: needs `float score(const Row&, float s, int kv_idx) const`");
  static_assert(std::is_same<decltype(std::declval<const V&>().mask(
                                 std::declval<const typename V::Row&>(), 0)),
                             bool>::value,
                "attnc variant: needs `bool mask(const Row&, int kv_idx) const`");
  static_assert(std::is_same<decltype(std::declval<const V&>().output(
                                 std::declval<const typename V::Row&>(), 0.f)),
                             float>::value,
                "attnc variant: needs `float output(const Row&, float o) const`");
  static_assert(std::is_same<decltype(std::declval<const V&>().kv_range(0, 0)), KvRange>::value,
                "attnc variant: needs `KvRange kv_range(int q_idx_begin, int q_idx_end) const`");
  static_assert(std::is_same<decltype(std::declval<const V&>().classify(0, 0, 0, 0)),
                             TileClass>::value,
                "attnc variant: needs `TileClass classify(int q0, int q1, int kv0, int kv1) const`");
  static constexpr bool ok = SinkContract<V>::ok && BiasStepContract<V>::ok;
};

// Call in every kernel template: `static_assert(check_variant_contract<V>(), "");` (usable in
// host and device code alike).
template <typename V>
#ifdef __CUDACC__
__host__ __device__
#endif
constexpr bool check_variant_contract() {
  return VariantContract<V>::ok;
}

}  // namespace attnc
