// Owns: the integer math behind generated `kv_range` / `classify` functions of linear masks.
//
// A linear mask is a conjunction of constraints `cq*q_idx + ck*kv_idx + c >= 0` (attnc's
// mask analysis emits them as a small `LinearConstraint` array). `linear_kv_range` projects
// the constraints onto kv_idx for a range of queries by eliminating q_idx (Fourier-Motzkin
// over the reals, then integer rounding); `linear_classify` uses the same projection for
// EMPTY and the worst tile corner of every constraint for FULL. Answers are conservative:
// a tile may be called PARTIAL when it is FULL or EMPTY, never the other way round.
// `linear_row_kv_range` gives the exact keys of one query (kernels test those instead of the
// mask on PARTIAL tiles).
// A union mask is a disjunction of such conjunctions (`linear_union_kv_range` /
// `linear_union_classify`): the hull of the terms' KV ranges, FULL when some term is FULL,
// EMPTY when every term is EMPTY, else PARTIAL.
// All arithmetic is 64-bit so products of coefficients and indices cannot overflow.
// This file mirrors attnc/compiler/mask_tiles.py (the KV range) and tests/tile_class_oracle.py
// (the tile class); keep them in step.
#pragma once

#include "variant_contract.cuh"

namespace attnc {

// cq*q_idx + ck*kv_idx + c >= 0
struct LinearConstraint {
  long long cq;
  long long ck;
  long long c;
};

ATTNC_HD long long min_ll(long long a, long long b) { return a < b ? a : b; }
ATTNC_HD long long max_ll(long long a, long long b) { return a > b ? a : b; }

// floor(a / b) for b > 0 (C++ division truncates toward zero).
ATTNC_HD long long floor_div(long long a, long long b) {
  long long q = a / b;
  return (q * b != a && a < 0) ? q - 1 : q;
}

// ceil(a / b) for b > 0.
ATTNC_HD long long ceil_div(long long a, long long b) { return -floor_div(-a, b); }

// Intersect the inclusive interval [lo, hi] with the integer solutions of a*k + c >= 0.
// An empty interval (lo > hi) stays empty: lo only grows and hi only shrinks.
ATTNC_HD void bound_kv(long long a, long long c, long long& lo, long long& hi) {
  if (a > 0) {
    lo = max_ll(lo, ceil_div(-c, a));
  } else if (a < 0) {
    hi = min_ll(hi, floor_div(c, -a));
  } else if (c < 0) {
    lo = max_ll(lo, 1);
    hi = min_ll(hi, 0);
  }
}

// Narrow [lo, hi] to the kv values that some real q in [q_lo, q_hi] allows. N, the number of
// constraints, is a template argument so that the loops unroll and the constraints stay in
// registers (a runtime count left them in local memory in the Hopper producer).
template <int N>
ATTNC_HD void project_to_kv(const LinearConstraint* cons, long long q_lo, long long q_hi,
                            long long& lo, long long& hi) {
  if (q_lo > q_hi) {
    lo = 1;
    hi = 0;
    return;
  }
  // Index -1 stands for the box bound: q >= q_lo as a lower, q <= q_hi as an upper bound.
  for (int i = -1; i < N; ++i) {
    const LinearConstraint l = i < 0 ? LinearConstraint{1, 0, -q_lo} : cons[i];
    if (l.cq <= 0) continue;
    for (int j = -1; j < N; ++j) {
      const LinearConstraint u = j < 0 ? LinearConstraint{-1, 0, q_hi} : cons[j];
      if (u.cq >= 0) continue;
      const long long a = l.cq, b = -u.cq;
      bound_kv(a * u.ck + b * l.ck, a * u.c + b * l.c, lo, hi);
    }
  }
  for (int i = 0; i < N; ++i) {
    if (cons[i].cq == 0) bound_kv(cons[i].ck, cons[i].c, lo, hi);
  }
}

// KV range of queries [q_begin, q_end) under a linear mask of N constraints, clipped to
// [0, kv_len).
template <int N>
ATTNC_HD KvRange linear_kv_range(const LinearConstraint* cons, int q_begin, int q_end,
                                 int kv_len) {
  long long lo = 0, hi = static_cast<long long>(kv_len) - 1;
  project_to_kv<N>(cons, q_begin, static_cast<long long>(q_end) - 1, lo, hi);
  if (lo > hi) return KvRange{0, 0};
  return KvRange{static_cast<int>(lo), static_cast<int>(hi + 1)};
}

// The keys one query q sees under a linear mask of N constraints, clipped to [0, kv_len):
// each constraint bounds kv_idx on its own once q is fixed, so the interval is exact (the
// mask holds for kv_idx exactly when begin <= kv_idx < end).
template <int N>
ATTNC_HD KvRange linear_row_kv_range(const LinearConstraint* cons, int q, int kv_len) {
  long long lo = 0, hi = static_cast<long long>(kv_len) - 1;
  for (int i = 0; i < N; ++i) bound_kv(cons[i].ck, cons[i].cq * q + cons[i].c, lo, hi);
  if (lo > hi) return KvRange{0, 0};
  return KvRange{static_cast<int>(lo), static_cast<int>(hi + 1)};
}

// KV range when every pair is (or may be) visible.
ATTNC_HD KvRange full_kv_range(int q_begin, int q_end, int kv_len) {
  if (q_begin >= q_end || kv_len <= 0) return KvRange{0, 0};
  return KvRange{0, kv_len};
}

// Class of the tile [q0, q1) x [k0, k1) under a linear mask of N constraints. The tile must
// lie inside the valid range (0 <= q0 < q1 <= q_len, 0 <= k0 < k1 <= kv_len).
template <int N>
ATTNC_HD TileClass linear_classify(const LinearConstraint* cons, int q0, int q1, int k0, int k1) {
  if (q0 >= q1 || k0 >= k1) return TileClass::kEmpty;
  long long lo = k0, hi = static_cast<long long>(k1) - 1;
  project_to_kv<N>(cons, q0, static_cast<long long>(q1) - 1, lo, hi);
  if (lo > hi) return TileClass::kEmpty;
  for (int i = 0; i < N; ++i) {
    const long long q = cons[i].cq >= 0 ? q0 : static_cast<long long>(q1) - 1;
    const long long k = cons[i].ck >= 0 ? k0 : static_cast<long long>(k1) - 1;
    if (cons[i].cq * q + cons[i].ck * k + cons[i].c < 0) return TileClass::kPartial;
  }
  return TileClass::kFull;
}

// KV range of queries [q_begin, q_end) under a union of conjunctions: the hull of the terms'
// non-empty ranges. The terms' constraint counts are the template arguments; term t's
// constraints follow those of the terms before it in cons.
template <int First, int... Rest>
ATTNC_HD KvRange linear_union_kv_range(const LinearConstraint* cons, int q_begin, int q_end,
                                       int kv_len) {
  const KvRange r = linear_kv_range<First>(cons, q_begin, q_end, kv_len);
  if constexpr (sizeof...(Rest) == 0) {
    return r;
  } else {
    const KvRange rest = linear_union_kv_range<Rest...>(cons + First, q_begin, q_end, kv_len);
    if (r.begin >= r.end) return rest;
    if (rest.begin >= rest.end) return r;
    return KvRange{r.begin < rest.begin ? r.begin : rest.begin,
                   r.end > rest.end ? r.end : rest.end};
  }
}

// Class of the tile [q0, q1) x [k0, k1) under a union of conjunctions (layout and template
// arguments as in linear_union_kv_range): FULL if some term is FULL, EMPTY if every term is
// EMPTY.
template <int First, int... Rest>
ATTNC_HD TileClass linear_union_classify(const LinearConstraint* cons, int q0, int q1, int k0,
                                         int k1) {
  const TileClass c = linear_classify<First>(cons, q0, q1, k0, k1);
  if constexpr (sizeof...(Rest) == 0) {
    return c;
  } else {
    if (c == TileClass::kFull) return c;
    const TileClass rest = linear_union_classify<Rest...>(cons + First, q0, q1, k0, k1);
    if (rest == TileClass::kFull) return rest;
    return c == TileClass::kEmpty && rest == TileClass::kEmpty ? TileClass::kEmpty
                                                               : TileClass::kPartial;
  }
}

// Class of a tile when there is no mask (or it is constant true).
ATTNC_HD TileClass unmasked_classify(int q0, int q1, int k0, int k1) {
  return (q0 >= q1 || k0 >= k1) ? TileClass::kEmpty : TileClass::kFull;
}

// Class of a tile when the mask is not understood: evaluate it per element.
ATTNC_HD TileClass opaque_classify(int q0, int q1, int k0, int k1) {
  return (q0 >= q1 || k0 >= k1) ? TileClass::kEmpty : TileClass::kPartial;
}

}  // namespace attnc
