// Owns: the producer warpgroup of the Hopper prefill: for every work item of this CTA (the
// persistent grid's items b, b + gridDim.x, ...), the walk over the item's non-empty KV tiles
// (EMPTY tiles are never loaded) and the loads of their K and V into the pipeline stages:
// one elected thread issues TMA boxes for tiles wholly inside a ragged request; other tiles
// (paged KV, the ragged tail) are gathered by all 128 threads with zero-filling cp.async that
// complete on the same mbarriers.
#pragma once

#include <stdint.h>

#include "../cp_async.cuh"
#include "../kv_gather.cuh"
#include "../prefill_args.h"
#include "mbarrier.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_item.cuh"
#include "prefill_sm90_params.cuh"
#include "smem_desc.cuh"
#include "tma.cuh"
#include "warpgroup.cuh"

namespace attnc {
namespace sm90 {

// Whether the tile [kv0, kv0 + kKvTile) of an item loads through TMA (the consumers ask the
// same question to know whether a proxy fence is needed).
template <class Shape>
__device__ __forceinline__ bool tile_uses_tma(int use_tma, const AttncPrefillArgs& a, int kv0,
                                              int range_end) {
  return use_tma && a.kv_layout == ATTNC_KV_RAGGED && kv0 + Shape::kKvTile <= range_end;
}

// K and V of one tile by cp.async: thread tid copies 16-byte chunk tid % (D / 8) of rows
// tid / (D / 8) + i * kRowStep into the swizzled stage; rows at or past range_end are zeroed.
template <class T, class Shape, class Cursor>
__device__ __forceinline__ void gather_kv_tile(const AttncPrefillArgs& a, const Cursor& cursor,
                                               int kv0, int range_end, uint32_t dk, uint32_t dv,
                                               int row0, int chunk) {
  constexpr int kRowStep = 128 / (Shape::kHeadDim / 8);
  const int64_t v_minus_k = Cursor::template v_minus_k<T>(a);
  auto copy = [&](int it, const char* src, bool ok) {
    const uint32_t off = swizzled_offset(Shape::kKvTile, row0 + it * kRowStep, chunk);
    cp_async_16(dk + off, src, ok);
    cp_async_16(dv + off, src + v_minus_k, ok);
  };
  if (kv0 + Shape::kKvTile <= range_end) {
    cursor.template for_rows<T, true>(a, kv0, range_end, copy);
  } else {
    cursor.template for_rows<T, false>(a, kv0, range_end, copy);
  }
}

template <class V, class T, class Shape>
__device__ __forceinline__ void prefill_sm90_produce(const PrefillSm90Params<V>& p,
                                                     const PrefillSm90Smem<Shape>& sm) {
  constexpr int D = Shape::kHeadDim;
  constexpr int KVT = Shape::kKvTile;
  constexpr int CH = D / 8;
  constexpr int kRowStep = 128 / CH;
  constexpr int kIters = KVT / kRowStep;
  using Cursor = KvTileCursor<kIters, kRowStep>;
  const AttncPrefillArgs& a = p.args;
  const int tid = threadIdx.x;  // 0..127
  const int chunk = tid % CH;
  const int row0 = tid / CH;
  int stage = 0;
  int phase = 0;
  for (int w = blockIdx.x; w < a.num_work; w += gridDim.x) {
    PrefillSm90Item it = PrefillSm90Item::load(a, w);
    if (!it.valid()) continue;
    const V var(p.params, it.request_info(a));
    it.set_range<V, KVT>(var);
    const Cursor cursor = Cursor::template make<T>(a, it.kv, it.request, row0, chunk);
    TileClass cls;
    for (int t = it.next_tile<V, KVT>(var, 0, cls); t < it.num_tiles;
         t = it.next_tile<V, KVT>(var, t + 1, cls)) {
      const int kv0 = it.tile_begin(t, KVT);
      if (tile_uses_tma<Shape>(p.use_tma, a, kv0, it.range.end)) {
        if (tid == 0) {
          const int token = a.kv_indptr[it.request] + kv0;
          mbar_wait(sm.empty_k(stage), phase ^ 1);
          mbar_arrive_expect_tx(sm.full_k(stage), Shape::kTileBytes);
#pragma unroll
          for (int b = 0; b < D / 64; ++b)
            tma_load_3d(sm.k(stage) + b * KVT * 128, &p.tmap_k, 64 * b, it.kv_head, token,
                        sm.full_k(stage));
          mbar_wait(sm.empty_v(stage), phase ^ 1);
          mbar_arrive_expect_tx(sm.full_v(stage), Shape::kTileBytes);
#pragma unroll
          for (int b = 0; b < D / 64; ++b)
            tma_load_3d(sm.v(stage) + b * KVT * 128, &p.tmap_v, 64 * b, it.kv_head, token,
                        sm.full_v(stage));
        }
      } else {
        mbar_wait(sm.empty_k(stage), phase ^ 1);
        mbar_wait(sm.empty_v(stage), phase ^ 1);
        gather_kv_tile<T, Shape>(a, cursor, kv0, it.range.end, sm.k(stage), sm.v(stage), row0,
                                 chunk);
        mbar_arrive_cp_async(sm.full_k(stage));
        mbar_arrive_cp_async(sm.full_v(stage));
        // Every thread's pending-count increment precedes the one real arrival.
        named_sync(kProducerBarrier, 128);
        if (tid == 0) {
          mbar_arrive(sm.full_k(stage));
          mbar_arrive(sm.full_v(stage));
        }
      }
      if (++stage == Shape::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
  cp_async_wait<0>();
}

}  // namespace sm90
}  // namespace attnc
