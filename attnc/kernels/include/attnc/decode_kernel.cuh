// Owns: the batched paged decode kernel (sm80+) for one variant functor V: the loop of a
// CTA over its work items.
//
// Decode kernel: a persistent grid; CTA b runs work items [cta_indptr[b], cta_indptr[b+1]).
// A work item is (request, KV head, row block, KV chunk [begin, end)) (decode_item.cuh). The
// item's query rows are packed (row = token * group + head in group, all query tokens of the
// request: q_len 1..8 for speculative decoding) into 16 or 32 rows of mma.sync m16n8k16 tiles
// (decode_tile.cuh), so every K/V byte of the chunk is read once per KV head. K/V tiles of 64
// tokens are gathered from the pages with cp.async into a multi-stage pipeline
// (decode_loader.cuh); each of the 4 warps takes 16 tokens of a tile and keeps its own
// online-softmax state, computed with the warp math the prefill uses (decode_warp_state.cuh);
// the warps' states are combined in shared memory in a fixed order at the end of the item.
// One pipeline runs over all items of the CTA (with Tile::kCrossItem the next item's first
// tiles are in flight while the current one finishes). Unsplit items write the final output
// (and LSE); split items write fp32 partial states (decode_output.cuh) that the merge kernel
// (decode_merge.cuh) combines in chunk order (no atomics: bit-identical run to run).
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "decode_args.h"
#include "decode_item.cuh"
#include "decode_loader.cuh"
#include "decode_output.cuh"
#include "decode_tile.cuh"
#include "decode_warp_state.cuh"
#include "mma.cuh"
#include "smem_layout.cuh"
#include "variant_contract.cuh"

namespace attnc {

// All work items of one CTA. Every thread runs both roles in lock step:
// - the loader walks the (item, tile) sequence, issuing one K/V tile per iteration (with the
//   item's Q rows on its first tile) into stage (tile number % STAGES);
// - the compute side takes the same sequence STAGES - 1 tiles behind. With kCrossItem the
//   loader continues into the next items, so an item starts with its tiles in flight.
// At an item's end the four warps' states merge through the stage just consumed, and warp 0
// writes the output.
template <class V, class T, class Tile>
__device__ __forceinline__ void decode_cta(const AttncDecodeArgs& a,
                                           const typename V::Params& params,
                                           unsigned char* smem_bytes) {
  constexpr int D = Tile::kHeadDim;
  constexpr int KVT = Tile::kKvTile;
  constexpr int ROWS = Tile::kRows;
  constexpr int STAGES = Tile::kStages;
  constexpr bool kCross = Tile::kCrossItem;
  using Layout = SwizzledRows<D>;
  constexpr uint32_t kStageBytes = KVT * Layout::kRowBytes;

  const uint32_t s_q = mma::smem_addr(smem_bytes);
  const uint32_t s_k = s_q + Tile::kQSlots * ROWS * Layout::kRowBytes;
  const uint32_t s_v = s_k + STAGES * kStageBytes;
  float* const f_k = reinterpret_cast<float*>(smem_bytes + (s_k - s_q));
  float* const f_v = reinterpret_cast<float*>(smem_bytes + (s_v - s_q));
  float2* const s_ml = reinterpret_cast<float2*>(smem_bytes + (s_v - s_q) + STAGES * kStageBytes);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int q_len = a.header[ATTNC_DH_Q_LEN];
  const int group = a.num_qo_heads / a.num_kv_heads;
  const int w_begin = a.cta_indptr[blockIdx.x];
  const int w_end = a.cta_indptr[blockIdx.x + 1];
  const float sm_scale = a.sm_scale;
  const int page_size = a.page_size;
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;

  // This thread copies 16-byte chunk tid % (D / 8) of rows tid / (D / 8) + i * kRowStep.
  DecodeLoader<V, T, Tile> ld{a,     params,    s_q,       s_k,           s_v,          w_end,
                              q_len, group,     page_size, page_shift,    tid % (D / 8),
                              tid / (D / 8)};
  static_assert(Tile::kQSlots <= kDecodeMaxQSlots, "one bad-page flag per Q slot");
  if (tid < Tile::kQSlots) decode_bad_page_flag[tid] = 0;
  __syncthreads();  // the flags are clear before any load can set one
  if constexpr (kCross) {
    ld.open(w_begin);
    ld.prime(ld.item);
  }

  // This lane's ldmatrix addresses (see SwizzledRows::walk): Q rows (lane % 8) + 8 *
  // ((lane / 8) % 2), chunk lane / 16; K and V rows of this warp's 16 tokens of a stage.
  const int wkv = warp * Tile::kWarpKv;  // this warp's first token inside a tile
  const uint32_t q_off = Layout::offset((lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
  const uint32_t k_off = Layout::offset(wkv + (lane % 8) + 8 * (lane / 16), (lane / 8) % 2);
  const uint32_t v_off = Layout::offset(wkv + (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);

  int stage = 0;     // stage of the next tile to compute
  int c_qcount = 0;  // items with tiles started so far
  for (int w = w_begin; w < w_end; ++w) {
    const DecodeItem it = decode_open_item<V, ROWS, KVT, D>(a, params, w, q_len, group);
    const V var(params, decode_request_info<D>(a, it, q_len));
    DecodeWarpState<V, Tile> st;
    st.start(var, it, group, sm_scale);
    if constexpr (variant_has_sink<V>::value) {
      // An unsplit item owns the sink (the merge kernel adds it to split requests).
      // One lane per row over the four warps (their states are combined) holds its weight.
      if (it.part < 0) {
        start_rows_at_sink(var, st.rows, st.mult, st.m, st.l, warp == 0 && lane % 4 == 0);
      }
    }

    int t = decode_next_tile<V, KVT>(var, it, 0);
    const bool has_tiles = t < it.num_tiles;
    if (!kCross && has_tiles) {  // refill the pipeline with this item's first tiles
      ld.start_item(w, it, t);
      ld.prime(it);
    }
    const uint32_t q_base =
        s_q + (c_qcount % Tile::kQSlots) * ROWS * Layout::kRowBytes + q_off;
    if (has_tiles) ++c_qcount;
    int last = 0;  // stage of the item's last tile
    for (; t < it.num_tiles; t = decode_next_tile<V, KVT>(var, it, t + 1)) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      ld.issue(kCross ? ld.item : it);
      cp_async_commit();
      last = stage;
      stage = stage + 1 == STAGES ? 0 : stage + 1;

      const int tile_kv0 = it.begin + t * KVT;
      const int kv1 = min(tile_kv0 + KVT, it.end);
      if (tile_kv0 + wkv >= kv1) continue;  // this warp's 16 tokens are past the range
      const bool partial =
          V::kHasMask && var.classify(it.t0, it.t1, tile_kv0, kv1) == TileClass::kPartial;
      decode_warp_tile<V, T, Tile>(var, st, q_base, s_k + last * kStageBytes + k_off,
                                   s_v + last * kStageBytes + v_off, tile_kv0 + wkv, kv1,
                                   partial, sm_scale);
    }
    bool poisoned = false;  // a loaded row of this item had a bad page id (decode_loader.cuh)
    if (has_tiles) {
      constexpr int kStageFloats = kStageBytes / 4;
      const int slot = (c_qcount - 1) % Tile::kQSlots;
      poisoned = __syncthreads_or(decode_bad_page_flag[slot]) != 0;
      // Cleared before the combine's barrier; the slot's next item loads after it.
      if (tid == 0) decode_bad_page_flag[slot] = 0;
      decode_combine_warps(st, f_k + last * kStageFloats, f_v + last * kStageFloats, s_ml);
    }
    if (warp == 0) decode_store_item<V, T, Tile>(a, var, st, w, q_len, group, poisoned);
  }
  cp_async_wait<0>();
}

// The decode kernel of tile shape Tile: CTA b runs the work items of the plan's CTA b.
template <class V, class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    decode_kernel(const AttncDecodeArgs a, const typename V::Params params) {
  static_assert(VariantContract<V>::ok, "");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  decode_cta<V, T, Tile>(a, params, smem_bytes);
}

}  // namespace attnc
