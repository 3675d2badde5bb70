// Owns: the prefill work list from the tiles' KV ranges (prefill_plan_ranges.h): the chunk
// size (a CTA's fair share of the KV work, doubled until the partial states fit), each
// tile's chunks, the heaviest-first stable order and the costs it sorts by. Bit-identical to
// the numpy oracle (tests/codegen/prefill_schedule_oracle.py) when costs are sums of integers
// below 2^53 (the runtime's alpha = beta = 1); built with -ffp-contract=off.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <cmath>

#include "prefill_plan_ranges.h"

namespace attnc {
namespace prefill_plan {

// A CTA's fair share of the KV work, tile-aligned and at least min_chunk (_chunk_size).
inline int64_t fair_chunk(const AttncPrefillParams& p, const Scratch& s) {
  double sum = 0.0;
  for (size_t t = 0; t < s.req.size(); ++t) {
    const double tokens = static_cast<double>(s.q1[t] - s.q0[t]);
    sum += p.alpha * tokens + p.beta * static_cast<double>(s.loaded[t]);
  }
  const double total = static_cast<double>(p.num_kv_heads) * sum;
  const double per_cta = total / static_cast<double>(std::max<int64_t>(p.num_ctas, 1));
  const int64_t chunk = std::max(p.min_chunk, static_cast<int64_t>(per_cta / p.beta));
  return ceil_nonneg(chunk, p.kv_align) * p.kv_align;
}

// Chunks and (aligned) chunk size of every tile for ``chunk`` (_chunking); the partial rows
// the split tiles need, and whether any tile is split.
inline int64_t chunk_tiles(const AttncPrefillParams& p, Scratch& s, int64_t chunk, bool* any) {
  const Divisor by_chunk(chunk), by_align(p.kv_align);
  int64_t part_rows = 0;
  *any = false;
  for (size_t t = 0; t < s.req.size(); ++t) {
    const int64_t length = s.kv_e[t] - s.kv_b[t];
    const int64_t n = std::min(std::max<int64_t>(by_chunk.ceil(s.loaded[t]), 1), p.max_chunks);
    int64_t size = n == 1 ? length : ceil_nonneg(length, n);
    size = std::max(p.kv_align, by_align.ceil(size) * p.kv_align);
    s.size[t] = size;
    s.count[t] = std::max<int64_t>(1, ceil_nonneg(length, size));
    if (s.count[t] > 1) {
      *any = true;
      part_rows += s.count[t] * (s.q1[t] - s.q0[t]) * p.num_qo_heads;
    }
  }
  return part_rows;
}

// The chunk size and every tile's chunks (schedule_prefill's loop): the fair share, doubled
// while the partial states exceed max_part_rows. Returns the partial rows used.
inline int64_t choose_chunks(const AttncPrefillParams& p, Scratch& s, int64_t max_part_rows,
                             int64_t* chunk_out) {
  const size_t tiles = s.req.size();
  s.count.resize(tiles), s.size.resize(tiles), s.part_base.resize(tiles);
  int64_t chunk = fair_chunk(p, s);
  bool any = false;
  int64_t part_rows = chunk_tiles(p, s, chunk, &any);
  while (any && part_rows > max_part_rows) {
    chunk *= 2;
    part_rows = chunk_tiles(p, s, chunk, &any);
  }
  *chunk_out = any ? chunk : 0;
  return part_rows;
}

// order[0, n): chunk indices heaviest first, ties in chunk order (numpy's stable argsort of
// -cost). Costs already in that order, or strictly rising (causal tiles), need no sort;
// whole costs below 2^39 (the runtime's alpha = beta = 1) sort as packed integer keys.
inline void heaviest_first(const double* cost, int64_t n, int64_t* order,
                           std::vector<uint64_t>& keys) {
  bool falling = true, rising = true, whole = n < (INT64_C(1) << 24);
  for (int64_t i = 1; i < n && (falling || rising); ++i) {
    falling = falling && cost[i] <= cost[i - 1];
    rising = rising && cost[i] > cost[i - 1];
  }
  for (int64_t i = 0; i < n; ++i) order[i] = rising && !falling ? n - 1 - i : i;
  if (falling || rising) return;
  constexpr double kTop = static_cast<double>(INT64_C(1) << 39);
  for (int64_t i = 0; i < n && whole; ++i)
    whole = cost[i] >= 0.0 && cost[i] < kTop && cost[i] == std::floor(cost[i]);
  if (!whole) {
    std::sort(order, order + n, [cost](int64_t a, int64_t b) {
      return cost[a] > cost[b] || (cost[a] == cost[b] && a < b);
    });
    return;
  }
  keys.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t heavier = (INT64_C(1) << 39) - 1 - static_cast<uint64_t>(cost[i]);
    keys[i] = (heavier << 24) | static_cast<uint64_t>(i);
  }
  std::sort(keys.begin(), keys.end());
  for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int64_t>(keys[i] & 0xFFFFFF);
}

// Every chunk (tile order, then chunk order) with its partial row base and cost, and the
// heaviest-first stable order. Returns the number of chunks.
inline int64_t order_chunks(const AttncPrefillParams& p, Scratch& s) {
  const int64_t tiles = static_cast<int64_t>(s.req.size());
  int64_t n = 0, base = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    s.part_base[t] = base;
    if (s.count[t] > 1) base += s.count[t] * (s.q1[t] - s.q0[t]) * p.num_qo_heads;
    n += s.count[t];
  }
  s.chunk_tile.resize(n), s.chunk_begin.resize(n), s.chunk_end.resize(n);
  s.chunk_part.resize(n), s.chunk_cost.resize(n), s.order.resize(n);
  int64_t i = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t rows = (s.q1[t] - s.q0[t]) * p.num_qo_heads;
    const double tokens = static_cast<double>(s.q1[t] - s.q0[t]);
    for (int64_t c = 0; c < s.count[t]; ++c, ++i) {
      const int64_t begin = s.kv_b[t] + c * s.size[t];
      const int64_t end = std::min(begin + s.size[t], s.kv_e[t]);
      int64_t loads = end - begin;
      if (p.tile_map != nullptr) {  // one chunk covers the tile's range: its loaded KV
        loads = s.count[t] == 1 ? s.loaded[t] : visible_tokens(p, s, t, begin, end);
      }
      s.chunk_tile[i] = t, s.chunk_begin[i] = begin, s.chunk_end[i] = end;
      s.chunk_part[i] = s.count[t] > 1 ? s.part_base[t] + c * rows : -1;
      s.chunk_cost[i] = p.alpha * tokens + p.beta * static_cast<double>(loads);
    }
  }
  heaviest_first(s.chunk_cost.data(), n, s.order.data(), s.keys);
  return n;
}

}  // namespace prefill_plan
}  // namespace attnc
