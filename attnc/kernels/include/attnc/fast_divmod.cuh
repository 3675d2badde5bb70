// Owns: division of non-negative ints below 2^31 by a divisor fixed for a whole launch (a page
// size, the GQA group size) with one IMAD.HI, one IADD and one SHF instead of the generic
// integer division sequence (a reciprocal, its correction and the sign handling, about 14
// instructions). The paged KV gathers divide token indices by the page size; the Hopper
// consumers split every packed query row (row = token * group + head) into its token and head
// when they copy Q, set up rows and store O.
//
// Granlund and Montgomery's multiplier for 32-bit dividends, with its 33rd bit applied as an
// add: with l = ceil(log2 d) and mul = floor(2^32 (2^l - d) / d) + 1,
// n / d = (mulhi(n, mul) + n) >> l. The sum stays below 2^32 because n < 2^31.
#pragma once

#include <stdint.h>

namespace attnc {

struct FastDiv {
  uint32_t mul;
  uint32_t shift;
  int d;  // the divisor, 1 <= d < 2^31

  __host__ __device__ __forceinline__ static FastDiv make(int d) {
    FastDiv f;
    f.d = d;
    uint32_t l = 0;
    while ((uint64_t(1) << l) < static_cast<uint64_t>(d)) ++l;  // l = ceil(log2 d)
    f.mul = static_cast<uint32_t>((((uint64_t(1) << l) - static_cast<uint64_t>(d)) << 32) /
                                      static_cast<uint64_t>(d) +
                                  1);
    f.shift = l;
    return f;
  }
  // n / d for 0 <= n < 2^31.
  __host__ __device__ __forceinline__ int div(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(mul, u);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(mul) * u) >> 32);
#endif
    return static_cast<int>((hi + u) >> shift);
  }
  // q = n / d and r = n % d for 0 <= n < 2^31.
  __host__ __device__ __forceinline__ void divmod(int n, int& q, int& r) const {
    q = div(n);
    r = n - q * d;
  }
};

}  // namespace attnc
