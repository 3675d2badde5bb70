// Owns: the KV range of every query tile of a prefill plan: the tiles themselves (requests in
// order), the mask's closed-form range per tile (evaluated by mask_range_rows.h, as the decode
// step does per request), the tile map's narrowing to non-empty blocks and the KV a chunk
// loads (the map's layout: planning/tile_map.py).
#pragma once
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "mask_range_rows.h"
#include "prefill_plan_abi.h"
#include "prefill_plan_walk.h"

namespace attnc {
namespace prefill_plan {

// a / b for a >= 0 and b > 0 (a 32-bit division when both fit: the planner divides a few
// times per tile, and 64-bit division is several times slower).
inline int64_t div_nonneg(int64_t a, int64_t b) {
  if (((static_cast<uint64_t>(a) | static_cast<uint64_t>(b)) >> 32) == 0) {
    return static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b));
  }
  return a / b;
}
inline int64_t ceil_nonneg(int64_t a, int64_t b) { return a == 0 ? 0 : div_nonneg(a - 1, b) + 1; }

inline uint64_t load_word(const uint8_t* p) {
  uint64_t x;
  memcpy(&x, p, 8);
  return x;
}

// Division of non-negative values by a fixed positive divisor: a shift for a power of two
// (tile sizes, the map's KV block, the chunk alignment), else div_nonneg.
struct Divisor {
  int64_t d;
  int shift;
  explicit Divisor(int64_t divisor) : d(divisor), shift(-1) {
    if (divisor > 0 && (divisor & (divisor - 1)) == 0) shift = __builtin_ctzll(divisor);
  }
  int64_t div(int64_t a) const { return shift >= 0 ? a >> shift : div_nonneg(a, d); }
  int64_t ceil(int64_t a) const { return a == 0 ? 0 : div(a - 1) + 1; }
};

// Non-zero bytes of p[0, n) (a map's non-EMPTY entries), eight at a time.
inline int64_t count_nonzero(const uint8_t* p, int64_t n) {
  constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7FULL, kOnes = 0x0101010101010101ULL;
  int64_t count = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t x = load_word(p + i);
    const uint64_t hit = ((((x & kLow7) + kLow7) | x) >> 7) & kOnes;  // 1 per non-zero byte
    count += static_cast<int64_t>((hit * kOnes) >> 56);
  }
  for (; i < n; ++i) count += p[i] != 0;
  return count;
}

// The first and one-past-last non-zero byte of p[0, n); (0, 0) when there is none.
inline void nonzero_span(const uint8_t* p, int64_t n, int64_t* first, int64_t* end) {
  int64_t lo = 0;
  while (lo + 32 <= n &&
         (load_word(p + lo) | load_word(p + lo + 8) | load_word(p + lo + 16) |
          load_word(p + lo + 24)) == 0) {
    lo += 32;
  }
  while (lo + 8 <= n && load_word(p + lo) == 0) lo += 8;
  while (lo < n && p[lo] == 0) ++lo;
  if (lo == n) {
    *first = *end = 0;
    return;
  }
  int64_t hi = n;  // p[lo] != 0 stops every scan below
  while (hi - 32 > lo &&
         (load_word(p + hi - 32) | load_word(p + hi - 24) | load_word(p + hi - 16) |
          load_word(p + hi - 8)) == 0) {
    hi -= 32;
  }
  while (hi - 8 > lo && load_word(p + hi - 8) == 0) hi -= 8;
  while (p[hi - 1] == 0) --hi;
  *first = lo, *end = hi;
}

// Per-plan arrays, kept between calls (the planner allocates only when a batch grows).
struct Scratch {
  std::vector<int64_t> req, j, q0, q1, kv_b, kv_e, loaded;  // per tile
  std::vector<int64_t> map_start, first, last;  // tile map
  std::vector<int64_t> c, begin;  // range constants per row, prefix sums per request
  std::vector<int64_t> count, size, part_base, split;  // chunking, per tile
  std::vector<int64_t> chunk_tile, chunk_begin, chunk_end, chunk_part, order;
  std::vector<double> chunk_cost;
  std::vector<uint64_t> keys;  // sort keys of the order
  WalkScratch walk;            // the items' places for the alternating walk
};

// How many query tiles the batch has.
inline int64_t count_query_tiles(const AttncPrefillParams& p) {
  const Divisor by_tile(p.tile_q_tokens);
  int64_t n = 0;
  for (int64_t r = 0; r < p.batch; ++r) n += by_tile.ceil(p.q_lens[r]);
  return n;
}

// The n (count_query_tiles) query tiles of every request, in request order: request, index,
// first and past-last query token (tests/mask_ranges_oracle.py query_tiles).
inline void query_tiles(const AttncPrefillParams& p, Scratch& s, int64_t n) {
  const int64_t tile = p.tile_q_tokens;
  const Divisor by_tile(tile);
  s.req.resize(n), s.j.resize(n), s.q0.resize(n), s.q1.resize(n);
  int64_t t = 0;
  for (int64_t r = 0; r < p.batch; ++r) {
    const int64_t tiles = by_tile.ceil(p.q_lens[r]);
    for (int64_t j = 0; j < tiles; ++j, ++t) {
      s.req[t] = r, s.j[t] = j, s.q0[t] = j * tile;
      s.q1[t] = std::min(j * tile + tile, p.q_lens[r]);
    }
  }
}

// kv_b/kv_e of every tile from the mask's range rows (mask_range_rows.h kv_range), the row
// constants and the wrap guards evaluated once per request.
inline void closed_form_ranges(const AttncPrefillParams& p, Scratch& s) {
  const AttncRangeRows& m = p.ranges;
  const int64_t tiles = static_cast<int64_t>(s.req.size());
  s.c.resize(static_cast<size_t>(std::max<int64_t>(m.num_rows, 1)));
  int64_t cached_req = -1;
  bool wraps = false;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r = s.req[t], kv = p.kv_lens[r];
    if (r != cached_req) {
      mask_ranges::row_constants(m, r, p.q_lens[r], kv, s.c.data());
      wraps = mask_ranges::may_wrap(m, s.c.data(), p.q_lens[r], kv);
      cached_req = r;
    }
    mask_ranges::kv_range(m, s.c.data(), wraps, s.q0[t], s.q1[t], kv, &s.kv_b[t], &s.kv_e[t]);
  }
}

// Where a tile map summary is written, per query tile: its row's start in the map and its
// first and one-past-last non-empty column (both 0 when none).
struct MapRows {
  int64_t* start;
  int64_t* first;
  int64_t* end;
};

// The map rows of the batch's query tiles, requests in order (tests/tile_map_oracle.py
// summarize): *tiles and *entries (the map bytes they take); with ``rows`` each tile's row
// written there (room for *tiles). False when the map (tile_map_len bytes) is shorter than
// the batch needs, checked before a row is added, so no sum passes it (rows may be partly
// written). Lengths from 0 to page_table::kMaxRequestTokens (the caller checks them).
inline bool map_rows(const AttncPrefillParams& p, int64_t* tiles, int64_t* entries,
                     const MapRows* rows) {
  const Divisor by_tile(p.tile_q_tokens), by_block(p.kv_block);
  int64_t start = 0, t = 0;
  for (int64_t r = 0; r < p.batch; ++r) {
    const int64_t n = by_tile.ceil(p.q_lens[r]), cols = by_block.ceil(p.kv_lens[r]);
    if (cols > 0 && n > (p.tile_map_len - start) / cols) return false;  // n * cols < 2^62
    if (rows != nullptr) {
      for (int64_t j = 0; j < n; ++j, start += cols) {
        rows->start[t + j] = start;
        nonzero_span(p.tile_map + start, cols, &rows->first[t + j], &rows->end[t + j]);
      }
    } else {
      start += n * cols;
    }
    if (__builtin_add_overflow(t, n, &t)) return false;
  }
  *tiles = t, *entries = start;
  return true;
}

// The map's per-tile summary of the plan's tiles (map_rows into the scratch): false when the
// map is shorter than the batch needs.
inline bool summarize_map(const AttncPrefillParams& p, Scratch& s) {
  const size_t tiles = s.req.size();
  s.map_start.resize(tiles + 1), s.first.resize(tiles), s.last.resize(tiles);
  const MapRows rows{s.map_start.data(), s.first.data(), s.last.data()};
  int64_t counted = 0;
  return map_rows(p, &counted, &s.map_start[tiles], &rows);
}

// KV tokens of non-empty map blocks overlapping [begin, end) of tile t (whole blocks;
// 0 <= begin <= end <= the request's KV length).
inline int64_t visible_tokens(const AttncPrefillParams& p, const Scratch& s, int64_t t,
                              int64_t begin, int64_t end) {
  const Divisor by_block(p.kv_block);
  const int64_t c0 = by_block.div(begin);
  const int64_t c1 = std::max(by_block.ceil(end), c0);
  return count_nonzero(p.tile_map + s.map_start[t] + c0, c1 - c0) * p.kv_block;
}

// Every tile's KV range [kv_b, kv_e) clipped to its request, and the KV it loads
// (prefill_schedule_oracle.schedule_prefill with prefill_schedule_oracle.ranges_with_map).
inline bool tile_ranges(const AttncPrefillParams& p, Scratch& s) {
  const int64_t tiles = static_cast<int64_t>(s.req.size());
  s.kv_b.resize(tiles), s.kv_e.resize(tiles), s.loaded.resize(tiles);
  if (p.ranges.rows != nullptr) {
    closed_form_ranges(p, s);
  } else {
    for (int64_t t = 0; t < tiles; ++t) s.kv_b[t] = 0, s.kv_e[t] = p.kv_lens[s.req[t]];
  }
  if (p.tile_map != nullptr && !summarize_map(p, s)) return false;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t kv = p.kv_lens[s.req[t]];
    int64_t b = s.kv_b[t], e = s.kv_e[t];
    if (p.tile_map != nullptr) {
      int64_t mb = std::min(s.first[t] * p.kv_block, kv), me = std::min(s.last[t] * p.kv_block, kv);
      if (p.ranges.rows != nullptr) mb = std::max(mb, b), me = std::min(me, e);
      b = mb < me ? mb : 0, e = mb < me ? me : 0;
    }
    b = std::min(std::max<int64_t>(b, 0), kv);
    e = std::min(std::max(e, b), kv);
    s.kv_b[t] = b, s.kv_e[t] = e;
    s.loaded[t] = p.tile_map != nullptr ? visible_tokens(p, s, t, b, e) : e - b;
  }
  return true;
}

}  // namespace prefill_plan
}  // namespace attnc
