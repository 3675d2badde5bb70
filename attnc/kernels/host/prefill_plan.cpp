// Owns: the plain C entry points of the host prefill planner library (built by the JIT from
// this file: attnc/runtime/planning/prefill_plan_library.py loads it with ctypes) and the
// order of one plan: the batch checks, the workspace check, the tiles' KV ranges, the chunks,
// the heaviest-first order and the packed lists. Only pointers and integers cross; the structs
// are those of prefill_plan_abi.h, the codes those of attnc/abi_codes.h.
#include <stdint.h>

#include <cmath>

#include "c_boundary.h"
#include "prefill_plan_check.h"
#include "prefill_plan_write.h"

namespace attnc {
namespace prefill_plan {

// List bytes a partial row may add (PART_ROW_RESERVE of tests/codegen/prefill_schedule_oracle.py).
constexpr int64_t kPartRowReserve = 32;

// Scalars the planner's integer arithmetic relies on.
inline bool shape_ok(const AttncPrefillParams& p) {
  const bool counts = p.num_qo_heads >= 1 && p.num_kv_heads >= 1 && p.head_dim >= 1 &&
                      p.tile_q_tokens >= 1 && p.kv_align >= 1 && p.min_chunk >= 1 &&
                      p.max_chunks >= 1 && p.num_ctas >= 0 && p.batch >= 0 &&
                      p.walk_ctas >= 0 && p.walk_ctas < (INT64_C(1) << 30);
  const bool costs = std::isfinite(p.alpha) && std::isfinite(p.beta) && p.beta > 0;
  const bool ranges = p.ranges.rows == nullptr || mask_ranges::rows_ok(p.ranges, p.batch);
  const bool map = p.tile_map == nullptr || p.kv_block >= 1;
  return counts && costs && ranges && map && p.num_qo_heads < (INT64_C(1) << 30) &&
         p.num_kv_heads < (INT64_C(1) << 30) && p.tile_q_tokens < (INT64_C(1) << 30);
}

// s.walk.at: the list index of each item position (prefill_plan_walk.h), from the n chunks'
// costs in heaviest-first order, each repeated for the KV heads.
inline void place_for_walk(const AttncPrefillParams& p, Scratch& s, int64_t n) {
  const int64_t hkv = p.num_kv_heads;
  s.walk.w.resize(n * hkv);
  for (int64_t i = 0; i < n; ++i) {
    const double w = s.chunk_cost[s.order[i]] + kWalkItemCost;
    for (int64_t h = 0; h < hkv; ++h) s.walk.w[i * hkv + h] = w;
  }
  balance_walk(s.walk, p.walk_ctas);
}

// The plan of a checked batch (q_lens / kv_lens filled by check_batch) into p.out.
inline int plan(const AttncPrefillParams& p, AttncPrefillResult* r, Scratch& s) {
  r->error = 0, r->needed_bytes = 0;
  if (!shape_ok(p)) return ATTNC_PLAN_OUT_OF_RANGE;
  // The workspace check needs only the tile count: a batch too large for it is refused
  // before the per-tile arrays are sized (gigabytes for 2^31 tokens).
  const int64_t tiles = count_query_tiles(p);
  const Layout unsplit = place_lists(p, tiles * p.num_kv_heads * kItemInts, 0);
  const int64_t free = p.workspace_bytes - unsplit.total - 4 * kAlign - p.map_reserve;
  if (free < 0) {
    r->error = ATTNC_PP_WORKSPACE, r->needed_bytes = unsplit.total + 4 * kAlign;
    return ATTNC_PLAN_CAPACITY;
  }
  query_tiles(p, s, tiles);
  const int64_t max_part_rows = free / (4 * (p.head_dim + 1) + kPartRowReserve);
  if (!tile_ranges(p, s)) return ATTNC_PLAN_OUT_OF_RANGE;
  int64_t chunk = 0;
  const int64_t part_rows = choose_chunks(p, s, max_part_rows, &chunk);
  const int64_t n = order_chunks(p, s);
  std::vector<int64_t>& split = s.split;  // the split tiles, in tile order
  split.clear();
  for (int64_t t = 0; t < tiles; ++t)
    if (s.count[t] > 1) split.push_back(t);
  const int64_t n_merge = static_cast<int64_t>(split.size());
  const Layout l = place_lists(p, n * p.num_kv_heads * kItemInts, n_merge * kMergeInts);
  if (l.total > p.out_bytes) {
    r->error = ATTNC_PP_OUT_BUFFER, r->needed_bytes = l.total;
    return ATTNC_PLAN_CAPACITY;
  }
  if (p.out_cost != nullptr && n > p.out_cost_cap) {
    r->error = ATTNC_PP_COST_BUFFER, r->needed_bytes = n;
    return ATTNC_PLAN_CAPACITY;
  }
  place_for_walk(p, s, n);
  write_lists(p, s, l, n, split);
  if (p.out_cost != nullptr)
    for (int64_t i = 0; i < n; ++i) p.out_cost[i] = s.chunk_cost[s.order[i]];
  r->num_items = n * p.num_kv_heads, r->num_merge = n_merge, r->num_chunks = n;
  r->part_rows = part_rows, r->chunk_size = chunk, r->total_bytes = l.total;
  r->off_qo_indptr = l.qo_indptr, r->off_kv_indptr = l.kv_indptr;
  r->off_kv_token_start = l.kv_token_start, r->off_tile_map_start = l.tile_map_start;
  r->off_kv_indices = l.kv_indices, r->off_kv_last_page_len = l.kv_last_page_len;
  r->off_items = l.items, r->off_merge_items = l.merge_items;
  r->batch = p.batch, r->num_indices = p.num_indices, r->num_last = p.num_last;
  return ATTNC_PLAN_OK;
}

}  // namespace prefill_plan
}  // namespace attnc

extern "C" {

// Check the batch description and write each request's lengths (prefill_plan_check.h).
ATTNC_PREFILL_PLAN_EXPORT int attnc_prefill_check(AttncPrefillParams* params,
                                                  AttncPrefillResult* result) {
  return attnc::no_throw([&] { return attnc::prefill_plan::check_batch(*params, result); });
}

// Plan a checked batch into params->out (the check's fields of ``result`` are kept).
// ATTNC_PLAN_NO_MEMORY: its scratch could not be allocated.
ATTNC_PREFILL_PLAN_EXPORT int attnc_prefill_plan(const AttncPrefillParams* params,
                                                 AttncPrefillResult* result) {
  static thread_local attnc::prefill_plan::Scratch scratch;
  return attnc::no_throw([&] { return attnc::prefill_plan::plan(*params, result, scratch); });
}

// out[0, batch + 1): where each request's tile map starts for query tiles of ``tile`` tokens
// and ``block`` keys per column (tests/tile_map_oracle.py map_starts); the last: map bytes.
ATTNC_PREFILL_PLAN_EXPORT void attnc_prefill_map_starts(const AttncPrefillParams* params,
                                                       int64_t tile, int64_t block, int64_t* out) {
  const attnc::prefill_plan::Divisor by_tile(tile), by_block(block);
  out[0] = 0;
  for (int64_t r = 0; r < params->batch; ++r) {
    const int64_t rows = by_tile.ceil(params->q_lens[r]);
    out[r + 1] = out[r] + rows * by_block.ceil(params->kv_lens[r]);
  }
}

// The per-query-tile summary of a tile map the plan ranges tiles by (map_rows), for
// BatchPrefillWrapper.tile_map (planning/tile_map.py summarize): reads batch, q_lens, kv_lens,
// tile_q_tokens, tile_map, tile_map_len and kv_block. counts[0] and counts[1] are the batch's
// query tiles and map entries. With room for them (tiles_cap tiles, entries_cap >= entries + 1)
// it writes, per tile (requests in order), where its map row starts and its first and
// one-past-last non-EMPTY column (both 0 when none), and in cumulative[0, entries + 1] the
// non-EMPTY entries before each entry; else ATTNC_PLAN_CAPACITY. ATTNC_PLAN_OUT_OF_RANGE: a
// tile or block below 1, a length below 0 or above page_table::kMaxRequestTokens, or a map
// shorter than the batch needs. Allocates nothing.
ATTNC_PREFILL_PLAN_EXPORT int attnc_prefill_map_summary(const AttncPrefillParams* params,
                                                        int64_t* counts, int64_t tiles_cap,
                                                        int64_t entries_cap, int64_t* row_start,
                                                        int64_t* first, int64_t* end,
                                                        int64_t* cumulative) {
  const AttncPrefillParams& p = *params;
  constexpr int64_t kMax = attnc::page_table::kMaxRequestTokens;
  if (p.tile_q_tokens < 1 || p.kv_block < 1) return ATTNC_PLAN_OUT_OF_RANGE;
  for (int64_t r = 0; r < p.batch; ++r) {
    if (p.q_lens[r] < 0 || p.kv_lens[r] < 0 || p.q_lens[r] > kMax || p.kv_lens[r] > kMax)
      return ATTNC_PLAN_OUT_OF_RANGE;
  }
  int64_t tiles = 0, entries = 0;
  if (!attnc::prefill_plan::map_rows(p, &tiles, &entries, nullptr)) return ATTNC_PLAN_OUT_OF_RANGE;
  counts[0] = tiles, counts[1] = entries;
  if (tiles > tiles_cap || entries >= entries_cap) return ATTNC_PLAN_CAPACITY;
  const attnc::prefill_plan::MapRows rows{row_start, first, end};
  attnc::prefill_plan::map_rows(p, &tiles, &entries, &rows);  // passed above
  cumulative[0] = 0;
  for (int64_t i = 0; i < entries; ++i) cumulative[i + 1] = cumulative[i] + (p.tile_map[i] != 0);
  return ATTNC_PLAN_OK;
}

// sizeof of the two structs, checked against the ctypes mirrors at load time.
ATTNC_PREFILL_PLAN_EXPORT void attnc_prefill_plan_sizes(int64_t* out) {
  out[0] = static_cast<int64_t>(sizeof(AttncPrefillParams));
  out[1] = static_cast<int64_t>(sizeof(AttncPrefillResult));
}

}  // extern "C"
