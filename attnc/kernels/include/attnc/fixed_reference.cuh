// Owns: the fixed softmax reference of variants whose logits are bounded (kLogitBound): which
// kernels may use it (kFixedReferenceCapable), the launch-time choice (fixed_reference_log2:
// the bound U in log2 units, or -inf for the online reference) and a tile's softmax step with
// it. When every logit x of a row lies in [-U, U], the weights exp2(x - U) lie in [2^-2U, 1]:
// for U <= kFixedReferenceMaxLog2 that is a normal number in f32 and in bf16, which have the
// same exponent range (the ftz exp2 flushes none of them), so a row keeps m = U throughout:
// no running max, no vote, no rescale of O. Not for fp16 P (its normals end at 2^-14), rows
// with a sink (a sink logit is unbounded) or scores without a bound (identity, affine).
#pragma once

#include "online_softmax.cuh"
#include "variant_contract.cuh"

namespace attnc {

// The largest U (log2 units) the fixed reference takes: weights down to 2^-100, 26 binades
// above the smallest normal f32/bf16. Soft-cap qualifies up to |cap| = 34.65.
constexpr float kFixedReferenceMaxLog2 = 50.f;

// Whether a kernel for V whose P is bf16 (kBf16P) may run with a fixed reference.
template <class V, bool kBf16P>
constexpr bool kFixedReferenceCapable = kBf16P && V::kUseSoftmax &&
                                        variant_logit_bound<V>::value &&
                                        !variant_has_sink<V>::value && !V::kAffineScore;

// The fixed reference of a launch with params p: U = V::logit_bound_log2(p) when the kernel
// is capable and 0 <= U <= kFixedReferenceMaxLog2 (a NaN bound fails both), else -inf (the
// online reference). ATTNC_NO_FIXED_REFERENCE (experiments) always answers -inf.
template <class V, bool kBf16P>
ATTNC_HD float fixed_reference_log2(const typename V::Params& p) {
#ifdef ATTNC_NO_FIXED_REFERENCE
  (void)p;
  return kNegInf;
#else
  if constexpr (kFixedReferenceCapable<V, kBf16P>) {
    const float u = variant_logit_bound_log2<V>(p);
    return u >= 0.f && u <= kFixedReferenceMaxLog2 ? u : kNegInf;
  } else {
    (void)p;
    return kNegInf;
  }
#endif
}

// The softmax step of a warp's rows on one tile of log2-domain logits s (replaced by the
// weights) at the fixed reference m (U, or NaN once a bad page poisoned the row, which then
// stays NaN): p = exp2(s - m), added to this lane's part of l. O never rescales.
template <int MQ, int NS>
__device__ __forceinline__ void fixed_reference_weights(float (&s)[MQ][NS][4],
                                                        const float (&m)[MQ][2],
                                                        float (&l)[MQ][2]) {
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_weights(s[mi], h, m[mi][h], 1.f, 1.f, l[mi][h]);
}

}  // namespace attnc
