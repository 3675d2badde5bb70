// Owns: the one pass of the host decode planner over host-resident page ids: their smallest
// and largest value (the negative-id check and the largest id run() compares with the cache),
// copied into the pinned staging buffer on the way when one is given. An AVX2 build of the
// loop is picked at run time where the CPU has it (same integers either way): the SSE2 build
// of the min/max reduction runs at a third of memcpy speed.
#pragma once
#include <stdint.h>

namespace attnc {
namespace decode_plan {

struct IdRange {
  int32_t lo, hi;
};

// The loop itself, compiled once per instruction set below (n >= 1; dst may be null).
#define ATTNC_ID_RANGE_BODY                                   \
  int32_t lo = src[0], hi = src[0];                           \
  if (dst != nullptr) {                                       \
    for (int64_t i = 0; i < n; ++i) {                         \
      const int32_t v = src[i];                               \
      dst[i] = v;                                             \
      lo = lo < v ? lo : v;                                   \
      hi = hi > v ? hi : v;                                   \
    }                                                         \
  } else {                                                    \
    for (int64_t i = 0; i < n; ++i) {                         \
      const int32_t v = src[i];                               \
      lo = lo < v ? lo : v;                                   \
      hi = hi > v ? hi : v;                                   \
    }                                                         \
  }                                                           \
  return IdRange{lo, hi};

inline IdRange id_range_base(const int32_t* __restrict src, int32_t* __restrict dst, int64_t n) {
  ATTNC_ID_RANGE_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) inline IdRange id_range_avx2(const int32_t* __restrict src,
                                                             int32_t* __restrict dst, int64_t n) {
  ATTNC_ID_RANGE_BODY
}

inline bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#endif
#undef ATTNC_ID_RANGE_BODY

// min and max of src[0, n) (n >= 1), each value also copied to dst[0, n) when dst is not
// null (dst and src must not overlap).
inline IdRange id_range(const int32_t* src, int32_t* dst, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (cpu_has_avx2()) return id_range_avx2(src, dst, n);
#endif
  return id_range_base(src, dst, n);
}

}  // namespace decode_plan
}  // namespace attnc
