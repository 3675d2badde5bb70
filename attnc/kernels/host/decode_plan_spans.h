// Owns: the KV span each decode request's chunks cover under a mask with plan-time params,
// computed in the step from the request's KV length: the same integers as
// attnc/runtime/planning/mask_ranges.py (tile_kv_ranges for the request's q_len queries, then
// decode_spans), for masks whose linear bounds read only q_len, kv_len and scalar params.
//
// The span table (int64, built by attnc/runtime/planning/decode_plan_spans.py):
//   n_terms, n_guards,
//   per term (a conjunction; the mask is their union): n_cons, then n_cons x (cq, ck, c0, ckv)
//   n_guards x (cq, ck, c0, ckv)
// Each row is ``cq*q_idx + ck*kv_idx + c >= 0`` with ``c = c0 + ckv*kv_len`` (q_len and the
// params already folded into c0). int64 arithmetic wraps as numpy's does.
#pragma once
#include <stdint.h>

#include <algorithm>

namespace attnc {
namespace decode_plan {

constexpr int kSpanRow = 4;  // cq, ck, c0, ckv

inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline int64_t wrap_neg(int64_t a) {
  return static_cast<int64_t>(uint64_t(0) - static_cast<uint64_t>(a));
}
// numpy's a // b for b > 0.
inline int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// mask_ranges._bound: [lo, hi] narrowed to the integer solutions of a*k + c >= 0.
inline void bound_kv(int64_t a, int64_t c, int64_t* lo, int64_t* hi) {
  if (a > 0) {
    *lo = std::max(*lo, wrap_neg(floor_div(c, a)));
  } else if (a < 0) {
    *hi = std::min(*hi, floor_div(c, -a));
  } else if (c < 0) {
    *lo = std::max<int64_t>(*lo, 1);
    *hi = std::min<int64_t>(*hi, 0);
  }
}

// One row's (cq, ck, c) for KV length kv.
struct SpanCons {
  int64_t cq, ck, c;
};
inline SpanCons span_row(const int64_t* row, int64_t kv) {
  return SpanCons{row[0], row[1], wrap_add(row[2], wrap_mul(row[3], kv))};
}

// mask_ranges._conjunction_range of the queries [0, q_len) of one request: q eliminated
// between every lower bound on it (q >= 0 first, then rows with cq > 0) and every upper bound
// (q <= q_len - 1 first, then rows with cq < 0), then the rows without q.
inline void term_range(const int64_t* rows, int64_t n, int64_t q_len, int64_t kv,
                       int64_t* begin, int64_t* end) {
  int64_t lo = 0, hi = kv - 1;
  for (int64_t l = -1; l < n; ++l) {
    const SpanCons lc = l < 0 ? SpanCons{1, 0, 0} : span_row(rows + l * kSpanRow, kv);
    if (l >= 0 && lc.cq <= 0) continue;
    for (int64_t u = -1; u < n; ++u) {
      const SpanCons uc = u < 0 ? SpanCons{-1, 0, q_len - 1} : span_row(rows + u * kSpanRow, kv);
      if (u >= 0 && uc.cq >= 0) continue;
      const int64_t a = lc.cq, b = -uc.cq;
      bound_kv(a * uc.ck + b * lc.ck, wrap_add(wrap_mul(a, uc.c), wrap_mul(b, lc.c)), &lo, &hi);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const SpanCons x = span_row(rows + i * kSpanRow, kv);
    if (x.cq == 0) bound_kv(x.ck, x.c, &lo, &hi);
  }
  const bool ok = lo <= hi;
  *begin = ok ? lo : 0;
  *end = ok ? wrap_add(hi, 1) : 0;
}

// mask_ranges._may_wrap for one request: a guard's form may leave the i32 range.
inline bool span_may_wrap(const int64_t* guards, int64_t n, int64_t q_len, int64_t kv) {
  const int64_t q_top = std::max<int64_t>(q_len - 1, 0), k_top = std::max<int64_t>(kv - 1, 0);
  bool wraps = false;
  for (int64_t g = 0; g < n; ++g) {
    const SpanCons x = span_row(guards + g * kSpanRow, kv);
    const int64_t low = wrap_add(wrap_add(x.c, wrap_mul(std::min<int64_t>(x.cq, 0), q_top)),
                                 wrap_mul(std::min<int64_t>(x.ck, 0), k_top));
    const int64_t high = wrap_add(wrap_add(x.c, wrap_mul(std::max<int64_t>(x.cq, 0), q_top)),
                                  wrap_mul(std::max<int64_t>(x.ck, 0), k_top));
    wraps |= low < INT32_MIN || high > INT32_MAX;
  }
  return wraps;
}

// The table's shape is sound: n_terms >= 1, n_guards >= 0, every count >= 0, the rows end
// exactly at ``len``.
inline bool span_table_ok(const int64_t* t, int64_t len) {
  if (t == nullptr || len < 2 || t[0] < 1 || t[1] < 0) return false;
  int64_t pos = 2;
  for (int64_t term = 0; term < t[0]; ++term) {
    if (pos >= len || t[pos] < 0 || t[pos] > (len - pos - 1) / kSpanRow) return false;
    pos += 1 + t[pos] * kSpanRow;
  }
  return t[1] <= (len - pos) / kSpanRow && pos + t[1] * kSpanRow == len;
}

// Spans of ``batch`` requests of KV lengths kv[] (mask_ranges.decode_spans): offset[r] is the
// first KV token the request's queries may see rounded down to a multiple of kv_tile,
// length[r] the tokens from there to the end of what they may see (0: none). False when the
// table is malformed or kv_tile / q_len is not positive (nothing written).
inline bool decode_spans(const int64_t* t, int64_t len, const int64_t* kv, int64_t batch,
                         int64_t q_len, int64_t kv_tile, int64_t* offset, int64_t* length) {
  if (!span_table_ok(t, len) || kv_tile <= 0 || q_len <= 0) return false;
  const int64_t n_terms = t[0], n_guards = t[1];
  const int64_t* guards = t + len - n_guards * kSpanRow;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t k = kv[r];
    int64_t begin = 0, end = 0;
    bool live = false;
    const int64_t* term = t + 2;
    for (int64_t i = 0; i < n_terms; ++i) {
      int64_t b, e;
      term_range(term + 1, term[0], q_len, k, &b, &e);
      term += 1 + term[0] * kSpanRow;
      const bool now = b < e;
      if (i == 0) {
        begin = b, end = e, live = now;
      } else if (now) {  // the union's hull over live terms
        begin = live ? std::min(begin, b) : b;
        end = live ? std::max(end, e) : e;
        live = true;
      }
    }
    if (!(live && k > 0)) begin = end = 0;
    if (span_may_wrap(guards, n_guards, q_len, k)) begin = 0, end = k;
    const int64_t first = std::min(std::max<int64_t>(begin, 0), k) / kv_tile * kv_tile;
    offset[r] = first;
    length[r] = std::max<int64_t>(std::min(std::max<int64_t>(end, 0), k) - first, 0);
  }
  return true;
}

}  // namespace decode_plan
}  // namespace attnc
