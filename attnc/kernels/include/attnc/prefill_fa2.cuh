// Owns: the FlashAttention-2 style prefill kernel (sm80+) for one variant functor V:
// one CTA = one work item of the plan (request, query tile, KV head, KV chunk); the query
// heads of the KV head are packed into the tile's rows (row r -> token r / group, head
// kv_head*group + r%group). Items of split tiles write fp32 partial states (partial_merge.cuh
// combines them); the others write O and LSE.
// Q is staged through swizzled shared memory (kept in registers when the shape allows), K/V
// stages stream through a multi-stage cp.async pipeline (prefill_mainloop.cuh), S = Q K^T and
// O += P V run on mma.sync m16n8k16 with P kept in registers, softmax is online in the exp2
// domain.
// The KV loop covers only V::kv_range of the tile; EMPTY tiles (V::classify, or the plan's
// tile map for masks that read per-token tensors) are never loaded; FULL tiles skip V::mask;
// PARTIAL tiles evaluate it per element. Rows of an unsplit item start at the variant's sink
// (online_softmax.cuh); the merge kernel adds it to split tiles.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "key_values_stage.cuh"
#include "kv_gather.cuh"
#include "mma.cuh"
#include "online_softmax.cuh"
#include "prefill_args.h"
#include "prefill_mainloop.cuh"
#include "row_store.cuh"
#include "score_hooks.cuh"
#include "smem_layout.cuh"
#include "variant_contract.cuh"

namespace attnc {

// Epilogue of a CTA: normalises this lane's rows and stores O (after V::output) and LSE, or
// the fp32 partial state of a split tile (the merge kernel normalises across chunks and
// applies V::output). token0: the first query token (packed row 0) of the tile. poisoned: the
// CTA met a page id outside the cache; O and LSE (or the partial state) are NaN.
template <class V, class T, class Tile>
__device__ __forceinline__ void prefill_store_tile(
    const AttncPrefillArgs& args, const V& var, const int32_t* item,
    const typename V::Row (&rows)[Tile::kMmaQ][2], const float (&mult)[Tile::kMmaQ][2],
    const float (&o)[Tile::kMmaQ][Tile::kHeadDim / 8][4], const float (&m)[Tile::kMmaQ][2],
    const float (&l)[Tile::kMmaQ][2], int rows_valid, int kv_head, int group, int token0,
    bool poisoned) {
  constexpr int D = Tile::kHeadDim;
  constexpr int MQ = Tile::kMmaQ;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int tq = lane % 4;
  // Read only now: keeping it live through the main loop costs a register there.
  const int part_row = item[ATTNC_PI_PART_ROW];
  T* o_ptr = static_cast<T*>(args.o);
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 * MQ + mi * 16 + g + 8 * h;
      float inv = 1.f;
      float lse = 0.f;
      bool visible = true;
      if constexpr (V::kUseSoftmax) {
        constexpr bool kSink = kSinkAtEnd<V>;
        const float c = V::kScoreIsIdentity ? mult[mi][h] : 1.f;
        // Only unsplit items own the sink; the merge kernel adds it to split tiles.
        const float m_sink =
            kSink && part_row < 0 ? sink_in_m_units(var, rows[mi][h], c) : -CUDART_INF_F;
        const SoftmaxRowEnd end =
            finish_softmax_row<kSink>(m[mi][h], c, quad_sum(l[mi][h]), m_sink);
        visible = end.seen;
        inv = end.inv;
        lse = end.lse;
      }
      if (poisoned) {
        inv = CUDART_NAN_F;
        lse = CUDART_NAN_F;
        visible = false;
      }
      if (r >= rows_valid) continue;
      const int head = kv_head * group + r % group;
      if (part_row >= 0) {
        // Split tile: the merge kernel normalises across chunks and applies V::output.
        const int64_t prow = part_row + static_cast<int64_t>(r / group) * args.num_qo_heads + head;
        store_partial_row(args.part_o + prow * D + 2 * tq, o[mi], h, inv);
        if (tq == 0) args.part_lse[prow] = lse;
        continue;
      }
      const int token = token0 + r / group;
      T* dst = o_ptr + static_cast<int64_t>(token) * args.o_stride_tok +
               static_cast<int64_t>(head) * args.o_stride_head + 2 * tq;
      store_output_row<V, T>(dst, var, rows[mi][h], o[mi], h, inv, visible);
      if (args.lse != nullptr && tq == 0) {
        args.lse[static_cast<int64_t>(token) * args.num_qo_heads + head] = lse;
      }
    }
  }
}

// Shared memory of variant V's kernel of shape Tile: the Q tile, the K/V stages and, for a
// variant whose key values it stages, a block of them per stage (kPrefillKeyBytes).
template <class V, class Tile>
constexpr int prefill_fa2_smem_bytes() {
  return Tile::kSmemBytes + Tile::kStages * Tile::kKvTile * kPrefillKeyBytes<V>;
}

template <class V, class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    prefill_fa2_kernel(const AttncPrefillArgs args, const typename V::Params params) {
  // check_variant_contract<V>() is a host constexpr; its device-usable form:
  static_assert(VariantContract<V>::ok, "");
  constexpr int D = Tile::kHeadDim;
  constexpr int kThreads = Tile::kThreads;
  constexpr int MQ = Tile::kMmaQ;
  constexpr int ROWS = Tile::kRows;
  constexpr int NO = D / 8;     // n8 column blocks of O
  constexpr int CH = D / 8;     // 16-byte chunks per row
  using Layout = SwizzledRows<D>;
  using Row = typename V::Row;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const uint32_t s_q = mma::smem_addr(smem_bytes);
  const uint32_t s_k = s_q + ROWS * Layout::kRowBytes;
  const uint32_t s_v = s_k + Tile::kStages * Tile::kKvTile * Layout::kRowBytes;
  const uint32_t s_keys = s_v + Tile::kStages * Tile::kKvTile * Layout::kRowBytes;  // key values

  const int tid = threadIdx.x;
  const int warp = tid / 32;

  const int32_t* item = args.items + static_cast<int64_t>(blockIdx.x) * ATTNC_PI_SIZE;
  const int request = item[ATTNC_PI_REQUEST];
  const int q_tile = item[ATTNC_PI_Q_TILE];
  const int kv_head = item[ATTNC_PI_KV_HEAD];
  const int chunk_begin = item[ATTNC_PI_KV_BEGIN];
  const int chunk_end = item[ATTNC_PI_KV_END];
  const int group = args.num_qo_heads / args.num_kv_heads;
  const int q_start = args.qo_indptr[request];
  const int q_len = args.qo_indptr[request + 1] - q_start;
  const int q0 = q_tile * args.tile_q_tokens;
  if (q0 >= q_len) return;
  const int q1 = min(q0 + args.tile_q_tokens, q_len);
  const int rows_valid = (q1 - q0) * group;

  const KvRows kv = KvRows::make(args, request, kv_head);
  const float sm_scale = args.sm_scale;
  const V var(params, RequestInfo{request, q_len, kv.kv_len, args.num_qo_heads,
                                  args.num_kv_heads, D, sm_scale, q_start,
                                  kv_token_start_of(args.kv_token_start, request)});

  // ---- Q tile -> shared memory (rows past the tile are zero-filled).
  {
    static_assert((ROWS * CH) % kThreads == 0, "Q tile chunks must split evenly over threads");
    const T* q_ptr = static_cast<const T*>(args.q);
    const int c = tid % CH;
    for (int it = 0; it < ROWS * CH / kThreads; ++it) {
      const int r = tid / CH + it * (kThreads / CH);
      const bool ok = r < rows_valid;
      const int rr = ok ? r : 0;
      const int64_t off = static_cast<int64_t>(q_start + q0 + rr / group) * args.q_stride_tok +
                          static_cast<int64_t>(kv_head * group + rr % group) * args.q_stride_head;
      cp_async_16(s_q + Layout::offset(r, c), q_ptr + off + c * 8, ok);
    }
    cp_async_commit();
  }

  // ---- Per-thread rows: warp w owns rows [16*MQ*w, 16*MQ*(w+1)); this lane rows g and g+8
  // of each of its m16 tiles.
  Row rows[MQ][2];
  float mult[MQ][2];  // exp2 multiplier of the raw dot product (affine scores)
  hoist_rows(var, rows, mult, 0, warp * 16 * MQ, rows_valid, q0, kv_head, group, sm_scale);
  float o[MQ][NO][4];
  float m[MQ][2];
  float l[MQ][2];
  clear_softmax_state(o, m, l);
  if constexpr (variant_has_sink<V>::value) {
    // An unsplit item owns the sink (split tiles get it in the merge kernel).
    if (item[ATTNC_PI_PART_ROW] < 0) start_rows_at_sink(var, rows, mult, m, l, tid % 4 == 0);
  }

  // ---- KV range and main loop (prefill_mainloop.cuh).
  KvRange range{0, 0};
  if (kv.kv_len > 0) range = var.kv_range(q0, q1);
  range.begin = max(range.begin, max(chunk_begin, 0));
  range.end = min(range.end, min(chunk_end, kv.kv_len));
  const TileMapRow map = item_tile_map<V>(args, request, q_tile, kv.kv_len);
  const bool saw_bad = prefill_kv_loop<V, T, Tile>(args, var, kv, request, range, q0, q1, map,
                                                   s_q, s_k, s_v, s_keys, rows, mult, sm_scale, o,
                                                   m, l);
  // One item per CTA: a bad page id anywhere in it makes all its rows NaN.
  const bool poisoned = __syncthreads_or(saw_bad) != 0;

  // ---- Epilogue: normalise, transform, store O and LSE (or the fp32 partial state).
  prefill_store_tile<V, T, Tile>(args, var, item, rows, mult, o, m, l, rows_valid, kv_head, group,
                                 q_start + q0, poisoned);
}

}  // namespace attnc
