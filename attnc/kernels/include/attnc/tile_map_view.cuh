// Owns: how the prefill kernels read a plan's tile map (AttncPrefillArgs.tile_map,
// prefill_args.h): the map row of a work item's query tile, the class of a KV tile [kv0, kv1)
// from the map columns it covers (EMPTY if all are EMPTY, FULL if all are FULL, else PARTIAL),
// the choice between the map and V::classify, and the walk to an item's next non-empty KV tile.
//
// Only variants whose mask reads per-token tensors (variant_mask_reads_tokens<V>) consult the
// map; for every other variant the map path compiles away (classify() is exact in closed
// form there) and a map passed to them is ignored.
#pragma once

#include <stdint.h>

#include "prefill_args.h"
#include "variant_contract.cuh"

namespace attnc {

// The map row of one query tile of one request; cols == nullptr: no map.
struct TileMapRow {
  const uint8_t* cols;  // class of keys [c * kv_block, (c + 1) * kv_block) at cols[c]
  int kv_block;         // keys per column

  // Row q_tile (query tokens [q_tile * tile_q_tokens, ...)) of request `request`, whose KV
  // holds kv_len tokens.
  ATTNC_HD static TileMapRow make(const AttncPrefillArgs& a, int request, int q_tile,
                                  int kv_len) {
    if (a.tile_map == nullptr || a.tile_map_kv_block <= 0) return TileMapRow{nullptr, 1};
    const int block = a.tile_map_kv_block;
    const int64_t num_cols = (kv_len + block - 1) / block;
    return TileMapRow{a.tile_map + a.tile_map_start[request] + q_tile * num_cols, block};
  }

  // Class of the keys [kv0, kv1) (kv0 < kv1 <= kv_len): the columns it touches combined.
  ATTNC_HD TileClass classify(int kv0, int kv1) const {
    unsigned any = 0u;    // OR of the column classes: 0 only if every column is EMPTY
    unsigned every = 3u;  // AND of them: 1 with any == 1 only if every column is FULL
    for (int c = kv0 / kv_block; c <= (kv1 - 1) / kv_block; ++c) {
      const unsigned v = cols[c];
      any |= v;
      every &= v;
    }
    if (any == 0u) return TileClass::kEmpty;
    return any == 1u && every == 1u ? TileClass::kFull : TileClass::kPartial;
  }
};

// Class of the tile [q0, q1) x [kv0, kv1) of one work item: from the map when the variant's
// mask reads per-token tensors and the plan gave one, else from V::classify.
template <class V>
ATTNC_HD TileClass item_tile_class(const V& var, const TileMapRow& map, int q0, int q1, int kv0,
                                   int kv1) {
  if constexpr (variant_mask_reads_tokens<V>::value) {
    if (map.cols != nullptr) return map.classify(kv0, kv1);
  } else {
    (void)map;
  }
  return var.classify(q0, q1, kv0, kv1);
}

// The first of an item's KV tiles t, t + 1, ... (num_tiles KV_TILE-key tiles from range.begin,
// the last cut at range.end) that is not EMPTY for the query tokens [q0, q1), with its class
// in cls; num_tiles when none is. Every tile is FULL for a variant without a mask.
template <int KV_TILE, class V>
ATTNC_HD int next_nonempty_tile(const V& var, const TileMapRow& map, int q0, int q1,
                                KvRange range, int num_tiles, int t, TileClass& cls) {
  cls = TileClass::kFull;
  if constexpr (V::kHasMask) {
    for (; t < num_tiles; ++t) {
      const int kv0 = range.begin + t * KV_TILE;
      const int kv1 = kv0 + KV_TILE < range.end ? kv0 + KV_TILE : range.end;
      cls = item_tile_class(var, map, q0, q1, kv0, kv1);
      if (cls != TileClass::kEmpty) break;
    }
  }
  return t;
}

// The order of an item's KV tiles in the prefill kernels: from its last to its first for a
// softmax variant whose bias is stepped (linear in kv_idx, such as ALiBi's). With a positive
// step the bias grows towards the diagonal, so the first tile of the reversed walk holds every
// row's largest logits near enough that later tiles rarely move the row max. In key order each
// tile raised the max of the rows whose bias grows by more than the rescale slack over a tile
// (ALiBi: the heads of slope > 0.07 at 80 keys), which rescaled O on every tile. A negative
// step (bias falling towards the diagonal) pays those rescales in this order instead; the
// results do not depend on the order.
template <class V>
constexpr bool kv_walk_reversed = V::kUseSoftmax && variant_bias_step<V>::value;

// The last of an item's KV tiles t, t - 1, ... (as next_nonempty_tile) that is not EMPTY, with
// its class in cls; -1 when none is.
template <int KV_TILE, class V>
ATTNC_HD int prev_nonempty_tile(const V& var, const TileMapRow& map, int q0, int q1,
                                KvRange range, int t, TileClass& cls) {
  cls = TileClass::kFull;
  if constexpr (V::kHasMask) {
    for (; t >= 0; --t) {
      const int kv0 = range.begin + t * KV_TILE;
      const int kv1 = kv0 + KV_TILE < range.end ? kv0 + KV_TILE : range.end;
      cls = item_tile_class(var, map, q0, q1, kv0, kv1);
      if (cls != TileClass::kEmpty) break;
    }
  }
  return t;
}

// The map row of a work item for variant V: {nullptr} without a map or when V's mask does not
// read per-token tensors (no loads then).
template <class V>
ATTNC_HD TileMapRow item_tile_map(const AttncPrefillArgs& a, int request, int q_tile,
                                  int kv_len) {
  if constexpr (variant_mask_reads_tokens<V>::value) {
    return TileMapRow::make(a, request, q_tile, kv_len);
  } else {
    (void)a;
    (void)request;
    (void)q_tile;
    (void)kv_len;
    return TileMapRow{nullptr, 1};
  }
}

}  // namespace attnc
