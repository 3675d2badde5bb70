// Owns: exp2 computed on the FMA and integer pipes instead of the MUFU pipe (exp2_poly), for
// kernels whose MUFU pipe is the busiest (a score with tanh / exp per element shares it with
// the softmax's exp2), and how often a kernel uses it (kExp2PolyEvery).
//
// 2^x = 2^j * 2^f with j = round(x) and f = x - j in [-0.5, 0.5]: 2^f is a degree-3
// polynomial (relative error below 7.5e-5, about 2^-13.7: under the rounding of a bf16 or
// fp16 weight, 2^-9 / 2^-11), 2^j is built in the exponent bits. Ten instructions on the
// FMA / ALU pipes against one MUFU.EX2 (relative error about 2^-22).
#pragma once

#include "variant_contract.cuh"

namespace attnc {

// 1.5 * 2^23 + 127: adding it to x in [-127, 128] rounds x to the nearest integer j and leaves
// j + 127 -- the biased exponent of 2^j -- in the low mantissa bits of the sum.
constexpr float kExp2PolyShift = 12583039.0f;
// Minimax (relative error) coefficients of 2^f on [-0.5, 0.5], lowest degree first.
constexpr float kExp2Poly0 = 0.99992806f;
constexpr float kExp2Poly1 = 0.69326097f;
constexpr float kExp2Poly2 = 0.24261117f;
constexpr float kExp2Poly3 = 0.05517168f;

// min(max(x, lo), hi) that keeps a NaN x (fmaxf / fminf would drop it).
ATTNC_HD float clamp_keep_nan(float x, float lo, float hi) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(lo));
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(y), "f"(hi));
  return y;
#else
  return x != x ? x : (x < lo ? lo : (x > hi ? hi : x));
#endif
}

// The bits of a 4-byte value as another 4-byte type (a register move on the device).
template <class To, class From>
ATTNC_HD To same_bits(From x) {
  static_assert(sizeof(To) == sizeof(From), "same_bits: sizes differ");
  To y;
  __builtin_memcpy(&y, &x, sizeof(y));
  return y;
}

// Round-to-nearest sums that no compiler contracts or reassociates ((x + k) - k is not x).
ATTNC_HD float add_rn(float a, float b) { return ATTNC_DEVICE_OR_HOST(__fadd_rn(a, b), a + b); }
ATTNC_HD float sub_rn(float a, float b) { return ATTNC_DEVICE_OR_HOST(__fsub_rn(a, b), a - b); }

// 2^x: exactly 0 for x <= -126.5 (and -inf, as the softmax's masked keys need: a row whose
// keys are all masked must sum to exactly 0), +inf for x > 127.5 (and +inf), NaN for NaN;
// otherwise within 7.5e-5 relative of 2^x (on the device, as with ex2.approx.ftz, results
// below 2^-126 are flushed to 0).
ATTNC_HD float exp2_poly(float x) {
  const float xc = clamp_keep_nan(x, -127.f, 128.f);
  const float t = add_rn(xc, kExp2PolyShift);
  const float f = sub_rn(xc, sub_rn(t, kExp2PolyShift));
  const float p = fmaf(fmaf(fmaf(kExp2Poly3, f, kExp2Poly2), f, kExp2Poly1), f, kExp2Poly0);
  // j + 127 in [0, 255] into the exponent field: 0 gives the scale +0 (p * 0 = 0), 255 +inf.
  return p * same_bits<float>(same_bits<unsigned>(t) << 23);
}

// Whether column block n of 8 keys of a tile is one of every `every`-th (n % every == every
// - 1) that take their exp2 from exp2_poly; every = 0: none.
ATTNC_HD constexpr bool poly_column(int n, int every) { return every > 0 && n % every == every - 1; }

// On the Hopper template, for scores whose own transcendental functions keep the MUFU pipe the
// busiest: of a softmax variant's weights, every kExp2PolyEvery-th column block's exp2 runs
// exp2_poly; of a variant without softmax, every kRawPolyEvery-th column block's score takes
// its exp / sigmoid from exp2_poly (vm::exp_<true>, ...). Identity and affine scores leave
// every exp2 to MUFU.EX2: their bottleneck is the tensor cores, and exp2_poly costs issue slots.
// Both settings are 0 (off) by default; tests/codegen/test_exp2_poly_sass.py compiles them on.
#ifndef ATTNC_EXP2_POLY_EVERY
#define ATTNC_EXP2_POLY_EVERY 0
#endif
#ifndef ATTNC_RAW_POLY_EVERY
#define ATTNC_RAW_POLY_EVERY 0
#endif
template <class V>
constexpr int kExp2PolyEvery =
    V::kUseSoftmax && variant_score_transcendentals<V>::value > 0 ? ATTNC_EXP2_POLY_EVERY : 0;
template <class V>
constexpr int kRawPolyEvery = !V::kUseSoftmax && variant_score_transcendentals<V>::value > 0 &&
                                      variant_has_poly_score_raw<V>::value
                                  ? ATTNC_RAW_POLY_EVERY
                                  : 0;

}  // namespace attnc
