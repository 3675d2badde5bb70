// Owns: exp2 on the FMA units instead of the special-function unit (MUFU): x is split into a
// nearest integer j and a fraction f in [-1/2, 1/2], 2^f is a degree-3 polynomial and 2^j is
// built from exponent bits. A kernel whose score already spends the special-function unit on
// every element (a soft-cap's tanh) is bound by that unit, not by its tensor cores: the Hopper
// consumers send a share of their softmax exp2s here (consumer_softmax.cuh).
//
// Contract, on the arguments the online softmax passes (at most ATTNC_RESCALE_SLACK above
// 0, or -inf for a hidden key): like ex2.approx.ftz, -inf and anything below -127 give 0 and
// NaN gives NaN; elsewhere the relative error is below 8e-5 (the fit's, checked on the host by
// tests/codegen/test_poly_exp2.py), far below the rounding of P to bf16 or fp16.
#pragma once

#include <stdint.h>

#include <cmath>
#include <cstring>

#include "variant_contract.cuh"  // ATTNC_HD

namespace attnc {

// 2^f ~ c0 + f (c1 + f (c2 + f c3)) on [-1/2, 1/2]: a fit of the relative error (it
// equioscillates at 7.5e-5).
constexpr float kExp2C0 = 0.99992811679840087890625f;
constexpr float kExp2C1 = 0.693260967731475830078125f;
constexpr float kExp2C2 = 0.24261054396629333496094f;
constexpr float kExp2C3 = 0.05517132207751274108887f;
// 1.5 * 2^23: adding it rounds a float of magnitude below 2^22 to the nearest integer, which
// then sits in the low bits of the sum's mantissa.
constexpr float kRoundMagic = 12582912.0f;

ATTNC_HD uint32_t poly_exp2_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

ATTNC_HD float poly_exp2_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// max(x, -127) that keeps a NaN x (fmaxf would return -127).
ATTNC_HD float poly_exp2_floor_clamp(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(-127.f));
  return y;
#else
  return std::isnan(x) ? x : (x < -127.f ? -127.f : x);
#endif
}

// 2^x for x <= 127 (see the contract above).
ATTNC_HD float poly_exp2(float x) {
  const float xc = poly_exp2_floor_clamp(x);  // -inf -> -127: its scale below is 0
  const float t = xc + kRoundMagic;
  const float f = xc - (t - kRoundMagic);  // in [-1/2, 1/2]; NaN stays NaN
  const float p = fmaf(fmaf(fmaf(kExp2C3, f, kExp2C2), f, kExp2C1), f, kExp2C0);
  // 2^j: t's bits are those of kRoundMagic plus j, and kRoundMagic's bits shifted left by 23
  // vanish mod 2^32, so (bits(t) << 23) + bits(1.0f) is the float 2^j for -126 <= j <= 127,
  // and 0 for j = -127.
  const float scale = poly_exp2_float((poly_exp2_bits(t) << 23) + 0x3F800000u);
  return p * scale;
}

}  // namespace attnc
