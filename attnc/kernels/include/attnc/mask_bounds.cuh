// Owns: the value types and operations of a generated functor's `mask_bounds`: the mask of a
// variant that reads per-token tensors evaluated once over a whole box of (query, key, head)
// pairs with intervals instead of values, so the tile-map classifier can call most boxes
// EMPTY or FULL without evaluating the mask on each pair (attnc/tile_map.cuh scans the rest).
//
// An i32 sub-expression becomes a Span: an inclusive interval [lo, hi] that holds its value on
// every pair of the box, or "any" when that is unknown (an operation the bounds do not follow,
// such as i32 division, or a result that may leave the i32 range, where the mask's wrapping
// arithmetic would no longer be the interval's). A bool becomes a Tri: whether it may be true
// and whether it may be false somewhere in the box. A per-token tensor read at kv_idx, q_pos
// or q_idx spans the min and max of the tensor over the box's index range (token_span), the
// loads split over the calling lanes (SerialLanes on the host, WarpLanes in the classifier).
// Every operation over-approximates, so a box called EMPTY (the mask may not be true) or FULL
// (it may not be false) is so for every pair.
#pragma once

#include <stdint.h>

#include "variant_contract.cuh"

namespace attnc {

constexpr long long kI32Min = -2147483648LL;
constexpr long long kI32Max = 2147483647LL;

// An inclusive interval of i32 values, or any value (ok == false).
struct Span {
  long long lo, hi;
  bool ok;
  ATTNC_HD static Span point(long long x) { return Span{x, x, true}; }
  ATTNC_HD static Span any() { return Span{kI32Min, kI32Max, false}; }
  // [lo, hi] when it stays inside the i32 range, else any().
  ATTNC_HD static Span checked(long long lo, long long hi) {
    return lo < kI32Min || hi > kI32Max ? any() : Span{lo, hi, true};
  }
};

// What a bool may be over the box.
struct Tri {
  bool may_true, may_false;
  ATTNC_HD static Tri of(bool x) { return Tri{x, !x}; }
  ATTNC_HD static Tri unknown() { return Tri{true, true}; }
};

ATTNC_HD long long span_min4(long long a, long long b, long long c, long long d) {
  const long long x = a < b ? a : b, y = c < d ? c : d;
  return x < y ? x : y;
}
ATTNC_HD long long span_max4(long long a, long long b, long long c, long long d) {
  const long long x = a > b ? a : b, y = c > d ? c : d;
  return x > y ? x : y;
}

ATTNC_HD Span span_add(Span a, Span b) {
  return a.ok && b.ok ? Span::checked(a.lo + b.lo, a.hi + b.hi) : Span::any();
}
ATTNC_HD Span span_sub(Span a, Span b) {
  return a.ok && b.ok ? Span::checked(a.lo - b.hi, a.hi - b.lo) : Span::any();
}
ATTNC_HD Span span_mul(Span a, Span b) {  // |bounds| <= 2^31: the products fit in 63 bits
  if (!a.ok || !b.ok) return Span::any();
  const long long p = a.lo * b.lo, q = a.lo * b.hi, r = a.hi * b.lo, s = a.hi * b.hi;
  return Span::checked(span_min4(p, q, r, s), span_max4(p, q, r, s));
}
ATTNC_HD Span span_min(Span a, Span b) {
  if (!a.ok || !b.ok) return Span::any();
  return Span{a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? a.hi : b.hi, true};
}
ATTNC_HD Span span_max(Span a, Span b) {
  if (!a.ok || !b.ok) return Span::any();
  return Span{a.lo > b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi, true};
}
ATTNC_HD Span span_neg(Span a) { return a.ok ? Span::checked(-a.hi, -a.lo) : Span::any(); }
// The hull of two spans (a select whose condition is unknown).
ATTNC_HD Span span_hull(Span a, Span b) {
  if (!a.ok || !b.ok) return Span::any();
  return Span{a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi, true};
}
ATTNC_HD Span span_select(Tri c, Span a, Span b) {
  if (!c.may_false) return a;
  if (!c.may_true) return b;
  return span_hull(a, b);
}

// Comparisons of spans: may the comparison be true, may it be false, on some pair of the box.
ATTNC_HD Tri span_lt(Span a, Span b) {
  if (!a.ok || !b.ok) return Tri::unknown();
  return Tri{a.lo < b.hi, a.hi >= b.lo};
}
ATTNC_HD Tri span_le(Span a, Span b) {
  if (!a.ok || !b.ok) return Tri::unknown();
  return Tri{a.lo <= b.hi, a.hi > b.lo};
}
ATTNC_HD Tri span_gt(Span a, Span b) { return span_lt(b, a); }
ATTNC_HD Tri span_ge(Span a, Span b) { return span_le(b, a); }
ATTNC_HD Tri span_eq(Span a, Span b) {
  if (!a.ok || !b.ok) return Tri::unknown();
  const bool apart = a.hi < b.lo || b.hi < a.lo;
  const bool one_value = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return Tri{!apart, !one_value};
}
ATTNC_HD Tri tri_not(Tri a) { return Tri{a.may_false, a.may_true}; }
ATTNC_HD Tri span_ne(Span a, Span b) { return tri_not(span_eq(a, b)); }
ATTNC_HD Tri tri_and(Tri a, Tri b) { return Tri{a.may_true && b.may_true, a.may_false || b.may_false}; }
ATTNC_HD Tri tri_or(Tri a, Tri b) { return Tri{a.may_true || b.may_true, a.may_false && b.may_false}; }
ATTNC_HD Tri tri_select(Tri c, Tri a, Tri b) {
  if (!c.may_false) return a;
  if (!c.may_true) return b;
  return Tri{a.may_true || b.may_true, a.may_false || b.may_false};
}

// The box's class from the mask's Tri (kPartial: the pairs must be scanned).
ATTNC_HD TileClass tri_class(Tri mask) {
  if (!mask.may_true) return TileClass::kEmpty;
  if (!mask.may_false) return TileClass::kFull;
  return TileClass::kPartial;
}

// One thread reads every index.
struct SerialLanes {
  ATTNC_HD int first() const { return 0; }
  ATTNC_HD int step() const { return 1; }
  ATTNC_HD int min(int x) const { return x; }
  ATTNC_HD int max(int x) const { return x; }
};

#ifdef __CUDACC__
// The 32 lanes of a warp split the reads and combine their minima and maxima.
struct WarpLanes {
  int lane;
  __device__ __forceinline__ int first() const { return lane; }
  __device__ __forceinline__ int step() const { return 32; }
  __device__ __forceinline__ int min(int x) const {
#pragma unroll
    for (int d = 16; d > 0; d /= 2) {
      const int y = __shfl_xor_sync(0xffffffffu, x, d);
      x = y < x ? y : x;
    }
    return x;
  }
  __device__ __forceinline__ int max(int x) const {
#pragma unroll
    for (int d = 16; d > 0; d /= 2) {
      const int y = __shfl_xor_sync(0xffffffffu, x, d);
      x = y > x ? y : x;
    }
    return x;
  }
};
#endif

// The span of `read(i)` over the indices i in [lo, hi] (an empty range: any()). Indices below
// 0 read as `below` (a q_pos before the request's keys reads 0); `read` is called for indices
// in [max(lo, 0), hi] only, each by one lane.
template <class Lanes, class Read>
ATTNC_HD Span token_span(const Lanes& lanes, long long lo, long long hi, int below, Read read) {
  if (lo > hi) return Span::any();
  int mn = 2147483647, mx = -2147483647 - 1;
  if (lo < 0) {
    mn = below;
    mx = below;
    lo = 0;
  }
  for (long long i = lo + lanes.first(); i <= hi; i += lanes.step()) {
    const int x = read(static_cast<int>(i));
    mn = x < mn ? x : mn;
    mx = x > mx ? x : mx;
  }
  return Span{lanes.min(mn), lanes.max(mx), true};
}

}  // namespace attnc
