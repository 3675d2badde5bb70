// Owns: what both warp roles of the Hopper prefill derive from one work item
// (prefill_args.h AttncPrefillItem): the request, query tile and KV head, the packed rows, the
// KV rows of the request, the variant functor, the KV range (variant kv_range intersected with
// the item's chunk), and the walk over its non-empty KV tiles with their classes. The producer
// and the consumers walk the same tiles in the same order: that is the pipeline's contract.
#pragma once

#include <stdint.h>

#include "../kv_gather.cuh"
#include "../prefill_args.h"
#include "../tile_map_view.cuh"
#include "../variant_contract.cuh"

namespace attnc {
namespace sm90 {

struct PrefillSm90Item {
  int request;
  int kv_head;
  int group;
  int q_start;     // first query token of the request
  int q_len;
  int q0, q1;      // query tokens [q0, q1) of the request in this tile
  int rows_valid;  // (q1 - q0) * group packed rows
  KvRows kv;
  KvRange range;   // KV range the tile visits (empty: none)
  int num_tiles;   // KV tiles of kKvTile keys covering range

  int chunk_begin, chunk_end;  // the item's KV chunk
  int q_tile;
  TileMapRow map;  // the item's tile-map row (set_range; cols null: classes from V::classify)

  // Decodes item w (range and num_tiles are set by set_range); valid() is false for a tile
  // past the request's queries. `group` is num_qo_heads / num_kv_heads (divided once per
  // launch by the caller).
  __device__ __forceinline__ static PrefillSm90Item load(const AttncPrefillArgs& a, int w,
                                                         int group) {
    PrefillSm90Item it;
    const int32_t* item = a.items + static_cast<int64_t>(w) * ATTNC_PI_SIZE;
    it.request = item[ATTNC_PI_REQUEST];
    it.q_tile = item[ATTNC_PI_Q_TILE];
    it.kv_head = item[ATTNC_PI_KV_HEAD];
    it.chunk_begin = item[ATTNC_PI_KV_BEGIN];
    it.chunk_end = item[ATTNC_PI_KV_END];
    it.group = group;
    it.q_start = a.qo_indptr[it.request];
    it.q_len = a.qo_indptr[it.request + 1] - it.q_start;
    it.q0 = it.q_tile * a.tile_q_tokens;
    it.q1 = min(it.q0 + a.tile_q_tokens, it.q_len);
    it.rows_valid = (it.q1 - it.q0) * it.group;
    it.kv = KvRows::make(a, it.request, it.kv_head);
    return it;
  }

  __device__ __forceinline__ RequestInfo request_info(const AttncPrefillArgs& a) const {
    return RequestInfo{request, q_len, kv.kv_len, a.num_qo_heads, a.num_kv_heads,
                       a.head_dim, a.sm_scale, q_start,
                       kv_token_start_of(a.kv_token_start, request)};
  }

  // The KV range: the variant's kv_range of the tile, its start rounded down to 16 keys (the
  // extra keys are masked; a tail then ends 16-aligned when the range does, see
  // tile_uses_tma), intersected with the item's chunk; and the item's tile-map row.
  template <class V, int KV_TILE>
  __device__ __forceinline__ void set_range(const V& var, const AttncPrefillArgs& a) {
    map = item_tile_map<V>(a, request, q_tile, kv.kv_len);
    range = KvRange{0, 0};
    if (valid() && kv.kv_len > 0) range = var.kv_range(q0, q1);
    if (range.begin < range.end) range.begin &= ~15;
    range.begin = max(range.begin, max(chunk_begin, 0));
    range.end = min(range.end, min(chunk_end, kv.kv_len));
    num_tiles = range.end > range.begin ? (range.end - range.begin + KV_TILE - 1) / KV_TILE : 0;
  }

  __device__ __forceinline__ bool valid() const { return q0 < q_len; }

  __device__ __forceinline__ int tile_begin(int t, int kv_tile) const {
    return range.begin + t * kv_tile;
  }

  // The first non-empty tile at or after t (num_tiles: none) and its class.
  template <class V, int KV_TILE>
  __device__ __forceinline__ int next_tile(const V& var, int t, TileClass& cls) const {
    return next_nonempty_tile<KV_TILE>(var, map, q0, q1, range, num_tiles, t, cls);
  }
  // The tile after t in the walk of kReverse (kv_walk_reversed): the first non-empty one at or
  // past t in walk order (forward: t, t + 1, ...; reversed: t, t - 1, ...), -1 or num_tiles
  // when none is.
  template <class V, int KV_TILE, bool kReverse>
  __device__ __forceinline__ int walk_tile(const V& var, int t, TileClass& cls) const {
    if constexpr (kReverse) return prev_nonempty_tile<KV_TILE>(var, map, q0, q1, range, t, cls);
    return next_tile<V, KV_TILE>(var, t, cls);
  }
  // Whether t is past the walk's end.
  template <bool kReverse>
  __device__ __forceinline__ bool walk_done(int t) const {
    return kReverse ? t < 0 : t >= num_tiles;
  }
};

}  // namespace sm90
}  // namespace attnc
