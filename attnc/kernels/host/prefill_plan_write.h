// Owns: the packed int32 lists of a prefill plan (planning/workspace.py place_int32 and the
// oracle's pack_int32, tests/codegen/prefill_schedule_oracle.py): the regions one after
// another, each 256-byte aligned and zero padded, in the order qo_indptr, kv_indptr,
// kv_token_start, tile_map_start, [kv_indices, kv_last_page_len], items, merge_items; the
// items and merge rows are written straight from the ordered chunks (prefill_plan_schedule.h),
// the items in the places prefill_plan_walk.h gives them. A paged plan holds num_indices page
// ids.
#pragma once
#include <stdint.h>
#include <string.h>

#include "prefill_plan_schedule.h"

namespace attnc {
namespace prefill_plan {

constexpr int64_t kAlign = 256;
constexpr int64_t kItemInts = 8;   // prefill_args.h: ATTNC_PI_SIZE
constexpr int64_t kMergeInts = 4;  // prefill_args.h: ATTNC_PM_SIZE

inline int64_t aligned(int64_t n) { return ceil_nonneg(n, kAlign) * kAlign; }

// Region offsets of one plan's lists (``place_int32``); total is the bytes they span.
struct Layout {
  int64_t qo_indptr, kv_indptr, kv_token_start, tile_map_start, kv_indices, kv_last_page_len;
  int64_t items, merge_items, total;
};

inline Layout place_lists(const AttncPrefillParams& p, int64_t item_ints, int64_t merge_ints) {
  Layout l{};
  int64_t at = 0;
  const int64_t head = aligned((p.batch + 1) * 4);
  l.qo_indptr = at, at += head;
  l.kv_indptr = at, at += head;
  l.kv_token_start = at, at += head;
  l.tile_map_start = at, at += head;
  l.kv_indices = l.kv_last_page_len = -1;
  if (p.kv_indices != nullptr) {
    l.kv_indices = at, at += aligned(p.num_indices * 4);
    l.kv_last_page_len = at, at += aligned(p.num_last * 4);
  }
  l.items = at, at += aligned(item_ints * 4);
  l.merge_items = at, at += aligned(merge_ints * 4);
  l.total = at;
  return l;
}

// An int32 region at byte ``at`` of ``out``, ``region`` bytes long: ``n`` values, then zeros.
template <typename T>
inline void write_region(uint8_t* out, int64_t at, int64_t region, const T* values, int64_t n) {
  int32_t* words = reinterpret_cast<int32_t*>(out + at);
  for (int64_t i = 0; i < n; ++i) words[i] = static_cast<int32_t>(values[i]);
  memset(out + at + 4 * n, 0, static_cast<size_t>(region - 4 * n));
}

// Every list into p.out laid out by ``l``.
inline void write_lists(const AttncPrefillParams& p, Scratch& s, const Layout& l,
                        int64_t num_chunks, const std::vector<int64_t>& split_tiles) {
  const int64_t head = aligned((p.batch + 1) * 4);
  write_region(p.out, l.qo_indptr, head, p.qo_indptr, p.batch + 1);
  write_region(p.out, l.kv_indptr, head, p.kv_indptr, p.batch + 1);
  s.begin.resize(static_cast<size_t>(p.batch + 1));  // kv_token_start, then tile_map_start
  s.begin[0] = 0;
  for (int64_t r = 0; r < p.batch; ++r) s.begin[r + 1] = s.begin[r] + p.kv_lens[r];
  write_region(p.out, l.kv_token_start, head, s.begin.data(), p.batch + 1);
  if (p.tile_map != nullptr) {
    for (int64_t r = 0; r < p.batch; ++r) {
      const int64_t rows = ceil_nonneg(p.q_lens[r], p.tile_q_tokens);
      s.begin[r + 1] = s.begin[r] + rows * ceil_nonneg(p.kv_lens[r], p.kv_block);
    }
    write_region(p.out, l.tile_map_start, head, s.begin.data(), p.batch + 1);
  } else {
    memset(p.out + l.tile_map_start, 0, static_cast<size_t>(head));
  }
  if (p.kv_indices != nullptr) {
    write_region(p.out, l.kv_indices, l.kv_last_page_len - l.kv_indices, p.kv_indices,
                 p.num_indices);
    write_region(p.out, l.kv_last_page_len, l.items - l.kv_last_page_len, p.kv_last_page_len,
                 p.num_last);
  }
  const int64_t hkv = p.num_kv_heads;
  int32_t* items = reinterpret_cast<int32_t*>(p.out + l.items);
  const std::vector<int64_t>& at = s.walk.at;  // list index (chunk * hkv + head) per position
  for (int64_t q = 0; q < num_chunks * hkv; ++q) {
    const int64_t i = at[q] / hkv, h = at[q] - i * hkv;
    const int64_t c = s.order[i], t = s.chunk_tile[c];
    int32_t* row = items + q * kItemInts;
    row[0] = static_cast<int32_t>(s.req[t]), row[1] = static_cast<int32_t>(s.j[t]);
    row[2] = static_cast<int32_t>(h), row[3] = static_cast<int32_t>(s.chunk_begin[c]);
    row[4] = static_cast<int32_t>(s.chunk_end[c]), row[5] = static_cast<int32_t>(s.chunk_part[c]);
    row[6] = row[7] = 0;
  }
  const int64_t item_bytes = num_chunks * hkv * kItemInts * 4;
  const int64_t item_pad = l.merge_items - l.items - item_bytes;
  memset(p.out + l.items + item_bytes, 0, static_cast<size_t>(item_pad));
  int32_t* merge = reinterpret_cast<int32_t*>(p.out + l.merge_items);
  const int64_t n_merge = static_cast<int64_t>(split_tiles.size());
  for (int64_t m = 0; m < n_merge; ++m) {
    const int64_t t = split_tiles[m];
    int32_t* row = merge + m * kMergeInts;
    row[0] = static_cast<int32_t>(s.req[t]), row[1] = static_cast<int32_t>(s.j[t]);
    row[2] = static_cast<int32_t>(s.count[t]), row[3] = static_cast<int32_t>(s.part_base[t]);
  }
  const int64_t merge_bytes = n_merge * kMergeInts * 4;
  memset(p.out + l.merge_items + merge_bytes, 0,
         static_cast<size_t>(l.total - l.merge_items - merge_bytes));
}

}  // namespace prefill_plan
}  // namespace attnc
