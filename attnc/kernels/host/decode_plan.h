// Owns: the host decode planner's choice among its candidate chunk sizes and the whole plan
// of one decode step (``plan``): "no split" and the cost per CTA divided by each split
// factor the caller gives; the winner has the smallest predicted step time (its busiest CTA plus the merge),
// the earliest candidate on ties. The result (work region in the caller's buffer, a summary)
// is bit-identical to the oracle's schedule + write_work_region
// (tests/codegen/decode_schedule_oracle.py). No torch, no Python, no CUDA calls.
#pragma once
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>

#include "decode_plan_write.h"

namespace attnc {
namespace decode_plan {

constexpr int kCandidates = 1 + ATTNC_PLAN_MAX_SPLIT_FACTORS;

// Candidates of ``p``: "no split", then one per split factor.
inline int num_candidates(const AttncPlanParams& p) {
  return 1 + static_cast<int>(p.num_split_factors);
}

// The split factor of candidate k (0: no split).
inline int64_t candidate_factor(const AttncPlanParams& p, int k) {
  return k == 0 ? 0 : p.split_factors[k - 1];
}

// The oracle's _lower_bound: no assignment of a candidate's items beats its average CTA
// load or its longest item, plus the merge.
inline double lower_bound(const AttncPlanParams& p, const Counts& c) {
  const int64_t units = p.num_kv_heads * p.row_blocks;
  const double base = p.alpha * static_cast<double>(p.q_len) + kItemOverhead;
  int64_t tokens = 0;
  const int64_t* lens = planned_lens(p);
  for (int64_t r = 0; r < p.batch; ++r) tokens += lens[r];
  const double total = static_cast<double>(c.num_items) * base +
                       static_cast<double>(units) * p.beta * static_cast<double>(tokens);
  const double longest = base + p.beta * static_cast<double>(c.longest);
  return std::max(total / static_cast<double>(p.num_ctas), longest) +
         (c.chunk > 0 ? kMergeOverhead : 0.0);
}

// The winning candidate (its index in *best, its CTA assignment left in s.best_cta), or
// ATTNC_PLAN_CAPACITY with the fewest items any candidate needs in *fewest_out. ``counts[k]``
// and s.cand_chunks[k] hold candidate k's first pass (plan computes them once). A candidate
// whose chunk (after the capacity doubling) an earlier one has is the same plan and is
// dropped. Candidates are tried in order of their lower bounds, so most lose early (a bound
// above the best so far, or an assignment whose busiest CTA passes it). *order_is_best: the
// chunk order in the scratch (order_chunks) is the winner's.
inline int choose_candidate(const AttncPlanParams& p, const Counts* counts, Scratch& s,
                            int* best, int64_t* fewest_out, bool* order_is_best) {
  struct Cand {
    int index;
    double lb;
  };
  Cand cands[kCandidates];
  int64_t n_cands = 0, fewest = -1, tried_n = 0;
  int64_t tried[kCandidates];
  for (int k = 0; k < num_candidates(p); ++k) {
    const Counts& c = counts[k];
    bool seen = false;
    for (int64_t t = 0; t < tried_n; ++t) seen |= tried[t] == c.chunk;
    if (seen) continue;
    tried[tried_n++] = c.chunk;
    fewest = fewest < 0 ? c.num_items : std::min(fewest, c.num_items);
    if (p.max_items >= 0 && c.num_items > p.max_items) continue;
    cands[n_cands++] = {k, lower_bound(p, c)};
  }
  std::sort(cands, cands + n_cands, [](const Cand& a, const Cand& b) {
    return a.lb < b.lb || (a.lb == b.lb && a.index < b.index);
  });
  bool have_best = false;
  double best_time = 0.0;
  for (int64_t k = 0; k < n_cands; ++k) {
    if (have_best && cands[k].lb > best_time * (1.0 + 1e-9)) break;  // nor can the rest
    const int index = cands[k].index;
    order_chunks(p, s.cand_chunks[index].data(), counts[index], s);
    const double time = assign_lpt(p, counts[index], s, have_best ? best_time : HUGE_VAL);
    *order_is_best = false;
    if (!have_best || time < best_time || (time == best_time && index < *best)) {
      have_best = true;
      best_time = time;
      *best = index;
      *order_is_best = true;
      s.best_cta.swap(s.cta);  // the winner's assignment, reused when writing
    }
  }
  *fewest_out = fewest;
  return have_best ? ATTNC_PLAN_OK : ATTNC_PLAN_CAPACITY;
}

// The test-only copies of the plan's arrays (AttncPlanParams.out_*).
inline void copy_test_outputs(const AttncPlanParams& p, const Counts& c) {
  if (p.out_items != nullptr)
    memcpy(p.out_items, p.buf + p.off_items, static_cast<size_t>(c.num_items) * kItemInts * 4);
  if (p.out_cta_indptr != nullptr)
    memcpy(p.out_cta_indptr, p.buf + p.off_cta_indptr, static_cast<size_t>(p.num_ctas + 1) * 4);
  if (p.out_merge_items != nullptr)
    memcpy(p.out_merge_items, p.buf + p.off_merge_items,
           static_cast<size_t>(c.num_split) * kMergeInts * 4);
}

// The oracle's schedule + write_work_region. ATTNC_PLAN_OK: the work region is written and
// ``out`` filled; ATTNC_PLAN_CAPACITY: more than max_items items (out->num_items says how
// many), nothing written; ATTNC_PLAN_OUT_OF_RANGE: an input beyond the planner's limits,
// nothing written to ``buf``.
inline int plan(const AttncPlanParams& p, AttncPlanSummary* out, Scratch& s) {
  if (p.batch < 0 || p.batch >= kMaxLen) return ATTNC_PLAN_OUT_OF_RANGE;
  if (p.batch > 0 && p.kv_lens == nullptr) return ATTNC_PLAN_OUT_OF_RANGE;
  if (!visible_ok(p) || !split_factors_ok(p)) return ATTNC_PLAN_OUT_OF_RANGE;
  // Every candidate must be within the limits (the oracle computes all chunk sizes first).
  Counts counts[kCandidates];
  for (int k = 0; k < num_candidates(p); ++k) {
    s.cand_chunks[k].resize(static_cast<size_t>(p.batch));
    const int rc = plan_counts(p, candidate_factor(p, k), s.cand_chunks[k].data(), &counts[k]);
    if (rc != ATTNC_PLAN_OK) return rc;
  }
  int best = 0;
  int64_t fewest = 0;
  bool order_is_best = false;
  if (choose_candidate(p, counts, s, &best, &fewest, &order_is_best) != ATTNC_PLAN_OK) {
    out->num_items = fewest;
    return ATTNC_PLAN_CAPACITY;
  }
  const Counts& c = counts[best];
  int64_t* num_chunks = s.cand_chunks[best].data();
  if (p.out_num_chunks != nullptr) {
    memcpy(p.out_num_chunks, num_chunks, static_cast<size_t>(p.batch) * sizeof(int64_t));
    num_chunks = p.out_num_chunks;
  }
  int64_t merge_rows;  // an int32 in the header
  if (__builtin_mul_overflow(c.num_split, p.q_len * p.num_qo_heads, &merge_rows) ||
      merge_rows > INT32_MAX)
    return ATTNC_PLAN_OUT_OF_RANGE;
  if (!regions_ok(p, c)) return ATTNC_PLAN_OUT_OF_RANGE;
  if ((p.out_items != nullptr || p.out_cost != nullptr) && p.out_items_cap < c.num_items)
    return ATTNC_PLAN_OUT_OF_RANGE;

  // Nothing can fail from here on.
  if (!order_is_best) order_chunks(p, num_chunks, c, s);
  s.cta.swap(s.best_cta);
  write_work_region(p, num_chunks, c, merge_rows, p.out_cost, s);
  copy_test_outputs(p, c);

  out->num_items = c.num_items;
  out->num_split = c.num_split;
  out->merge_rows = merge_rows;
  out->chunk_size = c.chunk;
  out->num_part_slots = c.slots;
  out->total_chunks = c.total_chunks;
  out->work_bytes = p.off_items + c.num_items * kItemInts * 4;
  return ATTNC_PLAN_OK;
}

}  // namespace decode_plan
}  // namespace attnc
