// Owns: the second pass of the host decode planner: the work region (items grouped by CTA,
// the per-CTA index, the merge list, the per-request arrays and the header of
// decode_args.h) written into the caller's byte buffer, and the check that every region fits
// that buffer without overlapping another.
#pragma once
#include <stdint.h>
#include <string.h>

#include "decode_plan_order.h"

namespace attnc {
namespace decode_plan {


// Second pass: items [num_items, kItemInts] grouped by CTA (each CTA's items heaviest
// first), cost [num_items] in the same order (tests only; null: not written), cta_indptr [num_ctas + 1], merge [num_split,
// kMergeInts] (all 4-byte aligned), from plan_counts', order_chunks' and assign_lpt's results.
inline void plan_fill(const AttncPlanParams& p, const int64_t* num_chunks, const Counts& c,
                      int32_t* items, double* cost, int32_t* cta_indptr, int32_t* merge,
                      Scratch& s) {
  const int64_t batch = p.batch;
  const int64_t nc = c.total_chunks;
  const bool split_any = c.split_any != 0;
  // Slots of a stable counting sort by CTA.
  s.count.assign(p.num_ctas + 1, 0);
  for (int64_t i = 0; i < c.num_items; ++i) ++s.count[s.cta[i] + 1];
  for (int64_t b = 0; b < p.num_ctas; ++b) s.count[b + 1] += s.count[b];
  for (int64_t b = 0; b <= p.num_ctas; ++b) cta_indptr[b] = static_cast<int32_t>(s.count[b]);

  const double item_q = p.alpha * static_cast<double>(p.q_len);
  const int64_t* lens = planned_lens(p);
  int64_t i = 0;
  for (int64_t q = 0; q < nc; ++q) {
    const uint32_t ch = s.idx[q];
    const int64_t r = s.chunk_req[ch];
    const int64_t j = static_cast<int64_t>(ch) - s.first[r];
    const int64_t begin = j * s.size[r];
    const int64_t end = std::min(begin + s.size[r], lens[r]);
    const int64_t off = p.kv_offset != nullptr && p.plan_lens != nullptr ? p.kv_offset[r] : 0;
    const int32_t slot = num_chunks[r] > 1 ? static_cast<int32_t>(s.part_base[r] + j) : -1;
    const double item_cost = item_q + p.beta * static_cast<double>(end - begin);
    const int32_t r32 = static_cast<int32_t>(r), begin32 = static_cast<int32_t>(off + begin);
    const int32_t end32 = static_cast<int32_t>(off + end);
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      for (int64_t b = 0; b < p.row_blocks; ++b, ++i) {
        const int64_t dst = s.count[s.cta[i]]++;
        int32_t* it = items + dst * kItemInts;
        it[0] = r32;
        it[1] = static_cast<int32_t>(h);
        it[2] = static_cast<int32_t>(b);
        it[3] = begin32;
        it[4] = end32;
        it[5] = slot;
        it[6] = 0;
        it[7] = 0;
        if (cost != nullptr) cost[dst] = item_cost;
      }
    }
  }

  int32_t* m = merge;
  if (split_any) {
    for (int64_t r = 0; r < batch; ++r) {
      if (num_chunks[r] <= 1) continue;
      m[0] = static_cast<int32_t>(r);
      m[1] = static_cast<int32_t>(num_chunks[r]);
      m[2] = static_cast<int32_t>(s.part_base[r]);
      m[3] = 0;
      m += kMergeInts;
    }
  }
}

// int64 -> int32 as numpy's unsafe cast (keeps the low 32 bits).
inline void put_int32(uint8_t* dst, const int64_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(src[i])));
    memcpy(dst + 4 * i, &v, 4);
  }
}

// The regions oracle write_work_region writes: each inside the buffer, 4-byte aligned and
// disjoint from the others (then the order of the writes does not matter).
inline bool regions_ok(const AttncPlanParams& p, const Counts& c) {
  if (p.buf == nullptr || p.buf_bytes < 0) return false;
  const int64_t start[6] = {p.off_header,     p.off_cta_indptr,  p.off_req_page_begin,
                            p.off_req_kv_len, p.off_merge_items, p.off_items};
  const int64_t len[6] = {kHeaderInts * 4,
                          (p.num_ctas + 1) * 4,
                          p.batch * 4,
                          p.batch * 4,
                          c.num_split * kMergeInts * 4,
                          c.num_items * kItemInts * 4};
  for (int i = 0; i < 6; ++i) {
    if (start[i] < 0 || start[i] > p.buf_bytes || len[i] > p.buf_bytes - start[i]) return false;
    if ((reinterpret_cast<uintptr_t>(p.buf) + static_cast<uint64_t>(start[i])) % 4 != 0)
      return false;
  }
  for (int i = 0; i < 6; ++i)
    for (int j = i + 1; j < 6; ++j)
      if (len[i] > 0 && len[j] > 0 && start[i] < start[j] + len[j] && start[j] < start[i] + len[i])
        return false;
  return true;
}

// The oracle's write_work_region: items, cost, per-CTA index and merge list (plan_fill),
// then the header and the per-request arrays, all into p.buf at the layout's offsets
// (regions_ok has passed).
inline void write_work_region(const AttncPlanParams& p, const int64_t* num_chunks,
                              const Counts& c, int64_t merge_rows, double* cost, Scratch& s) {
  int32_t* items = reinterpret_cast<int32_t*>(p.buf + p.off_items);
  int32_t* cta = reinterpret_cast<int32_t*>(p.buf + p.off_cta_indptr);
  int32_t* merge = reinterpret_cast<int32_t*>(p.buf + p.off_merge_items);
  plan_fill(p, num_chunks, c, items, cost, cta, merge, s);
  int32_t header[kHeaderInts] = {0};
  header[kHNumItems] = static_cast<int32_t>(c.num_items);
  header[kHQLen] = static_cast<int32_t>(p.q_len);
  header[kHBatch] = static_cast<int32_t>(p.batch);
  header[kHMergeRows] = static_cast<int32_t>(merge_rows);
  header[kHNumMerge] = static_cast<int32_t>(c.num_split);
  memcpy(p.buf + p.off_header, header, sizeof header);
  put_int32(p.buf + p.off_req_page_begin, p.req_page_begin, p.batch);
  put_int32(p.buf + p.off_req_kv_len, p.kv_lens, p.batch);
}

}  // namespace decode_plan
}  // namespace attnc
