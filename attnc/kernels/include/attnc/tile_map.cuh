// Owns: the tile map of a variant whose mask reads per-token tensors (V::kMaskReadsTokens):
// the exact class (EMPTY / FULL / PARTIAL) of every (query tile, KV block) pair of a batch,
// computed from the tensor values: the closed forms first, then the generated V::mask_bounds
// (the mask over the whole box in intervals, attnc/mask_bounds.cuh), and for the boxes neither
// decides, V::row / V::mask on every (query, key, head) of the pair; the classifier kernel
// and its CPU build. The launch and the functions a prefill module exports around it are
// tile_map_builder.cuh's; the argument structs, tile_map_args.h's.
//
// Map layout (the one prefill_args.h describes): request b's map starts at
// tile_map[tile_map_start[b]] and is row-major [ceil(q_len_b / tile_q_tokens)]
// [ceil(kv_len_b / kv_block)] of uint8 TileClass. A map entry is EMPTY only when no pair of
// the box is visible and FULL only when every pair is (any/all over all pairs: exact).
//
// The per-box functions are __host__ __device__: a CPU build runs the same scan
// (`build_tile_map_host`) that the kernel runs, so tests check it against brute force.
#pragma once

#include <stdint.h>

#include <utility>
#include <type_traits>

#include "mask_bounds.cuh"
#include "tile_map_args.h"
#include "variant_contract.cuh"

namespace attnc {

// One (query tile, KV block) pair of one request: queries [q0, q1) x keys [k0, k1) over
// query heads [0, heads).
struct TileBox {
  int q0, q1, k0, k1, heads;
  ATTNC_HD long long pairs() const {
    return static_cast<long long>(heads) * (q1 - q0) * (k1 - k0);
  }
};

// The request of map entry `entry` (largest b with start[b] <= entry) and its box.
struct TileMapEntry {
  int request;
  TileBox box;
};

ATTNC_HD int tile_map_min(int x, int y) { return x < y ? x : y; }

ATTNC_HD RequestInfo tile_map_request_info(const AttncTileMapArgs& a, int b) {
  RequestInfo r;
  r.batch = b;
  r.q_len = a.qo_indptr[b + 1] - a.qo_indptr[b];
  r.kv_len = a.kv_token_start[b + 1] - a.kv_token_start[b];
  r.num_qo_heads = a.num_qo_heads;
  r.num_kv_heads = a.num_kv_heads;
  r.head_dim = a.head_dim;
  r.sm_scale = a.sm_scale;
  r.q_start = a.qo_indptr[b];
  r.kv_start = a.kv_token_start[b];
  return r;
}

ATTNC_HD TileMapEntry locate_map_entry(const AttncTileMapArgs& a, int entry) {
  int lo = 0, hi = a.batch_size - 1;  // requests with no entries share their start
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.tile_map_start[mid] <= entry) lo = mid; else hi = mid - 1;
  }
  const int b = lo;
  const int q_len = a.qo_indptr[b + 1] - a.qo_indptr[b];
  const int kv_len = a.kv_token_start[b + 1] - a.kv_token_start[b];
  const int cols = (kv_len + a.kv_block - 1) / a.kv_block;
  const int local = entry - a.tile_map_start[b];
  const int qt = local / cols, col = local - qt * cols;
  TileMapEntry e;
  e.request = b;
  e.box.q0 = qt * a.tile_q_tokens;
  e.box.q1 = tile_map_min(e.box.q0 + a.tile_q_tokens, q_len);
  e.box.k0 = col * a.kv_block;
  e.box.k1 = tile_map_min(e.box.k0 + a.kv_block, kv_len);
  e.box.heads = a.mask_heads;
  return e;
}

// What the closed forms already decide: kEmpty when the box lies outside kv_range or
// V::classify says so, kFull when V::classify says so (or there is no mask); kPartial: the
// pairs must be scanned.
template <class V>
ATTNC_HD TileClass classify_box_closed_form(const V& v, const TileBox& box) {
  if (box.q0 >= box.q1 || box.k0 >= box.k1) return TileClass::kEmpty;
  if (!V::kHasMask) return TileClass::kFull;
  const KvRange range = v.kv_range(box.q0, box.q1);
  if (range.begin >= range.end || box.k1 <= range.begin || box.k0 >= range.end)
    return TileClass::kEmpty;
  return v.classify(box.q0, box.q1, box.k0, box.k1);
}

// Whether V has the generated `mask_bounds` (a hand-written functor may not).
template <class V, class = void>
struct variant_has_mask_bounds : std::false_type {};
template <class V>
struct variant_has_mask_bounds<
    V, std::void_t<decltype(std::declval<const V&>().mask_bounds(0, 0, 0, 0, 1, SerialLanes{}))>>
    : std::true_type {};

// The closed forms, then V::mask_bounds for a box they leave PARTIAL (its tensor reads split
// over `lanes`, which must all call it); kPartial: the pairs must be scanned.
template <class V, class Lanes>
ATTNC_HD TileClass classify_box_bounds(const V& v, const TileBox& box, const Lanes& lanes) {
  const TileClass closed = classify_box_closed_form(v, box);
  if constexpr (variant_has_mask_bounds<V>::value) {
    if (closed == TileClass::kPartial)
      return v.mask_bounds(box.q0, box.q1, box.k0, box.k1, box.heads, lanes);
  }
  (void)lanes;
  return closed;
}

// Scan pairs first, first + stride, ... (< last) of the box in (head, query, key) order, keys
// fastest: `any` becomes true on a visible pair, `all` false on a hidden one. The pair index is
// split into (head, query, key) once; the loop steps the three with adds and compares (no
// division per pair), and calls V::row only when the (head, query) row changes (with stride
// 1, once per row of the run).
template <class V>
ATTNC_HD void scan_box_pairs(const V& v, const TileBox& box, long long first, long long last,
                             long long stride, bool& any, bool& all) {
  if (first >= last) return;
  const long long width = box.k1 - box.k0;
  const long long rows = box.q1 - box.q0;
  const long long row_index = first / width;
  long long col = first - row_index * width;
  long long head = row_index / rows;
  long long q = row_index - head * rows;
  const long long row_step = stride / width;
  const long long col_step = stride - row_step * width;
  typename V::Row row = v.row(box.q0 + static_cast<int>(q), static_cast<int>(head));
  for (long long i = first; i < last; i += stride) {
    const bool visible = v.mask(row, box.k0 + static_cast<int>(col));
    any = any || visible;
    all = all && visible;
    col += col_step;
    bool moved = row_step != 0;
    q += row_step;
    if (col >= width) {
      col -= width;
      ++q;
      moved = true;
    }
    while (q >= rows) {
      q -= rows;
      ++head;
    }
    if (moved && i + stride < last)
      row = v.row(box.q0 + static_cast<int>(q), static_cast<int>(head));
  }
}

ATTNC_HD TileClass class_of(bool any, bool all) {
  return !any ? TileClass::kEmpty : (all ? TileClass::kFull : TileClass::kPartial);
}

// The exact class of one box, on one thread (the CPU reference and tests).
template <class V>
ATTNC_HD TileClass classify_box_exact(const V& v, const TileBox& box) {
  const TileClass closed = classify_box_bounds(v, box, SerialLanes{});
  if (closed != TileClass::kPartial) return closed;
  bool any = false, all = true;
  scan_box_pairs(v, box, 0, box.pairs(), 1, any, all);
  return class_of(any, all);
}

// The whole map on the CPU (same boxes, same scan as the kernel).
template <class V>
inline void build_tile_map_host(const AttncTileMapArgs& a, const typename V::Params& params) {
  for (int e = 0; e < a.num_entries; ++e) {
    const TileMapEntry t = locate_map_entry(a, e);
    const V v(params, tile_map_request_info(a, t.request));
    a.tile_map[e] = static_cast<uint8_t>(classify_box_exact(v, t.box));
  }
}

#ifdef __CUDACC__
constexpr int kTileMapThreads = 128;
constexpr int kTileMapWarps = kTileMapThreads / 32;  // map entries a CTA classifies at once
constexpr int kTileMapPairsPerLane = 8;  // consecutive pairs per lane between warp votes
constexpr int kTileMapMaxBlocks = 1 << 16;

// One warp per map entry (grid-stride over entries): the closed forms and the mask's bounds
// first (the bounds' tensor reads split over the lanes), then rounds in
// which lane l scans the kTileMapPairsPerLane consecutive pairs from base + l * that (a run
// along one or two rows: V::row once or twice, the keys' loads side by side), with a warp vote
// after each, stopping as soon as the box is known to be PARTIAL. Warps do not wait for each
// other: an entry's latency chain (locating it, the request, the rows, the keys) overlaps
// the other warps' (one CTA per entry left the SMs waiting on those chains).
template <class V>
__global__ void __launch_bounds__(kTileMapThreads)
    tile_map_kernel(const AttncTileMapArgs a, const typename V::Params params) {
  const int lane = threadIdx.x % 32;
  const int first = blockIdx.x * kTileMapWarps + threadIdx.x / 32;
  for (int e = first; e < a.num_entries; e += gridDim.x * kTileMapWarps) {
    const TileMapEntry t = locate_map_entry(a, e);
    const V v(params, tile_map_request_info(a, t.request));
    TileClass c = classify_box_bounds(v, t.box, WarpLanes{lane});
    if (c == TileClass::kPartial) {
      const long long n = t.box.pairs();
      constexpr long long kRound = 32LL * kTileMapPairsPerLane;
      bool any = false, all = true;
      for (long long base = 0; base < n; base += kRound) {
        const long long mine = base + lane * static_cast<long long>(kTileMapPairsPerLane);
        const long long end = mine + kTileMapPairsPerLane;
        scan_box_pairs(v, t.box, mine, end < n ? end : n, 1, any, all);
        any = __any_sync(0xffffffffu, any) != 0;
        all = __all_sync(0xffffffffu, all) != 0;
        if (any && !all) break;  // uniform: every lane saw the same votes
      }
      c = class_of(any, all);
    }
    if (lane == 0) a.tile_map[e] = static_cast<uint8_t>(c);
  }
}
#endif  // __CUDACC__

}  // namespace attnc
