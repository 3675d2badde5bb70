// Owns: the first pass of the host decode planner: the constants of its cost model, the
// checks of its inputs, and for one candidate chunk size the chunks of every request and the
// sizes of every output (plan_counts). "The oracle" below is the numpy scheduler kept in
// the tests (tests/codegen/decode_schedule_oracle.py); results match it bit for bit:
// integers are int64 with its rounding, float costs use its operations in its order
// (compiled with -ffp-contract=off), and ties break its way.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <cmath>

#include "decode_plan_abi.h"
#include "page_table_check.h"

namespace attnc {
namespace decode_plan {

constexpr int kItemInts = 8;
constexpr int kMergeInts = 4;
constexpr int kHeaderInts = 16;
constexpr double kItemOverhead = 128.0;              // oracle ITEM_OVERHEAD
constexpr double kMergeOverhead = 256.0;             // oracle MERGE_OVERHEAD
constexpr int64_t kMaxLen = INT32_MAX;  // counts (batch, heads, items) must lie in [0, kMaxLen]
constexpr int64_t kMaxScalar = (int64_t(1) << 30);  // heads, q_len, ... lie in [1, kMaxScalar)
constexpr int64_t kHugeChunk = int64_t(1) << 62;    // any chunk above this splits nothing

// Header fields (decode_args.h: AttncDecodeHeader).
constexpr int kHNumItems = 0, kHQLen = 1, kHBatch = 2, kHMergeRows = 3, kHNumMerge = 4;

struct Counts {
  int64_t chunk;         // KV tokens per chunk (0 when nothing is split)
  int64_t slots;         // partial-state slots
  int64_t total_chunks;  // KV chunks over all requests
  int64_t num_split;     // split requests (rows of merge_items)
  int64_t num_items;     // total_chunks * num_kv_heads * row_blocks
  int64_t split_any;
  int64_t longest;       // KV tokens of the longest chunk
};

// Ceil division for a >= 0, b > 0 (numpy's -(-a // b) on non-negative values).
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// the oracle's _chunk_counts for one request: number of chunks and chunk length.
inline void chunk_count(int64_t kv, int64_t chunk, int64_t tile, int64_t* n_out,
                        int64_t* size_out) {
  int64_t n = std::max<int64_t>(1, ceil_div(kv, chunk));
  int64_t size = ceil_div(kv, n);
  size = std::max(tile, ceil_div(size, tile) * tile);
  *n_out = std::max<int64_t>(1, ceil_div(kv, size));
  *size_out = size;
}

// The KV lengths the planner chunks: plan_lens when given, else the requests' lengths.
inline const int64_t* planned_lens(const AttncPlanParams& p) {
  return p.plan_lens != nullptr ? p.plan_lens : p.kv_lens;
}

// plan_lens and kv_offset describe, for every request, a range inside [0, kv_lens[r]].
inline bool visible_ok(const AttncPlanParams& p) {
  if (p.plan_lens == nullptr) return true;
  if (p.kv_offset == nullptr || p.visible_count != p.batch) return false;
  for (int64_t r = 0; r < p.batch; ++r) {
    const int64_t off = p.kv_offset[r], len = p.plan_lens[r];
    if (off < 0 || len < 0 || off > p.kv_lens[r] || len > p.kv_lens[r] - off) return false;
  }
  return true;
}

// The split factors: 0 to ATTNC_PLAN_MAX_SPLIT_FACTORS of them, each in [1, kMaxScalar).
inline bool split_factors_ok(const AttncPlanParams& p) {
  if (p.num_split_factors < 0 || p.num_split_factors > ATTNC_PLAN_MAX_SPLIT_FACTORS) return false;
  for (int64_t k = 0; k < p.num_split_factors; ++k)
    if (p.split_factors[k] < 1 || p.split_factors[k] >= kMaxScalar) return false;
  return true;
}

inline bool params_ok(const AttncPlanParams& p) {
  auto in = [](int64_t v) { return v >= 1 && v < kMaxScalar; };
  return p.batch >= 0 && p.batch < kMaxLen && in(p.q_len) && in(p.num_qo_heads) &&
         in(p.num_kv_heads) && in(p.row_blocks) && in(p.num_ctas) && in(p.kv_tile) &&
         std::isfinite(p.alpha) && std::isfinite(p.beta) && p.alpha > 0.0 && p.beta > 0.0 &&
         (p.batch == 0 || (p.kv_lens != nullptr && p.req_page_begin != nullptr));
}

// First pass for one candidate (oracle _split of choose_chunk(..., split_factor); 0: no
// split): chunk size, chunks per request (``num_chunks`` [batch]) and the sizes of every
// output. ATTNC_PLAN_OUT_OF_RANGE leaves the outputs undefined.
inline int plan_counts(const AttncPlanParams& p, int64_t split_factor, int64_t* num_chunks,
                       Counts* c) {
  if (!params_ok(p)) return ATTNC_PLAN_OUT_OF_RANGE;
  const int64_t* kv = planned_lens(p);
  const int64_t batch = p.batch;
  int64_t sum = 0, kv_max = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t v = kv[r];
    if (v < 0 || v > page_table::kMaxRequestTokens) return ATTNC_PLAN_OUT_OF_RANGE;
    sum += v;
    kv_max = std::max(kv_max, v);
  }
  const int64_t units = p.num_kv_heads * p.row_blocks;
  const int64_t slot_rows = p.q_len * p.num_qo_heads;

  // choose_chunk, operation for operation.
  const double item_q = p.alpha * static_cast<double>(p.q_len);
  const double total = static_cast<double>(units) *
                       (item_q * static_cast<double>(batch) + p.beta * static_cast<double>(sum));
  const double per_cta = total / static_cast<double>(p.num_ctas);
  const double x =
      (per_cta - item_q) / p.beta / static_cast<double>(split_factor > 0 ? split_factor : 1);
  if (!std::isfinite(x)) return ATTNC_PLAN_OUT_OF_RANGE;  // int(x) raises in Python
  bool huge = split_factor <= 0;
  int64_t chunk0 = 0;
  if (huge) {
    // "no split": oracle _split(kv, 0, ...)
  } else if (x >= 9.2e18) {
    huge = true;  // a Python int beyond int64: no request is longer
    chunk0 = 0;
  } else if (x <= -9.2e18) {
    chunk0 = p.min_chunk;
  } else {
    chunk0 = std::max(p.min_chunk, static_cast<int64_t>(x));
  }
  if (!huge && chunk0 > kHugeChunk) huge = true;
  if (!huge && chunk0 <= 0) return ATTNC_PLAN_OUT_OF_RANGE;  // chunks must be positive
  int64_t chunk = huge ? 0 : ceil_div(chunk0, p.kv_tile) * p.kv_tile;

  bool split_any = batch > 0 && !huge && kv_max > chunk;
  int64_t slots = 0;
  while (split_any) {
    slots = 0;
    c->longest = 0;
    for (int64_t r = 0; r < batch; ++r) {
      int64_t n, size;
      chunk_count(kv[r], chunk, p.kv_tile, &n, &size);
      num_chunks[r] = n;
      if (n > 1) slots += n;
      c->longest = std::max(c->longest, std::min(kv[r], size));
    }
    int64_t need;
    const bool fits = !__builtin_mul_overflow(slots, slot_rows, &need) && need <= p.max_part_rows;
    if (fits || slots == 0) {
      split_any = slots > 0;
      break;
    }
    chunk *= 2;
    split_any = kv_max > chunk;
  }
  int64_t total_chunks = batch, num_split = 0;
  if (split_any) {
    total_chunks = 0;
    for (int64_t r = 0; r < batch; ++r) {
      total_chunks += num_chunks[r];
      num_split += num_chunks[r] > 1;
    }
  } else {
    for (int64_t r = 0; r < batch; ++r) num_chunks[r] = 1;
    chunk = 0;
    slots = 0;
  }
  int64_t num_items;
  if (total_chunks >= kMaxLen || __builtin_mul_overflow(total_chunks, units, &num_items) ||
      num_items >= kMaxLen)
    return ATTNC_PLAN_OUT_OF_RANGE;  // int32 item indices would wrap
  // Every cost is positive and their sum finite (the CTA split divides by it): checked here,
  // before anything is written, so plan_fill cannot fail after writing.
  const double bound = static_cast<double>(units) * (item_q * static_cast<double>(total_chunks) +
                                                     p.beta * static_cast<double>(sum));
  if (!(bound < 1e300) || !(item_q > 0.0)) return ATTNC_PLAN_OUT_OF_RANGE;
  c->chunk = chunk;
  c->slots = slots;
  c->total_chunks = total_chunks;
  c->num_split = num_split;
  c->num_items = num_items;
  c->split_any = split_any;
  if (!split_any) c->longest = kv_max;
  return ATTNC_PLAN_OK;
}

}  // namespace decode_plan
}  // namespace attnc
