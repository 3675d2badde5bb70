// Owns: the one host evaluation of a mask's closed-form KV ranges, shared by the prefill
// planner (a range per query tile) and the decode step (a span per request): the row format
// (AttncRangeRows, built by attnc/runtime/planning/mask_ranges.py tile_range_program and
// mirrored by planning/host_planner_abi.py), its shape check, the rows' constants per request,
// the wrap guards, and "the KV range [begin, end) the query rows [q0, q1) of a request may
// see". The numpy reference is tests/mask_ranges_oracle.py tile_kv_ranges; integer arithmetic
// wraps like numpy's int64 and divides like Python's ``//``.
//
// A row is the constraint cq*q_idx + ck*kv_idx + c >= 0 of conjunction ``term`` (-1: a wrap
// guard), with c = c0 + cq_len*q_len + ckv_len*kv_len, plus extra[col][request] when the
// row's ``extra`` column col >= 0 (what the constant reads beyond the lengths and scalar
// params, e.g. a per-request tensor window[batch]). The mask is the union of its terms.
#pragma once
#include <stdint.h>

#include <algorithm>

#define ATTNC_PR_TERM 0
#define ATTNC_PR_CQ 1
#define ATTNC_PR_CK 2
#define ATTNC_PR_C0 3
#define ATTNC_PR_Q_LEN 4
#define ATTNC_PR_KV_LEN 5
#define ATTNC_PR_EXTRA 6
#define ATTNC_PR_COLUMNS 7

extern "C" {

// A mask's range rows as the planners are given them (null rows: no closed form, every query
// row may see the whole KV).
typedef struct AttncRangeRows {
  const int64_t* rows;  // [num_rows, ATTNC_PR_COLUMNS]
  int64_t num_rows;
  int64_t num_terms;     // conjunctions of the mask (a union's terms, else 1)
  const int64_t* extra;  // [num_extra, extra_batch]
  int64_t num_extra;
  int64_t extra_batch;  // requests of ``extra`` (must be the plan's batch)
} AttncRangeRows;

}  // extern "C"

namespace attnc {
namespace mask_ranges {

// numpy int64 arithmetic: wrapping sums, products and negation, floor division.
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline int64_t wrap_neg(int64_t a) {
  return static_cast<int64_t>(uint64_t(0) - static_cast<uint64_t>(a));
}
// a // b for b > 0.
inline int64_t floor_div(int64_t a, int64_t b) {
  if (b == 1) return a;
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// The rows are well formed for a plan of ``batch`` requests: at least one term, every row's
// term in [-1, num_terms) and extra column in [-1, num_extra), the extra columns present and
// of ``batch`` entries each.
inline bool rows_ok(const AttncRangeRows& m, int64_t batch) {
  if (m.rows == nullptr || m.num_terms < 1 || m.num_rows < 0 || m.num_extra < 0) return false;
  if (m.num_extra > 0 && (m.extra == nullptr || m.extra_batch != batch)) return false;
  for (int64_t i = 0; i < m.num_rows; ++i) {
    const int64_t* row = m.rows + i * ATTNC_PR_COLUMNS;
    if (row[ATTNC_PR_TERM] < -1 || row[ATTNC_PR_TERM] >= m.num_terms) return false;
    if (row[ATTNC_PR_EXTRA] < -1 || row[ATTNC_PR_EXTRA] >= m.num_extra) return false;
  }
  return true;
}

// c[i]: the constant of every row i for request r of q_len queries and kv_len keys.
inline void row_constants(const AttncRangeRows& m, int64_t r, int64_t q_len, int64_t kv_len,
                          int64_t* c) {
  for (int64_t i = 0; i < m.num_rows; ++i) {
    const int64_t* row = m.rows + i * ATTNC_PR_COLUMNS;
    int64_t v = wrap_add(row[ATTNC_PR_C0], wrap_mul(row[ATTNC_PR_Q_LEN], q_len));
    v = wrap_add(v, wrap_mul(row[ATTNC_PR_KV_LEN], kv_len));
    const int64_t col = row[ATTNC_PR_EXTRA];
    if (col >= 0) v = wrap_add(v, m.extra[col * m.extra_batch + r]);
    c[i] = v;
  }
}

// Whether a wrap guard's form may leave the i32 range in a request of q_len queries and
// kv_len keys whose row constants are c (mask_ranges_oracle._may_wrap): its KV range is then
// whole.
inline bool may_wrap(const AttncRangeRows& m, const int64_t* c, int64_t q_len, int64_t kv_len) {
  const int64_t q_top = std::max<int64_t>(q_len - 1, 0), k_top = std::max<int64_t>(kv_len - 1, 0);
  for (int64_t i = 0; i < m.num_rows; ++i) {
    const int64_t* row = m.rows + i * ATTNC_PR_COLUMNS;
    if (row[ATTNC_PR_TERM] != -1) continue;
    const int64_t cq = row[ATTNC_PR_CQ], ck = row[ATTNC_PR_CK];
    const int64_t low = wrap_add(wrap_add(c[i], wrap_mul(std::min<int64_t>(cq, 0), q_top)),
                                 wrap_mul(std::min<int64_t>(ck, 0), k_top));
    const int64_t high = wrap_add(wrap_add(c[i], wrap_mul(std::max<int64_t>(cq, 0), q_top)),
                                  wrap_mul(std::max<int64_t>(ck, 0), k_top));
    if (low < INT32_MIN || high > INT32_MAX) return true;
  }
  return false;
}

// Intersect [lo, hi] with the integer solutions of a*k + c >= 0 (mask_ranges_oracle.array_bound).
inline void bound(int64_t a, int64_t c, int64_t& lo, int64_t& hi) {
  if (a > 0) {
    lo = std::max(lo, wrap_neg(floor_div(c, a)));
  } else if (a < 0) {
    hi = std::min(hi, floor_div(c, wrap_neg(a)));
  } else if (c < 0) {
    lo = std::max<int64_t>(lo, 1), hi = std::min<int64_t>(hi, 0);
  }
}

// One conjunction's half-open range for the query rows [q0, q1) (mask_tiles.project_kv:
// q_idx eliminated between every lower bound on it, q_idx >= q0 first, and every upper bound,
// q_idx <= q1 - 1 first; then the rows without q_idx). Empty: (0, 0).
inline void conjunction_range(const AttncRangeRows& m, int64_t term, const int64_t* c, int64_t q0,
                              int64_t q1, int64_t kv_len, int64_t* begin, int64_t* end) {
  int64_t lo = 0, hi = kv_len - 1;
  for (int64_t l = -1; l < m.num_rows; ++l) {
    const int64_t* rl = l < 0 ? nullptr : m.rows + l * ATTNC_PR_COLUMNS;
    if (rl && (rl[ATTNC_PR_TERM] != term || rl[ATTNC_PR_CQ] <= 0)) continue;
    const int64_t cq_l = rl ? rl[ATTNC_PR_CQ] : 1, ck_l = rl ? rl[ATTNC_PR_CK] : 0;
    const int64_t c_l = rl ? c[l] : wrap_neg(q0);
    for (int64_t u = -1; u < m.num_rows; ++u) {
      const int64_t* ru = u < 0 ? nullptr : m.rows + u * ATTNC_PR_COLUMNS;
      if (ru && (ru[ATTNC_PR_TERM] != term || ru[ATTNC_PR_CQ] >= 0)) continue;
      const int64_t cq_u = ru ? ru[ATTNC_PR_CQ] : -1, ck_u = ru ? ru[ATTNC_PR_CK] : 0;
      const int64_t c_u = ru ? c[u] : q1 - 1;
      const int64_t a = cq_l, b = wrap_neg(cq_u);
      bound(wrap_add(wrap_mul(a, ck_u), wrap_mul(b, ck_l)),
            wrap_add(wrap_mul(a, c_u), wrap_mul(b, c_l)), lo, hi);
    }
  }
  for (int64_t i = 0; i < m.num_rows; ++i) {
    const int64_t* row = m.rows + i * ATTNC_PR_COLUMNS;
    if (row[ATTNC_PR_TERM] == term && row[ATTNC_PR_CQ] == 0) bound(row[ATTNC_PR_CK], c[i], lo, hi);
  }
  const bool ok = lo <= hi;
  *begin = ok ? lo : 0;
  *end = ok ? hi + 1 : 0;
}

// The KV range [begin, end) the query rows [q0, q1) of a request of kv_len keys may see
// (mask_ranges_oracle.tile_kv_ranges): the hull of its terms' non-empty ranges, (0, 0) when none
// is or the request has no KV, the whole KV when ``wraps`` (may_wrap of the request). Not
// clipped to [0, kv_len].
inline void kv_range(const AttncRangeRows& m, const int64_t* c, bool wraps, int64_t q0, int64_t q1,
                     int64_t kv_len, int64_t* begin, int64_t* end) {
  if (wraps) {
    *begin = 0, *end = kv_len;
    return;
  }
  int64_t b0 = 0, e0 = 0;
  bool live = false;
  for (int64_t term = 0; term < m.num_terms; ++term) {
    int64_t b, e;
    conjunction_range(m, term, c, q0, q1, kv_len, &b, &e);
    const bool now = b < e;
    if (term == 0) {
      b0 = b, e0 = e, live = now;
    } else if (now) {
      b0 = live ? std::min(b0, b) : b;
      e0 = live ? std::max(e0, e) : e;
      live = true;
    }
  }
  const bool seen = live && kv_len > 0;
  *begin = seen ? b0 : 0;
  *end = seen ? e0 : 0;
}

}  // namespace mask_ranges
}  // namespace attnc
