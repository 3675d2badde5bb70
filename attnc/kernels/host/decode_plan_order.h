// Owns: the order and the CTA assignment of the host decode planner: chunks heaviest first
// (a stable radix sort), then longest-processing-time-first onto the least-loaded CTA, whose
// busiest load is the candidate's predicted step time. Bit-identical to the oracle
// (tests/codegen/decode_schedule_oracle.py).
#pragma once
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "decode_plan_chunks.h"

namespace attnc {
namespace decode_plan {

// Stable sort of ``idx`` by ``key`` ascending (LSD radix on 32-bit keys, insertion sort when
// short). Stability makes the result that of numpy's argsort(kind="stable").
inline void stable_sort_by_key(std::vector<uint32_t>& key, std::vector<uint32_t>& idx,
                               std::vector<uint32_t>& key_tmp, std::vector<uint32_t>& idx_tmp) {
  const size_t n = key.size();
  if (n <= 48) {
    for (size_t i = 1; i < n; ++i) {
      const uint32_t k = key[i], v = idx[i];
      size_t j = i;
      while (j > 0 && key[j - 1] > k) {
        key[j] = key[j - 1];
        idx[j] = idx[j - 1];
        --j;
      }
      key[j] = k;
      idx[j] = v;
    }
    return;
  }
  key_tmp.resize(n);
  idx_tmp.resize(n);
  uint32_t all_or = 0, all_and = ~0u;
  for (size_t i = 0; i < n; ++i) {
    all_or |= key[i];
    all_and &= key[i];
  }
  for (int shift = 0; shift < 32; shift += 8) {
    if ((((all_or ^ all_and) >> shift) & 0xffu) == 0) continue;  // one digit value: no-op
    size_t count[257] = {0};
    for (size_t i = 0; i < n; ++i) ++count[((key[i] >> shift) & 0xffu) + 1];
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (size_t i = 0; i < n; ++i) {
      const size_t pos = count[(key[i] >> shift) & 0xffu]++;
      key_tmp[pos] = key[i];
      idx_tmp[pos] = idx[i];
    }
    key.swap(key_tmp);
    idx.swap(idx_tmp);
  }
}

// A CTA in the LPT heap: its load and index, ordered like Python's (load, cta) tuples.
struct HeapEntry {
  double load;
  int32_t id;
};
// Without branches (bitwise, not short-circuit): the sift's choice between two children is a
// coin flip the branch predictor loses half the time.
inline bool heap_less(const HeapEntry& a, const HeapEntry& b) {
  return (a.load < b.load) | ((a.load == b.load) & (a.id < b.id));
}

struct Scratch {
  std::vector<int64_t> cand_chunks[ATTNC_PLAN_MAX_SPLIT_FACTORS + 1];  // per candidate
  std::vector<int64_t> size, first, part_base, count;
  std::vector<int32_t> cta, best_cta;  // CTA of each item (num_ctas < 2^30)
  std::vector<double> load;
  std::vector<uint32_t> key, idx, key_tmp, idx_tmp, chunk_req;
  std::vector<HeapEntry> heap;
  std::vector<int64_t> range_c;  // the mask's row constants of one request (decode_step.h)
  // The step's kv_indptr and kv_last_page_len, copied once from the caller's arrays, which
  // the checks and the plan then read (decode_step.h: copy_tables).
  std::vector<int32_t> tables;
};

// Chunks of every request in heaviest-first order (oracle schedule's ``order``): fills
// s.size, s.first, s.part_base, s.chunk_req and s.idx (chunk ids, sorted).
inline void order_chunks(const AttncPlanParams& p, const int64_t* num_chunks, const Counts& c,
                         Scratch& s) {
  const int64_t* kv = planned_lens(p);
  const int64_t batch = p.batch;
  const int64_t nc = c.total_chunks;
  const bool split_any = c.split_any != 0;
  s.size.resize(batch);
  s.first.resize(batch);
  s.part_base.resize(batch);
  s.key.resize(nc);
  s.idx.resize(nc);
  s.chunk_req.resize(nc);
  int64_t pos = 0, part = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t n = num_chunks[r];
    int64_t size = kv[r];
    if (split_any) {
      int64_t n2;
      chunk_count(kv[r], c.chunk, p.kv_tile, &n2, &size);
    }
    s.size[r] = size;
    s.first[r] = pos;
    s.part_base[r] = part;
    if (n > 1) part += n;
    for (int64_t j = 0; j < n; ++j, ++pos) {
      const int64_t begin = j * size;
      const int64_t end = std::min(begin + size, kv[r]);
      // Descending length == ascending (kMaxLen - length); ties keep chunk order.
      s.key[pos] = static_cast<uint32_t>(kMaxLen - (end - begin));
      s.idx[pos] = static_cast<uint32_t>(pos);
      s.chunk_req[pos] = static_cast<uint32_t>(r);
    }
  }
  stable_sort_by_key(s.key, s.idx, s.key_tmp, s.idx_tmp);
}

// KV tokens of sorted chunk q.
inline int64_t chunk_length(const AttncPlanParams& p, const Scratch& s, int64_t q) {
  const uint32_t ch = s.idx[q];
  const int64_t r = s.chunk_req[ch];
  const int64_t j = static_cast<int64_t>(ch) - s.first[r];
  const int64_t begin = j * s.size[r];
  return std::min(begin + s.size[r], planned_lens(p)[r]) - begin;
}

// oracle assign_lpt over the items of the ordered chunks (each chunk expands to its KV
// heads x row blocks at the same cost) into s.cta; returns oracle _makespan.
// Stops early, returning +inf, once the busiest CTA plus the merge exceeds ``bound``: the
// candidate then cannot win (loads only grow).
inline double assign_lpt(const AttncPlanParams& p, const Counts& c, Scratch& s,
                         double bound = HUGE_VAL) {
  const double merge = c.chunk > 0 ? kMergeOverhead : 0.0;
  const int64_t units = p.num_kv_heads * p.row_blocks;
  const double item_q = p.alpha * static_cast<double>(p.q_len);
  const double base = item_q + kItemOverhead;
  s.cta.resize(c.num_items);
  // A min-heap of (load, cta) entries: the lowest load, then the lowest index, on top; each
  // item replaces the top and sifts it down (heapq.heapreplace). The order is total, so any
  // exact priority queue hands out the same CTAs as the oracle's binary heap; the entries
  // carry their loads so the sift compares without a lookup. s.load holds the loads until the heap is
  // made (the first m items go to CTAs 0..m-1).
  const int64_t m = p.num_ctas;
  s.load.assign(m, 0.0);
  s.heap.resize(m + 4);
  HeapEntry* h = s.heap.data();
  for (int64_t b = m; b < m + 4; ++b) h[b] = HeapEntry{HUGE_VAL, INT32_MAX};  // missing children
  double* load = s.load.data();
  bool heap_made = false;
  // Equal costs (every chunk as long as the first, which is the longest): the heap hands the
  // items out round robin, CTA 0 first.
  if (c.total_chunks > 0 &&
      chunk_length(p, s, 0) == chunk_length(p, s, c.total_chunks - 1)) {
    const double cost = base + p.beta * static_cast<double>(chunk_length(p, s, 0));
    for (int64_t i = 0, b = 0; i < c.num_items; ++i) {
      s.cta[i] = static_cast<int32_t>(b);
      load[b] = load[b] + cost;
      b = b + 1 == m ? 0 : b + 1;  // i % m
    }
    double mx = 0.0;
    for (int64_t b = 0; b < m; ++b) mx = std::max(mx, load[b]);
    return mx + (c.chunk > 0 ? kMergeOverhead : 0.0);
  }
  int64_t i = 0;
  for (int64_t q = 0; q < c.total_chunks; ++q) {
    const double cost = base + p.beta * static_cast<double>(chunk_length(p, s, q));
    for (int64_t u = 0; u < units; ++u, ++i) {
      if (i < m) {  // all loads start at 0: the first m items go to CTAs 0, 1, ... in order
        s.cta[i] = static_cast<int32_t>(i);
        load[i] = load[i] + cost;
        if (load[i] + merge > bound) return HUGE_VAL;
        if (i + 1 == m) {  // a sorted array is a valid heap
          for (int64_t b = 0; b < m; ++b) h[b] = HeapEntry{load[b], static_cast<int32_t>(b)};
          std::sort(h, h + m, heap_less);
          heap_made = true;
        }
        continue;
      }
      HeapEntry top = h[0];
      s.cta[i] = top.id;
      top.load = top.load + cost;
      if (top.load + merge > bound) return HUGE_VAL;
      int64_t k = 0;
      for (;;) {  // a 4-ary heap: half the levels of a binary one
        const int64_t first = 4 * k + 1;
        if (first >= m) break;
        // The least of the four children (sentinels past m), as a tournament.
        const int64_t a = first + heap_less(h[first + 1], h[first]);
        const int64_t b = first + 2 + heap_less(h[first + 3], h[first + 2]);
        const int64_t child = heap_less(h[b], h[a]) ? b : a;
        if (!heap_less(h[child], top)) break;
        h[k] = h[child];
        k = child;
      }
      h[k] = top;
    }
  }
  double mx = 0.0;
  for (int64_t b = 0; b < m; ++b) mx = std::max(mx, heap_made ? h[b].load : load[b]);
  return mx + (c.chunk > 0 ? kMergeOverhead : 0.0);
}

}  // namespace decode_plan
}  // namespace attnc
