// Owns: the producer warpgroup of the Hopper prefill: the CTA's work items (in ItemOrder,
// item_order.cuh); for each, the walk over its non-empty KV tiles
// (EMPTY tiles are never loaded) and the loads of their K and V into the pipeline stages.
// Tiles wholly inside the item's range load by TMA: one elected thread issues the boxes of a
// ragged tile; for a paged tile the lanes of warp 0 each read one page id and issue that
// page's boxes. Other tiles (the range's tail, unaligned or unevenly paged tiles) are gathered
// by all 128 threads with zero-filling cp.async that complete on the same mbarriers.
#pragma once

#include <stdint.h>

#include "../cp_async.cuh"
#include "../kv_gather.cuh"
#include "../page_check.cuh"
#include "../prefill_args.h"
#include "mbarrier.cuh"
#include "item_order.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_item.cuh"
#include "prefill_sm90_params.cuh"
#include "smem_desc.cuh"
#include "staged_keys.cuh"
#include "tma.cuh"
#include "warpgroup.cuh"

namespace attnc {
namespace sm90 {

// Whether the tile [kv0, kv0 + kKvTile) of an item loads through TMA (otherwise its StageInfo
// carries kCpAsync, and the consumers fence the proxies before reading it): the tile lies
// inside the range and a paged tile starts on a box boundary (page_rows is a power of two);
// or it is a ragged range's tail of a multiple of 16 keys with the exact token extent
// (ragged_tails): the box reads a whole tile, the rows past the tail are masked in S and
// skipped by P V (whole k-steps), so their values never reach O.
template <class V, class Shape>
__device__ __forceinline__ bool tile_uses_tma(const PrefillSm90Params<V>& p, int kv0,
                                              int range_end) {
  if (!p.use_tma) return false;
  const bool ragged = p.args.kv_layout == ATTNC_KV_RAGGED;
  if (kv0 + Shape::kKvTile > range_end) return ragged && p.ragged_tails && (range_end - kv0) % 16 == 0;
  return ragged || (kv0 & (p.page_rows - 1)) == 0;
}

// The page ids of one paged tile for the cp.async gather. Pages of at least 8 keys (a 128-key
// tile then spans at most 18 of them): each warp reads them once, lane l the id of page
// first + l, and reports a bad one there; `shared` is false otherwise (ragged, or small
// pages: every row reads its own id).
struct TilePages {
  int first;
  int lane_id;
  bool shared;
  bool bad;  // shared: some page of the tile has a bad id (the same in every lane)
};

__device__ __forceinline__ TilePages read_tile_pages(const AttncPrefillArgs& a, const KvRows& kv,
                                                     const FastDiv& page_div, int kv0, int kv_end,
                                                     int request) {
  TilePages t{0, 0, false, false};
  if (kv.page_ids == nullptr || kv.page_size < 8) return t;
  t.shared = true;
  t.first = page_div.div(kv0);
  const int lane = threadIdx.x % 32;
  bool bad = false;
  if (t.first + lane <= page_div.div(kv_end - 1)) {
    t.lane_id = kv.page_ids[t.first + lane];
    bad = page_id_bad(t.lane_id, a.num_pages);
    if (bad) report_bad_page(a.page_status, request, t.lane_id);
  }
  t.bad = __any_sync(0xffffffffu, bad);
  return t;
}

// K or V (`src`: a.k or a.v) of the tile at kv0 by cp.async into stage `dst`: thread tid
// copies 16-byte chunk tid % (D / 8) of rows tid / (D / 8) + i * kRowStep into the swizzled
// stage; rows at or past kv_end are zeroed. Paged rows find their page with one multiply-high
// (FastDiv) and their id by a shuffle (`pages.shared`) or a load. A page id outside
// [0, num_pages) is never read: its rows are zeroed, a per-row id is reported for `request`
// (page_check.cuh) when `report`, and true is returned.
template <class T, class Shape>
__device__ __forceinline__ bool gather_tile(const AttncPrefillArgs& a, const KvRows& kv,
                                            const FastDiv& page_div, const TilePages& pages,
                                            int kv0, int kv_end, uint32_t dst, const void* src,
                                            int request, bool report) {
  constexpr int CH = Shape::kHeadDim / 8;
  constexpr int kRowStep = 128 / CH;
  constexpr int kIters = Shape::kKvTile / kRowStep;
  const int tid = threadIdx.x;
  const int chunk = tid % CH;
  const int row0 = tid / CH;
  const int64_t tok_bytes = a.kv_stride_tok * static_cast<int64_t>(sizeof(T));
  const int64_t page_bytes = a.kv_stride_page * static_cast<int64_t>(sizeof(T));
  const char* base = reinterpret_cast<const char*>(src) +
                     (kv.base + chunk * 8) * static_cast<int64_t>(sizeof(T));
  bool bad = pages.bad;
#pragma unroll 4
  for (int i = 0; i < kIters; ++i) {
    const int r = row0 + i * kRowStep;
    const int idx = kv0 + r;
    bool ok = idx < kv_end;
    const int j = ok ? idx : kv0;
    int64_t off;
    if (kv.page_ids == nullptr) {
      off = j * tok_bytes;
    } else {
      const int page = page_div.div(j);
      const int id = pages.shared ? __shfl_sync(0xffffffffu, pages.lane_id, page - pages.first)
                                  : kv.page_ids[page];
      if (ok && page_id_bad(id, a.num_pages)) {
        if (report && !pages.shared) report_bad_page(a.page_status, request, id);
        ok = false;
        bad = true;
      }
      off = ok ? id * page_bytes + (j - page * kv.page_size) * tok_bytes : 0;
    }
    cp_async_16(dst + swizzled_offset(Shape::kKvTile, r, chunk), base + off, ok);
  }
  return bad;
}

// One thread's TMA issue of a K or V tile: arm barrier `full` with the tile's `bytes`, then
// (when `load`) the D / 64 boxes of 64 columns into `dst`.
template <int D, int KVT>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, uint32_t full,
                                         int kv_head, int token, uint32_t bytes, bool load) {
  mbar_arrive_expect_tx(full, bytes);
  if (load) {
#pragma unroll
    for (int b = 0; b < D / 64; ++b) tma_load_3d(dst + b * KVT * 128, map, 64 * b, kv_head, token, full);
  }
}

// One warp's share of a paged K or V tile: lane 0 of the tensor's first warp (0 or 2) arms
// `full`; lane l (`issues`) loads its page's boxes of the column blocks warp % 2, warp % 2 + 2,
// ... (a function of its own: inlined as two calls it keeps the producer within its registers,
// where one call site with the tensor chosen per warp spilled a register for prefix_lm).
template <class Shape>
__device__ __forceinline__ void paged_boxes(uint32_t dst, const CUtensorMap* map, uint32_t full,
                                            int kv_head, int page_rows, int id, int in_page,
                                            bool issues) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0 && (warp & 1) == 0) mbar_arrive_expect_tx(full, Shape::kTileBytes);
  if (issues) {
    dst += lane * page_rows * 128;
#pragma unroll
    for (int b = warp & 1; b < Shape::kHeadDim / 64; b += 2)
      tma_load_4d(dst + b * Shape::kKvTile * 128, map, 64 * b, kv_head, in_page, id, full);
  }
}

// A paged tile by TMA (tile_uses_tma), issued by all four producer warps: warps 0 and 1 load
// K, warps 2 and 3 load V; warp w takes the column blocks w % 2, w % 2 + 2, ... of D / 64, and
// its lane l < kKvTile / page_rows the l-th box of page_rows keys (page id read before the
// stage is waited for). Lane 0 of warps 0 and 2 arms the full barrier with the tile's bytes
// (a transaction count may run ahead of the arming). A bad id is reported by warp 0, loads
// zeros (a page past the map) and flags the stage.
template <class V, class Shape>
__device__ __forceinline__ void produce_paged_tma_stage(const PrefillSm90Params<V>& p,
                                                        const PrefillSm90Smem<Shape>& sm,
                                                        const PrefillSm90Item& it,
                                                        const FastDiv& page_div, StageInfo info,
                                                        int stage, int phase) {
  const AttncPrefillArgs& a = p.args;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const bool mine = lane < Shape::kKvTile / p.page_rows;
  int id = 0, in_page = 0;
  bool bad = false;
  if (mine) {
    const int tok = info.kv0 + lane * p.page_rows;
    const int page = page_div.div(tok);
    in_page = tok - page * it.kv.page_size;
    id = it.kv.page_ids[page];
    bad = page_id_bad(id, a.num_pages);
    if (bad) {
      if (warp == 0) report_bad_page(a.page_status, it.request, id);
      id = a.num_pages;  // outside the map: the box reads as zeros
    }
  }
  if (__any_sync(0xffffffffu, bad)) info.flags |= StageInfo::kBadPage;
  // Warps 0-1 issue K once its stage is free, warps 2-3 V once its stage is free. Only a warp
  // that fills the stage waits for it (see produce_stage): at head_dim 64 (one column block)
  // warps 1 and 3 fill nothing.
  const bool fills = (warp & 1) < Shape::kHeadDim / 64;
  if (warp < 2 && fills) {
    mbar_wait(sm.empty_k(stage), phase ^ 1);
    if (threadIdx.x == 0) info.store(sm.info(stage));
    paged_boxes<Shape>(sm.k(stage), &p.tmap_k, sm.full_k(stage), it.kv_head, p.page_rows, id,
                       in_page, mine);
  } else if (fills) {
    mbar_wait(sm.empty_v(stage), phase ^ 1);
    paged_boxes<Shape>(sm.v(stage), &p.tmap_v, sm.full_v(stage), it.kv_head, p.page_rows, id,
                       in_page, mine);
  }
  __syncwarp();
}

// One stage: K and V of the tile described by `info` (nothing for kNoTile) and its key values
// (Shape::kKeyBytes > 0), then the arrivals that publish it.
template <class V, class T, class Shape>
__device__ __forceinline__ void produce_stage(const PrefillSm90Params<V>& p,
                                              const PrefillSm90Smem<Shape>& sm,
                                              const PrefillSm90Item& it, const V& var,
                                              const FastDiv& page_div, StageInfo info, int stage,
                                              int phase) {
  constexpr int D = Shape::kHeadDim;
  constexpr int KVT = Shape::kKvTile;
  const AttncPrefillArgs& a = p.args;
  const int tid = threadIdx.x;  // 0..127
  const bool load = !(info.flags & StageInfo::kNoTile);
  if constexpr (Shape::kKeyBytes > 0) {
    // The key values: every producer thread waits for the stage to be free and writes its
    // keys' values; the barrier puts the writes ahead of the arrival that publishes the stage
    // (whichever path below makes it). No thread can lag a phase behind its wait here: the
    // stage is not filled (so not freed again) before every thread has passed the barrier.
    if (load && stage_holds_keys<V, Shape>(info)) {
      ProducerStageKeys<V, Shape> keys;
      keys.touch(var, info.kv0, info.kv1, tid);  // into L1 while the stage is still in use
      mbar_wait(sm.empty_k(stage), phase ^ 1);
      keys.load(var, info.kv0, info.kv1, tid);
      keys.store(sm.keys(stage), tid);
      named_sync(kProducerBarrier, 128);
    }
  }
  if (!(info.flags & StageInfo::kCpAsync) && load && a.kv_layout != ATTNC_KV_RAGGED) {
    produce_paged_tma_stage<V, Shape>(p, sm, it, page_div, info, stage, phase);
    return;
  }
  if (!(info.flags & StageInfo::kCpAsync)) {
    // TMA (or no data at all): thread 0 waits for the stage to be free and issues. Only the
    // threads that fill a stage wait for it: a parity wait tells apart phases one apart only,
    // and once the stage is issued the consumers may read and free it again, so a thread that
    // reached the same wait later (a lagging warp) would see the parity back where it started
    // and wait for a phase that only the next fill, held at the producer barrier by that very
    // thread, can bring: the kernel hangs (RESULTS.md run 38; 4 us of lag at an item start was
    // enough). The producer barrier after every stage keeps every thread within one stage of
    // thread 0, so the waits of a later cp.async stage (by all threads) are unambiguous.
    const uint32_t bytes = load ? Shape::kTileBytes : 0;
    const int token = a.kv_indptr[it.request] + info.kv0;
    if (tid == 0) {
      mbar_wait(sm.empty_k(stage), phase ^ 1);
      info.store(sm.info(stage));
      tma_tile<D, KVT>(sm.k(stage), &p.tmap_k, sm.full_k(stage), it.kv_head, token, bytes, load);
      mbar_wait(sm.empty_v(stage), phase ^ 1);
      tma_tile<D, KVT>(sm.v(stage), &p.tmap_v, sm.full_v(stage), it.kv_head, token, bytes, load);
    }
    __syncwarp();
    return;
  }
  const TilePages pages = read_tile_pages(a, it.kv, page_div, info.kv0, it.range.end, it.request);
  mbar_wait(sm.empty_k(stage), phase ^ 1);
  mbar_wait(sm.empty_v(stage), phase ^ 1);
  const bool bad = gather_tile<T, Shape>(a, it.kv, page_div, pages, info.kv0, it.range.end,
                                         sm.k(stage), a.k, it.request, true);
  gather_tile<T, Shape>(a, it.kv, page_div, pages, info.kv0, it.range.end, sm.v(stage), a.v,
                        it.request, false);
  mbar_arrive_cp_async(sm.full_k(stage));
  mbar_arrive_cp_async(sm.full_v(stage));
  // Every thread's pending-count increment precedes the one real arrival.
  __syncwarp();
  if (named_sync_or(kProducerBarrier, 128, bad)) info.flags |= StageInfo::kBadPage;
  if (tid == 0) {
    info.store(sm.info(stage));
    mbar_arrive(sm.full_k(stage));
    mbar_arrive(sm.full_v(stage));
  }
}

// The tensors the score and mask read at the stage's keys alone (V::touch_key_reads: a bias
// or document id per key), where the shape does not stage them (staged_keys.cuh): prefetched
// into L1 by producer warps 1-3 once the stage is issued, so that the consumers' reads of them
// after the stage's S hit the SM's L1 instead of waiting on L2 (the reads sit between the S
// wait and the softmax).
template <class V, class Shape>
__device__ __forceinline__ void touch_key_reads(const V& var, const StageInfo& info) {
  if constexpr (variant_touches_key_reads<V>::value && Shape::kKeyBytes == 0) {
    if (threadIdx.x < 32 || (info.flags & StageInfo::kNoTile)) return;
    for (int kv = info.kv0 + static_cast<int>(threadIdx.x) - 32; kv < info.kv1; kv += 96)
      var.touch_key_reads(kv);
  }
}

// Every item of this CTA publishes at least one stage: its non-empty tiles in walk order
// (kv_walk_reversed, tile_map_view.cuh; the last flagged), or a single kNoTile stage (an item without query rows too: the consumers
// then read only the item it names). Its last stage names the item that follows.
template <class V, class T, class Shape>
__device__ __forceinline__ void prefill_sm90_produce(const PrefillSm90Params<V>& p,
                                                     const PrefillSm90Smem<Shape>& sm) {
  constexpr int KVT = Shape::kKvTile;
  const AttncPrefillArgs& a = p.args;
  const FastDiv page_div = FastDiv::make(a.kv_layout == ATTNC_KV_RAGGED ? 1 : a.page_size);
  const int group = a.num_qo_heads / a.num_kv_heads;
  int stage = 0;
  int phase = 0;
  using Order = ItemOrder<Shape, variant_mask_reads_tokens<V>::value>;
  constexpr bool kReverse = kv_walk_reversed<V>;
  Order order(a);
  for (int w = static_cast<int>(blockIdx.x); w < a.num_work;) {
    const int next = order.pick();
    PrefillSm90Item it = PrefillSm90Item::load(a, w, group);
    const V var(p.params, it.request_info(a));
    it.set_range<V, KVT>(var, a);  // an item without query rows has no tile
#ifdef ATTNC_SM90_PRODUCER_LAG_NS
    // Fault injection for tests/gpu/test_sm90_producer_lag.py: producer warps 1-3 start
    // every item late, as a descheduled or slower warp would.
    if (threadIdx.x >= 32) __nanosleep(ATTNC_SM90_PRODUCER_LAG_NS);
#endif
    TileClass cls;
    int t = it.walk_tile<V, KVT, kReverse>(var, kReverse ? it.num_tiles - 1 : 0, cls);
    const bool none = it.walk_done<kReverse>(t);
    do {
      StageInfo info{0, 0, static_cast<int>(TileClass::kEmpty),
                     StageInfo::kLast | StageInfo::kNoTile, 0};
      TileClass next_cls = TileClass::kEmpty;
      const int following =
          none ? t : it.walk_tile<V, KVT, kReverse>(var, kReverse ? t - 1 : t + 1, next_cls);
      if (!none) {
        info.kv0 = it.tile_begin(t, KVT);
        info.kv1 = min(info.kv0 + KVT, it.range.end);
        info.cls = static_cast<int>(cls);
        info.flags = it.walk_done<kReverse>(following) ? StageInfo::kLast : 0;
        if (!tile_uses_tma<V, Shape>(p, info.kv0, it.range.end))
          info.flags |= StageInfo::kCpAsync;
      }
      if ((info.flags & StageInfo::kLast) && threadIdx.x == 0) {  // the first use of `next`
        info.next = Order::index(next);
        order.hand_over(sm, info.next);
      }
      produce_stage<V, T, Shape>(p, sm, it, var, page_div, info, stage, phase);
      touch_key_reads<V, Shape>(var, info);
      // The four producer warps stay within one stage of each other. The empty barriers are
      // waited for by phase parity, which tells apart phases one apart only, and a TMA stage
      // is filled by thread 0 (ragged) or by the K and V warps (paged) while nothing else
      // joins the warps (a cp.async stage does): without this barrier a warp could reach a
      // cp.async stage a whole pipeline round ahead and pass its wait on an old phase.
      named_sync(kProducerBarrier, 128);
      if (++stage == Shape::kStages) {
        stage = 0;
        phase ^= 1;
      }
      t = following;
      cls = next_cls;
    } while (!it.walk_done<kReverse>(t));
    w = order.handed(sm);
  }
  order.finish();
  cp_async_wait<0>();
}

}  // namespace sm90
}  // namespace attnc
