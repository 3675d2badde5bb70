// Owns: the math functions generated variant functors call (attnc::vm::tanh_ etc.), with one
// definition for host and device so the host harness computes what the kernels compute.
#pragma once

#include <cmath>

#include "exp2_poly.cuh"
#include "variant_contract.cuh"

namespace attnc {
namespace vm {

// On the device, tanh and exp use the hardware approximations (tanh.approx: relative error
// about 2^-11; ex2.approx: about 2^-22), far below the bf16/fp16 rounding of the attention
// weights; the host (and so the host harness) uses the precise functions.
ATTNC_HD float tanh_(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);
#endif
}

#if defined(__CUDA_ARCH__)
// The flush-to-zero forms of ex2.approx and rcp.approx: results below 2^-126 become 0, which
// changes no attention weight (bf16/fp16 round them away next to any normal weight) and saves
// the subnormal fix-up code (a compare with -126 and a rescale) around every call.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The device's 2^x: MUFU.EX2, or with kPoly exp2_poly on the FMA pipe (relative error 7.5e-5;
// the Hopper consumers take it for part of the columns of a score without softmax, see
// kRawPolyEvery). The host computes the precise functions either way.
template <bool kPoly>
__device__ __forceinline__ float device_exp2(float x) {
  if constexpr (kPoly) {
    return exp2_poly(x);
  } else {
    return ex2_ftz(x);
  }
}
#endif

template <bool kPoly = false>
ATTNC_HD float exp_(float x) {
  return ATTNC_DEVICE_OR_HOST(device_exp2<kPoly>(x * 1.4426950408889634f), expf(x));
}
ATTNC_HD float exp2_(float x) { return exp2f(x); }
ATTNC_HD float log_(float x) { return logf(x); }
ATTNC_HD float log2_(float x) { return log2f(x); }
ATTNC_HD float sqrt_(float x) { return sqrtf(x); }
ATTNC_HD float rsqrt_(float x) { return 1.0f / sqrtf(x); }
ATTNC_HD float floor_(float x) { return floorf(x); }
ATTNC_HD float ceil_(float x) { return ceilf(x); }

// 1 / (1 + e^-x), written so neither branch overflows.
template <bool kPoly = false>
ATTNC_HD float sigmoid_(float x) {
#if defined(__CUDA_ARCH__)
  // Branch-free, one MUFU.EX2 (or exp2_poly) and one MUFU.RCP: e^-x overflows to +inf for
  // very negative x, and the reciprocal then gives 0.
  return rcp_ftz(1.0f + device_exp2<kPoly>(x * -1.4426950408889634f));
#else
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
#endif
}

// 1 / (1 + 2^y): the sigmoid of -y * ln(2), the form the compiler gives a sigmoid in a
// functor's score_raw, so that the scale and offset of its argument fold into one FFMA.
template <bool kPoly = false>
ATTNC_HD float inv1p_exp2_(float y) {
#if defined(__CUDA_ARCH__)
  return rcp_ftz(1.0f + device_exp2<kPoly>(y));  // as sigmoid_: 2^y = +inf gives 0
#else
  if (y <= 0.0f) return 1.0f / (1.0f + exp2f(y));
  const float e = exp2f(-y);
  return e / (1.0f + e);
#endif
}

// log(1 + e^x) = max(x, 0) + log1p(e^-|x|).
ATTNC_HD float softplus_(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// i32 division and remainder as the language defines them: truncation toward zero like C,
// with x / 0 == 0 and x % 0 == x (no trap on the host, no undefined result on the device), and
// INT_MIN / -1 wrapping to INT_MIN.
ATTNC_HD int idiv_(int a, int b) {
  if (b == 0) return 0;
  if (b == -1) return static_cast<int>(0u - static_cast<unsigned>(a));
  return a / b;
}
ATTNC_HD int imod_(int a, int b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  return a % b;
}

ATTNC_HD float abs_(float x) { return fabsf(x); }

// int(x) of an f32 as the language defines it: toward zero, saturated to the i32 range, NaN
// gives 0. Spelled out for host and device alike: a plain cast of an out-of-range float is
// undefined in C++, and the ends cost two compares where a variant converts at all.
ATTNC_HD int to_i32_(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return 2147483647;
  if (x <= -2147483648.0f) return -2147483647 - 1;
  return static_cast<int>(x);
}

// Negated as unsigned: abs(INT_MIN) wraps to INT_MIN as the language says (-x is undefined
// in C++ there, and compilers fold abs_(x) < 0 to false).
ATTNC_HD int abs_(int x) { return x < 0 ? static_cast<int>(0u - static_cast<unsigned>(x)) : x; }
ATTNC_HD float min_(float a, float b) { return a < b ? a : b; }
ATTNC_HD int min_(int a, int b) { return a < b ? a : b; }
ATTNC_HD float max_(float a, float b) { return a > b ? a : b; }
ATTNC_HD int max_(int a, int b) { return a > b ? a : b; }
ATTNC_HD float clamp_(float x, float lo, float hi) { return min_(max_(x, lo), hi); }
ATTNC_HD int clamp_(int x, int lo, int hi) { return min_(max_(x, lo), hi); }

// A tensor read that may run where the guard around it in the source would have stopped it
// (a shared sub-expression bound ahead of its ?: or && / ||, see codegen/guarded_reads.py):
// an index outside its dimension reads nothing and gives 0. Where the guard holds, every index
// is inside the declared shape (the language's rule), so the value is the plain read's.
ATTNC_HD bool in_dim_(int i, int n) { return static_cast<unsigned>(i) < static_cast<unsigned>(n); }
template <typename T>
ATTNC_HD T load_inner_(const T* base, long long flat) {
  return base[flat];
}
template <typename T, typename... Rest>
ATTNC_HD T load_inner_(const T* base, long long flat, int i, int n, Rest... rest) {
  return in_dim_(i, n) ? load_inner_(base, flat * n + i, rest...) : T(0);
}
// base[(start + i0) * n1 * ... + ...] for indices (i0, n0, i1, n1, ...); start is the
// request's first entry of a tensor flattened over the batch (0 for the others).
template <typename T, typename... Rest>
ATTNC_HD T load_in_shape_(const T* base, int start, int i0, int n0, Rest... rest) {
  return in_dim_(i0, n0) ? load_inner_(base, static_cast<long long>(start) + i0, rest...) : T(0);
}

// The address load_in_shape_ reads (the tensor's first element where an index is outside
// its dimension), for a prefetch of what the scores will read (V::touch_key_reads).
template <typename T>
ATTNC_HD const T* address_inner_(const T* base, long long flat) {
  return base + flat;
}
template <typename T, typename... Rest>
ATTNC_HD const T* address_inner_(const T* base, long long flat, int i, int n, Rest... rest) {
  return in_dim_(i, n) ? address_inner_(base, flat * n + i, rest...) : base;
}
template <typename T, typename... Rest>
ATTNC_HD const T* address_in_shape_(const T* base, int start, int i0, int n0, Rest... rest) {
  return in_dim_(i0, n0) ? address_inner_(base, static_cast<long long>(start) + i0, rest...)
                         : base;
}
// Brings the line holding *p into the SM's L1 (a hint: nothing is read into a register, no
// thread waits).
template <typename T>
ATTNC_HD void prefetch_l1_(const T* p) {
#ifdef __CUDA_ARCH__
  asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(p)));
#else
  (void)p;
#endif
}

}  // namespace vm
}  // namespace attnc
