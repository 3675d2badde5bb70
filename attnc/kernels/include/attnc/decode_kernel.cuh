// Owns: the batched paged decode kernel (sm80+) for one variant functor V and the kernel that
// merges split-KV partial states.
//
// Decode kernel: a persistent grid; CTA b runs work items [cta_indptr[b], cta_indptr[b+1]).
// A work item is (request, KV head, row block, KV chunk [begin, end)). The item's query rows
// are packed (row = token * group + head in group, all query tokens of the request: q_len
// 1..8 for speculative decoding) into 16 or 32 rows of mma.sync m16n8k16 tiles, so every
// K/V byte of the chunk is read once per KV head. K/V tiles of 64 tokens are gathered from
// the pages with cp.async into a multi-stage pipeline; each of the 4 warps takes 16 tokens
// of a tile and keeps its own online-softmax state; the warps' states are combined in
// shared memory in a fixed order at the end of the item. 16-row tiles at d=64/128
// (decode_cta) run one pipeline over all items of the CTA, so the next item's first tiles
// are in flight while the current one finishes, and fetch page ids a tile ahead; the other
// shapes use the per-item pipeline (decode_item_legacy). Unsplit items write the final
// output (and LSE); split items write fp32 partial states that the merge kernel combines
// in chunk order (no atomics: bit-identical run to run).
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "cp_async.cuh"
#include "decode_args.h"
#include "merge_state.cuh"
#include "mma.cuh"
#include "online_softmax.cuh"
#include "partial_merge.cuh"
#include "smem_layout.cuh"
#include "variant_contract.cuh"

namespace attnc {

// Compile-time knobs (defaults are the tuned choice; the decode harness builds the others):
// ATTNC_DECODE_CROSS_ITEM: 1 lets the loads of a CTA's next work item start while the
//   current item still computes (one pipeline over all items of the CTA); 0 refills the
//   pipeline at every item start.
// ATTNC_DECODE_L2_HINT: 0, 128 or 256: L2 prefetch size hint on the K/V cp.async copies.
#ifndef ATTNC_DECODE_CROSS_ITEM
#define ATTNC_DECODE_CROSS_ITEM 1
#endif
#ifndef ATTNC_DECODE_L2_HINT
#define ATTNC_DECODE_L2_HINT 0
#endif

// One CTA shape: 4 warps x 16 KV tokens per tile, 16 * MQ packed query rows, STAGES K/V
// tiles in flight. CROSS_ITEM: the pipeline runs across work items, which needs one Q slot
// per stage (an item's Q arrives with its first tile); otherwise a single Q slot.
template <int HEAD_DIM, int MQ, int STAGES, int MIN_BLOCKS, bool CROSS_ITEM>
struct DecodeTile {
  static constexpr bool kLegacy = false;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMmaQ = MQ;
  static constexpr int kRows = 16 * MQ;
  static constexpr int kWarpKv = 16;
  static constexpr int kKvTile = kWarps * kWarpKv;
  static constexpr int kStages = STAGES;
  static constexpr int kMinBlocks = MIN_BLOCKS;
  static constexpr bool kCrossItem = CROSS_ITEM;
  static constexpr int kQSlots = CROSS_ITEM ? STAGES : 1;
  static constexpr int kQBytes = 2 * HEAD_DIM * kRows;        // one Q slot
  static constexpr int kHalfStageBytes = 2 * HEAD_DIM * kKvTile;  // K (or V) of one stage
  // Warp-state exchange of the combine: per slot and lane, (m, l) of each of its rows.
  static constexpr int kMlBytes = 2 * 32 * 2 * MQ * 8;
  static constexpr int kSmemBytes = kQSlots * kQBytes + 2 * STAGES * kHalfStageBytes + kMlBytes;
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  // The combine keeps one warp's O fragments (fp32) in the K or the V half of a free stage.
  static_assert(kRows * HEAD_DIM * 4 <= kHalfStageBytes, "combine slot must fit a half stage");
};

// Tile of the per-item pipeline (decode_item_legacy).
template <int HEAD_DIM, int MQ, int STAGES, int MIN_BLOCKS>
struct DecodeTileLegacy {
  static constexpr bool kLegacy = true;
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMmaQ = MQ;
  static constexpr int kRows = 16 * MQ;
  static constexpr int kWarpKv = 16;
  static constexpr int kKvTile = kWarps * kWarpKv;
  static constexpr int kStages = STAGES;
  static constexpr int kMinBlocks = MIN_BLOCKS;
  static constexpr int kPipeBytes = 2 * HEAD_DIM * (kRows + 2 * STAGES * kKvTile);
  static constexpr int kCombineBytes =
      4 * (kWarps * kRows * HEAD_DIM + 2 * kWarps * kRows + kWarps * kRows + 2 * kRows);
  static constexpr int kSmemBytes = kPipeBytes > kCombineBytes ? kPipeBytes : kCombineBytes;
};

template <int HEAD_DIM, int MQ>
struct DecodeTileFor;
template <> struct DecodeTileFor<64, 1> {
  using type = DecodeTile<64, 1, 4, 3, ATTNC_DECODE_CROSS_ITEM != 0>;
};
// 32 rows at d=64: the new loop spills on sm_80 under the 168-register cap of 3 CTAs/SM.
template <> struct DecodeTileFor<64, 2> { using type = DecodeTileLegacy<64, 2, 4, 3>; };
template <> struct DecodeTileFor<128, 1> {
  using type = DecodeTile<128, 1, 3, 2, ATTNC_DECODE_CROSS_ITEM != 0>;
};
// 32 rows at d=128: three Q slots would not leave room for two CTAs per SM, and the new
// loop needs a few registers more than the 255 that two CTAs per SM allow.
template <> struct DecodeTileFor<128, 2> { using type = DecodeTileLegacy<128, 2, 3, 2>; };
// d=256: the new loop spills on sm_80 at 255 registers; keep the per-item pipeline.
template <> struct DecodeTileFor<256, 1> { using type = DecodeTileLegacy<256, 1, 2, 1>; };

template <int HEAD_DIM>
constexpr int decode_max_rows() {
  return HEAD_DIM <= 128 ? 32 : 16;
}

// 16-byte K/V copy with the optional L2 prefetch hint (zero-fills when !valid).
__device__ __forceinline__ void decode_cp_async_16(uint32_t smem, const void* gmem, bool valid) {
#if ATTNC_DECODE_L2_HINT == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem),
               "l"(gmem), "r"(valid ? 16 : 0));
#elif ATTNC_DECODE_L2_HINT == 128
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem),
               "l"(gmem), "r"(valid ? 16 : 0));
#else
  cp_async_16(smem, gmem, valid);
#endif
}

// What a work item covers, read from the work list (kv_begin/kv_end: its visible chunk).
struct DecodeItem {
  int request;
  int kv_head;
  int row0;        // first packed row
  int rows_valid;  // packed rows of the item that exist
  int t0, t1;      // query tokens [t0, t1) of those rows
  int kv_len;
  int begin, end;  // visible KV range of the chunk
  int num_tiles;
  int part;
};

template <class V, int ROWS, int KVT, int D>
__device__ __forceinline__ DecodeItem decode_open_item(const AttncDecodeArgs& a,
                                                       const typename V::Params& params, int w,
                                                       int q_len, int group) {
  const int4* src = reinterpret_cast<const int4*>(a.items + static_cast<int64_t>(w) * ATTNC_WI_SIZE);
  const int4 lo = __ldg(src);
  const int4 hi = __ldg(src + 1);
  DecodeItem it;
  it.request = lo.x;
  it.kv_head = lo.y;
  it.row0 = lo.z * ROWS;
  it.part = hi.y;
  it.kv_len = __ldg(a.req_kv_len + it.request);
  it.rows_valid = min(ROWS, q_len * group - it.row0);
  it.t0 = it.row0 / group;
  it.t1 = (it.row0 + it.rows_valid - 1) / group + 1;
  const V var(params, RequestInfo{it.request, q_len, it.kv_len, a.num_qo_heads, a.num_kv_heads,
                                  D, a.sm_scale});
  KvRange range{0, 0};
  if (it.kv_len > 0) range = var.kv_range(it.t0, it.t1);
  it.begin = max(max(range.begin, lo.w), 0);
  it.end = min(min(range.end, hi.x), it.kv_len);
  it.num_tiles = it.end > it.begin ? (it.end - it.begin + KVT - 1) / KVT : 0;
  return it;
}

// First tile >= t of the item that the mask does not hide entirely.
template <class V, int KVT>
__device__ __forceinline__ int decode_next_tile(const V& var, const DecodeItem& it, int t) {
  if constexpr (V::kHasMask) {
    while (t < it.num_tiles) {
      const int kv0 = it.begin + t * KVT;
      if (var.classify(it.t0, it.t1, kv0, min(kv0 + KVT, it.end)) != TileClass::kEmpty) break;
      ++t;
    }
  }
  return t;
}

// All work items of one CTA. Every thread runs both roles in lock step:
// - the loader walks the (item, tile) sequence, issuing one K/V tile per iteration (with the
//   item's Q rows on its first tile) into stage (tile number % STAGES), the page ids of the
//   tile after it already fetched into registers;
// - the compute side takes the same sequence STAGES - 1 tiles behind. With kCrossItem the
//   loader continues into the next items, so an item starts with its tiles in flight.
// At an item's end the four warps' states merge through the stage just consumed (fixed
// order: (w0 + w2) + (w1 + w3)), and warp 0 writes the output.
template <class V, class T, class Tile>
__device__ __forceinline__ void decode_cta(const AttncDecodeArgs& a,
                                           const typename V::Params& params,
                                           unsigned char* smem_bytes) {
  constexpr int D = Tile::kHeadDim;
  constexpr int kThreads = Tile::kThreads;
  constexpr int MQ = Tile::kMmaQ;
  constexpr int KVT = Tile::kKvTile;
  constexpr int ROWS = Tile::kRows;
  constexpr int STAGES = Tile::kStages;
  constexpr int QSLOTS = Tile::kQSlots;
  constexpr bool kCross = Tile::kCrossItem;
  constexpr int KD = D / 16;
  constexpr int NO = D / 8;
  constexpr int CH = D / 8;
  constexpr int NIT = KVT * CH / kThreads;  // 16-byte K (and V) copies per thread and tile
  static_assert((KVT * CH) % kThreads == 0, "KV tile chunks must split evenly over threads");
  static_assert(Tile::kWarps == 4, "the combine tree is written for four warps");
  using Layout = SwizzledRows<D>;
  using Row = typename V::Row;

  T* s_q = reinterpret_cast<T*>(smem_bytes);
  T* s_k = s_q + QSLOTS * ROWS * D;
  T* s_v = s_k + STAGES * KVT * D;
  float2* s_ml = reinterpret_cast<float2*>(s_v + STAGES * KVT * D);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int tq = lane % 4;

  const int q_len = a.header[ATTNC_DH_Q_LEN];
  const int group = a.num_qo_heads / a.num_kv_heads;
  const int w_begin = a.cta_indptr[blockIdx.x];
  const int w_end = a.cta_indptr[blockIdx.x + 1];
  const float sm_scale = a.sm_scale;
  const int page_size = a.page_size;
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  const T* k_ptr = static_cast<const T*>(a.k);
  const T* v_ptr = static_cast<const T*>(a.v);
  const int c_ld = tid % CH;   // this thread's 16-byte chunk of a row
  const int r_ld = tid / CH;   // its first row of a tile (then every kThreads / CH rows)

  auto request_info = [&](const DecodeItem& it) {
    return RequestInfo{it.request, q_len, it.kv_len, a.num_qo_heads, a.num_kv_heads, D,
                       sm_scale};
  };
  auto page_of = [&](int kv) { return page_shift >= 0 ? kv >> page_shift : kv / page_size; };

  // ---- Loader state.
  DecodeItem L{};
  int l_w = w_begin;      // item being loaded
  int l_t = 0;            // its next tile
  int l_stage = 0;        // stage of the next tile
  int l_qcount = 0;       // items with tiles opened so far (Q slot = count % QSLOTS)
  int l_qslot = 0;
  bool l_active = false;  // a tile is ready to issue
  bool l_first = false;   // that tile is the item's first: load Q with it
  const int32_t* l_pages = a.page_ids;
  int64_t l_head_off = 0;
  // Page ids of the next tile's rows, fetched one tile ahead (32-row tiles have no
  // registers to spare: they read them when issuing).
  constexpr bool kPrefetchPids = MQ == 1;
  constexpr int kIssueUnroll = kPrefetchPids ? NIT : 2;
  int pid[NIT];

  auto l_load_pids = [&](const DecodeItem& li) {
    if (!kPrefetchPids) return;
    const int kv0 = li.begin + l_t * KVT;
    const int kv1 = min(kv0 + KVT, li.end);
#pragma unroll
    for (int i = 0; i < NIT; ++i) {
      const int kv = kv0 + r_ld + i * (kThreads / CH);
      pid[i] = kv < kv1 ? __ldg(l_pages + page_of(kv)) : 0;
    }
  };
  // Starts loading item w (already read into `item`) at its first visible tile t.
  // The item's Q rows into its Q slot (cp.async, in the group of its first tile).
  auto l_load_q = [&](const DecodeItem& li) {
    const T* q_ptr = static_cast<const T*>(a.q);
    const int64_t tok_base = static_cast<int64_t>(li.request) * q_len;
    const uint32_t sq = mma::smem_addr(s_q + l_qslot * ROWS * D);
    for (int r = r_ld; r < ROWS; r += kThreads / CH) {
      const bool ok = r < li.rows_valid;
      const int rr = li.row0 + (ok ? r : 0);
      const int64_t off = (tok_base + rr / group) * a.q_stride_tok +
                          static_cast<int64_t>(li.kv_head * group + rr % group) * a.q_stride_head;
      cp_async_16(sq + Layout::offset(r, c_ld), q_ptr + off + c_ld * 8, ok);
    }
  };
  // Without kCross the loader's item is always the compute side's (L stays unused).
  auto l_start = [&](int w, const DecodeItem& item, int t) {
    if (kCross) L = item;
    l_w = w;
    l_t = t;
    l_active = true;
    l_first = true;
    l_qslot = l_qcount % QSLOTS;
    ++l_qcount;
    l_pages = a.page_ids + __ldg(a.req_page_begin + item.request);
    l_head_off = static_cast<int64_t>(item.kv_head) * a.kv_stride_head;
    l_load_pids(item);
    if (!kCross) l_load_q(item);  // the slot is free: the previous item is done
  };
  // Opens the first item in [w, w_end) that has a visible tile.
  auto l_open = [&](int w) {
    l_active = false;
    for (; w < w_end; ++w) {
      const DecodeItem item = decode_open_item<V, ROWS, KVT, D>(a, params, w, q_len, group);
      const V lv(params, request_info(item));
      const int t = decode_next_tile<V, KVT>(lv, item, 0);
      if (t < item.num_tiles) {
        l_start(w, item, t);
        return;
      }
    }
  };
  auto l_issue = [&](const DecodeItem& li) {
    if (!l_active) return;
    if (kCross && l_first) {
      l_first = false;
      l_load_q(li);
    }
    const int kv0 = li.begin + l_t * KVT;
    const int kv1 = min(kv0 + KVT, li.end);
    const uint32_t dk = mma::smem_addr(s_k + l_stage * KVT * D);
    const uint32_t dv = mma::smem_addr(s_v + l_stage * KVT * D);
#pragma unroll kIssueUnroll
    for (int i = 0; i < NIT; ++i) {
      const int r = r_ld + i * (kThreads / CH);
      const int kv = kv0 + r;
      const bool ok = kv < kv1;
      const int page = page_of(kv);
      const int in_page = kv - page * page_size;
      int id = 0;
      if constexpr (kPrefetchPids) {
        id = pid[i];
      } else {
        id = ok ? __ldg(l_pages + page) : 0;
      }
      const int64_t off = ok ? l_head_off + static_cast<int64_t>(id) * a.kv_stride_page +
                                   static_cast<int64_t>(in_page) * a.kv_stride_tok
                             : 0;
      const uint32_t s = Layout::offset(r, c_ld);
      decode_cp_async_16(dk + s, k_ptr + off + c_ld * 8, ok);
      decode_cp_async_16(dv + s, v_ptr + off + c_ld * 8, ok);
    }
    l_stage = l_stage + 1 == STAGES ? 0 : l_stage + 1;
    const V lv(params, request_info(li));
    l_t = decode_next_tile<V, KVT>(lv, L, l_t + 1);
    if (l_t < li.num_tiles) {
      l_load_pids(li);
    } else if (kCross) {
      l_open(l_w + 1);
    } else {
      l_active = false;
    }
  };

  if (kCross) {
    l_open(w_begin);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      l_issue(L);
      cp_async_commit();
    }
  }

  int stage = 0;     // stage of the next tile to compute
  int c_qcount = 0;  // items with tiles started so far
  const int wkv = warp * Tile::kWarpKv;  // this warp's first token inside a tile

  for (int w = w_begin; w < w_end; ++w) {
    const DecodeItem it = decode_open_item<V, ROWS, KVT, D>(a, params, w, q_len, group);
    const V var(params, request_info(it));

    // This lane's rows: g and g + 8 of each m16 tile.
    Row rows[MQ][2];
    float mult[MQ][2];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = it.row0 + min(mi * 16 + g + 8 * h, it.rows_valid - 1);
        rows[mi][h] = var.row(r / group, it.kv_head * group + r % group);
        mult[mi][h] = V::kAffineScore ? var.score_scale(rows[mi][h]) * sm_scale * kLog2e : 1.f;
      }
    }

    float o[MQ][NO][4];
    float m[MQ][2];
    float l[MQ][2];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
      for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][n][e] = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[mi][h] = -CUDART_INF_F;
        l[mi][h] = 0.f;
      }
    }

    int t = decode_next_tile<V, KVT>(var, it, 0);
    const bool has_tiles = t < it.num_tiles;
    if (!kCross && has_tiles) {  // refill the pipeline with this item's first tiles
      l_start(w, it, t);
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        l_issue(it);
        cp_async_commit();
      }
    }
    const T* sq = s_q + (c_qcount % QSLOTS) * ROWS * D;
    if (has_tiles) ++c_qcount;
    int last = 0;  // stage of the item's last tile
    for (; t < it.num_tiles; t = decode_next_tile<V, KVT>(var, it, t + 1)) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      l_issue(kCross ? L : it);
      cp_async_commit();
      last = stage;
      stage = stage + 1 == STAGES ? 0 : stage + 1;

      const int kv0 = it.begin + t * KVT + wkv;
      const int kv1 = min(it.begin + t * KVT + KVT, it.end);
      if (kv0 >= kv1) continue;  // this warp's 16 tokens are past the range (last tile)
      const T* sk = s_k + last * KVT * D;
      const T* sv = s_v + last * KVT * D;
      const TileClass cls =
          V::kHasMask ? var.classify(it.t0, it.t1, it.begin + t * KVT, kv1) : TileClass::kFull;

      // S = Q K^T for this warp's 16 tokens: two n8 blocks.
      float s[MQ][2][4];
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t b[4];
        const int rk = wkv + (lane % 8) + 8 * (lane / 16);
        mma::ldmatrix_x4(b, mma::smem_addr(sk) + Layout::offset(rk, kk * 2 + (lane / 8) % 2));
#pragma unroll
        for (int mi = 0; mi < MQ; ++mi) {
          uint32_t qa[4];
          const int rq = mi * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
          mma::ldmatrix_x4(qa, mma::smem_addr(sq) + Layout::offset(rq, kk * 2 + lane / 16));
          mma::mma_16816<T>(s[mi][0], qa, b[0], b[1]);
          mma::mma_16816<T>(s[mi][1], qa, b[2], b[3]);
        }
      }

      // Scores -> weights (log2 domain for softmax variants).
      const bool need_mask = cls == TileClass::kPartial;
      const bool need_bound = kv1 - kv0 < Tile::kWarpKv;
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Row& row = rows[mi][h];
          float mx = -CUDART_INF_F;
#pragma unroll
          for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int kv_idx = kv0 + n * 8 + 2 * tq + e;
              bool vis = true;
              if (need_bound) vis = kv_idx < kv1;
              if (V::kHasMask && need_mask) vis = vis && var.mask(row, kv_idx);
              const float raw = s[mi][n][2 * h + e];
              float x;
              if constexpr (!V::kUseSoftmax) {
                x = vis ? var.score(row, raw * sm_scale, kv_idx) : 0.f;
              } else if constexpr (V::kScoreIsIdentity) {
                x = vis ? raw * mult[mi][h] : -CUDART_INF_F;
              } else if constexpr (V::kAffineScore) {
                x = vis ? fmaf(raw, mult[mi][h], var.score_bias(row, kv_idx) * kLog2e)
                        : -CUDART_INF_F;
              } else {
                x = vis ? var.score(row, raw * sm_scale, kv_idx) * kLog2e : -CUDART_INF_F;
              }
              s[mi][n][2 * h + e] = x;
              mx = fmaxf(mx, x);
            }
          }
          if constexpr (V::kUseSoftmax) {
            const float m_new = fmaxf(m[mi][h], quad_max(mx));
            const float m_use = safe_max(m_new);
            const float alpha = fast_exp2(m[mi][h] - m_use);
            m[mi][h] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < 2; ++n) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float p = fast_exp2(s[mi][n][2 * h + e] - m_use);
                s[mi][n][2 * h + e] = p;
                sum += p;
              }
            }
            l[mi][h] = l[mi][h] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
              o[mi][n][2 * h] *= alpha;
              o[mi][n][2 * h + 1] *= alpha;
            }
          }
        }
      }

      // O += P V with P from registers.
      uint32_t pa[MQ][4];
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
        pa[mi][0] = mma::Dtype<T>::pack(s[mi][0][0], s[mi][0][1]);
        pa[mi][1] = mma::Dtype<T>::pack(s[mi][0][2], s[mi][0][3]);
        pa[mi][2] = mma::Dtype<T>::pack(s[mi][1][0], s[mi][1][1]);
        pa[mi][3] = mma::Dtype<T>::pack(s[mi][1][2], s[mi][1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < NO / 2; ++dn) {
        uint32_t b[4];
        const int rv = wkv + (lane % 8) + 8 * ((lane / 8) % 2);
        mma::ldmatrix_x4_trans(b, mma::smem_addr(sv) + Layout::offset(rv, dn * 2 + lane / 16));
#pragma unroll
        for (int mi = 0; mi < MQ; ++mi) {
          mma::mma_16816<T>(o[mi][2 * dn], pa[mi], b[0], b[1]);
          mma::mma_16816<T>(o[mi][2 * dn + 1], pa[mi], b[2], b[3]);
        }
      }
    }

    // ---- Combine the warps' states through the stage just consumed. Slot 0 lives in its K
    // half, slot 1 in its V half; each lane keeps its own fragment positions, so a state
    // moves between two warps of identical layout without any reshuffle.
    if (has_tiles) {
      float* slot_o[2] = {reinterpret_cast<float*>(s_k + last * KVT * D),
                          reinterpret_cast<float*>(s_v + last * KVT * D)};
      auto put = [&](int slot) {
        float* so = slot == 0 ? slot_o[0] : slot_o[1];
#pragma unroll
        for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            *reinterpret_cast<float4*>(so + ((mi * NO + n) * 32 + lane) * 4) =
                make_float4(o[mi][n][0], o[mi][n][1], o[mi][n][2], o[mi][n][3]);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h)
            s_ml[(slot * MQ * 2 + mi * 2 + h) * 32 + lane] = make_float2(m[mi][h], l[mi][h]);
        }
      };
      auto take = [&](int slot) {
        const float* so = slot == 0 ? slot_o[0] : slot_o[1];
        float fa[MQ][2], fb[MQ][2];
#pragma unroll
        for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float2 x = s_ml[(slot * MQ * 2 + mi * 2 + h) * 32 + lane];
            if constexpr (V::kUseSoftmax) {
              const float mt = fmaxf(m[mi][h], x.x);
              const float mu = safe_max(mt);
              fa[mi][h] = exp2f(m[mi][h] - mu);
              fb[mi][h] = exp2f(x.x - mu);
              l[mi][h] = l[mi][h] * fa[mi][h] + x.y * fb[mi][h];
              m[mi][h] = mt;
            } else {
              fa[mi][h] = 1.f;
              fb[mi][h] = 1.f;
            }
          }
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            const float4 y =
                *reinterpret_cast<const float4*>(so + ((mi * NO + n) * 32 + lane) * 4);
            o[mi][n][0] = o[mi][n][0] * fa[mi][0] + y.x * fb[mi][0];
            o[mi][n][1] = o[mi][n][1] * fa[mi][0] + y.y * fb[mi][0];
            o[mi][n][2] = o[mi][n][2] * fa[mi][1] + y.z * fb[mi][1];
            o[mi][n][3] = o[mi][n][3] * fa[mi][1] + y.w * fb[mi][1];
          }
        }
      };
      __syncthreads();  // every warp is done with the stage's K and V
      if (warp >= 2) {
        put(warp - 2);
        asm volatile("bar.arrive 1, 128;\n" ::: "memory");
      } else {
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
        take(warp);
        if (warp == 1) {
          put(1);  // the same words this lane just read
          asm volatile("bar.arrive 2, 64;\n" ::: "memory");
        } else {
          asm volatile("bar.sync 2, 64;\n" ::: "memory");
          take(1);
        }
      }
    }

    // ---- Warp 0 writes the item's rows (a row without any tile: O 0, LSE -inf or 0).
    if (warp == 0) {
      // The item's row geometry again (L1 hits): fewer registers live through the loop.
      const int4* src = reinterpret_cast<const int4*>(a.items + static_cast<int64_t>(w) * ATTNC_WI_SIZE);
      const int4 lo = __ldg(src);
      const int part = __ldg(reinterpret_cast<const int*>(src) + ATTNC_WI_PART);
      const int kv_head = lo.y;
      const int row0 = lo.z * ROWS;
      const int rows_valid = min(ROWS, q_len * group - row0);
      const int64_t tok_base = static_cast<int64_t>(lo.x) * q_len;
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float lt = quad_sum(l[mi][h]);
          float inv = 1.f;
          float lse = 0.f;
          if constexpr (V::kUseSoftmax) {
            const float mu = safe_max(m[mi][h]);
            inv = lt > 0.f ? 1.f / lt : 0.f;
            lse = lt > 0.f ? (mu + log2f(lt)) * kLn2 : -CUDART_INF_F;
          }
          const int r = mi * 16 + g + 8 * h;
          if (r >= rows_valid) continue;
          const int rr = row0 + r;
          const int token = rr / group;
          const int head = kv_head * group + rr % group;
          if (part >= 0) {
            const int64_t prow =
                (static_cast<int64_t>(part) * q_len + token) * a.num_qo_heads + head;
            float* dst = a.part_o + prow * D + 2 * tq;
#pragma unroll
            for (int n = 0; n < NO; ++n)
              *reinterpret_cast<float2*>(dst + n * 8) =
                  make_float2(o[mi][n][2 * h] * inv, o[mi][n][2 * h + 1] * inv);
            if (tq == 0) a.part_lse[prow] = lse;
          } else {
            const bool visible = !V::kUseSoftmax || inv > 0.f;
            T* dst = static_cast<T*>(a.o) + (tok_base + token) * a.o_stride_tok +
                     static_cast<int64_t>(head) * a.o_stride_head + 2 * tq;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
              float y0 = o[mi][n][2 * h] * inv;
              float y1 = o[mi][n][2 * h + 1] * inv;
              if constexpr (V::kHasOutput) {
                if (visible) {
                  y0 = var.output(rows[mi][h], y0);
                  y1 = var.output(rows[mi][h], y1);
                }
              }
              *reinterpret_cast<uint32_t*>(dst + n * 8) = mma::Dtype<T>::pack(y0, y1);
            }
            if (a.lse != nullptr && tq == 0)
              a.lse[(tok_base + token) * a.num_qo_heads + head] = lse;
          }
        }
      }
    }
  }
  cp_async_wait<0>();
}

// The per-item pipeline (each item fills the pipeline, then combines through shared memory
// with all 128 threads): kept for 32-row tiles and for d=256, where the
// cross-item loop does not fit in 255 registers without spills.
// Offsets of a request's tokens in the paged cache for one KV head.
struct DecodeKvLegacy {
  const int32_t* pages;
  int64_t head_off;
  int64_t stride_page;
  int64_t stride_tok;
  int page_size;

  __device__ __forceinline__ int64_t offset(int kv_idx) const {
    const int page = kv_idx / page_size;
    const int in_page = kv_idx - page * page_size;
    return head_off + static_cast<int64_t>(__ldg(pages + page)) * stride_page +
           static_cast<int64_t>(in_page) * stride_tok;
  }
};

template <class V, class T, class Tile>
__device__ __forceinline__ void decode_item_legacy(const AttncDecodeArgs& a, const V& var,
                                            const int32_t (&item)[ATTNC_WI_SIZE], int q_len,
                                            int kv_len, unsigned char* smem_bytes) {
  constexpr int D = Tile::kHeadDim;
  constexpr int kThreads = Tile::kThreads;
  constexpr int kWarps = Tile::kWarps;
  constexpr int MQ = Tile::kMmaQ;
  constexpr int KVT = Tile::kKvTile;
  constexpr int ROWS = Tile::kRows;
  constexpr int STAGES = Tile::kStages;
  constexpr int KD = D / 16;
  constexpr int NO = D / 8;
  constexpr int CH = D / 8;
  using Layout = SwizzledRows<D>;
  using Row = typename V::Row;

  T* s_q = reinterpret_cast<T*>(smem_bytes);
  T* s_k = s_q + ROWS * D;
  T* s_v = s_k + STAGES * KVT * D;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int tq = lane % 4;

  const int request = item[ATTNC_WI_REQUEST];
  const int kv_head = item[ATTNC_WI_KV_HEAD];
  const int group = a.num_qo_heads / a.num_kv_heads;
  const int row0 = item[ATTNC_WI_ROW_BLOCK] * ROWS;
  const int rows_valid = min(ROWS, q_len * group - row0);
  const int t0 = row0 / group;
  const int t1 = (row0 + rows_valid - 1) / group + 1;
  const int64_t tok_base = static_cast<int64_t>(request) * q_len;
  const float sm_scale = a.sm_scale;

  // ---- Q rows -> shared memory (rows past the item are zero-filled).
  {
    const T* q_ptr = static_cast<const T*>(a.q);
    const int c = tid % CH;
    for (int r = tid / CH; r < ROWS; r += kThreads / CH) {
      const bool ok = r < rows_valid;
      const int rr = row0 + (ok ? r : 0);
      const int64_t off = (tok_base + rr / group) * a.q_stride_tok +
                          static_cast<int64_t>(kv_head * group + rr % group) * a.q_stride_head;
      cp_async_16(mma::smem_addr(s_q) + Layout::offset(r, c), q_ptr + off + c * 8, ok);
    }
    cp_async_commit();
  }

  // ---- This lane's rows: g and g + 8 of each m16 tile.
  Row rows[MQ][2];
  float mult[MQ][2];
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + min(mi * 16 + g + 8 * h, rows_valid - 1);
      rows[mi][h] = var.row(r / group, kv_head * group + r % group);
      mult[mi][h] = V::kAffineScore ? var.score_scale(rows[mi][h]) * sm_scale * kLog2e : 1.f;
    }
  }

  // ---- The chunk's visible KV range and its tiles.
  KvRange range{0, 0};
  if (kv_len > 0) range = var.kv_range(t0, t1);
  range.begin = max(max(range.begin, item[ATTNC_WI_KV_BEGIN]), 0);
  range.end = min(min(range.end, item[ATTNC_WI_KV_END]), kv_len);
  const int num_tiles = range.end > range.begin ? (range.end - range.begin + KVT - 1) / KVT : 0;
  auto tile_class = [&](int t) -> TileClass {
    const int kv0 = range.begin + t * KVT;
    return V::kHasMask ? var.classify(t0, t1, kv0, min(kv0 + KVT, range.end)) : TileClass::kFull;
  };
  auto next_tile = [&](int t) -> int {
    if constexpr (V::kHasMask) {
      while (t < num_tiles && tile_class(t) == TileClass::kEmpty) ++t;
    }
    return t;
  };

  DecodeKvLegacy kv;
  kv.pages = a.page_ids + a.req_page_begin[request];
  kv.head_off = static_cast<int64_t>(kv_head) * a.kv_stride_head;
  kv.stride_page = a.kv_stride_page;
  kv.stride_tok = a.kv_stride_tok;
  kv.page_size = a.page_size;
  const T* k_ptr = static_cast<const T*>(a.k);
  const T* v_ptr = static_cast<const T*>(a.v);
  auto load_tile = [&](int t, int stage) {
    const int kv0 = range.begin + t * KVT;
    const int kv1 = min(kv0 + KVT, range.end);
    T* dk = s_k + stage * KVT * D;
    T* dv = s_v + stage * KVT * D;
    static_assert((KVT * CH) % kThreads == 0, "KV tile chunks must split evenly over threads");
    const int c = tid % CH;
#pragma unroll
    for (int it = 0; it < KVT * CH / kThreads; ++it) {
      const int r = tid / CH + it * (kThreads / CH);
      const bool ok = kv0 + r < kv1;
      const int64_t off = ok ? kv.offset(kv0 + r) : 0;
      const int s = Layout::offset(r, c);
      cp_async_16(mma::smem_addr(dk) + s, k_ptr + off + c * 8, ok);
      cp_async_16(mma::smem_addr(dv) + s, v_ptr + off + c * 8, ok);
    }
  };

  int t_load = next_tile(0);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (t_load < num_tiles) {
      load_tile(t_load, s);
      t_load = next_tile(t_load + 1);
    }
    cp_async_commit();
  }

  float o[MQ][NO][4];
  float m[MQ][2];
  float l[MQ][2];
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mi][n][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mi][h] = -CUDART_INF_F;
      l[mi][h] = 0.f;
    }
  }

  const int wkv = warp * Tile::kWarpKv;  // this warp's first token inside a tile
  int stage = 0;
  for (int t = next_tile(0); t < num_tiles; t = next_tile(t + 1)) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      int fill = stage + STAGES - 1;
      if (fill >= STAGES) fill -= STAGES;
      if (t_load < num_tiles) {
        load_tile(t_load, fill);
        t_load = next_tile(t_load + 1);
      }
      cp_async_commit();
    }
    const int kv0 = range.begin + t * KVT + wkv;
    const int kv1 = min(range.begin + t * KVT + KVT, range.end);
    if (kv0 >= kv1) {
      stage = stage + 1 == STAGES ? 0 : stage + 1;
      continue;  // this warp's 16 tokens are past the range (last tile)
    }
    const T* sk = s_k + stage * KVT * D;
    const T* sv = s_v + stage * KVT * D;
    const TileClass cls = tile_class(t);

    // S = Q K^T for this warp's 16 tokens: two n8 blocks.
    float s[MQ][2][4];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t b[4];
      const int rk = wkv + (lane % 8) + 8 * (lane / 16);
      mma::ldmatrix_x4(b, mma::smem_addr(sk) + Layout::offset(rk, kk * 2 + (lane / 8) % 2));
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
        uint32_t qa[4];
        const int rq = mi * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
        mma::ldmatrix_x4(qa, mma::smem_addr(s_q) + Layout::offset(rq, kk * 2 + lane / 16));
        mma::mma_16816<T>(s[mi][0], qa, b[0], b[1]);
        mma::mma_16816<T>(s[mi][1], qa, b[2], b[3]);
      }
    }

    // Scores -> weights (log2 domain for softmax variants).
    const bool need_mask = cls == TileClass::kPartial;
    const bool need_bound = kv1 - kv0 < Tile::kWarpKv;
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Row& row = rows[mi][h];
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int kv_idx = kv0 + n * 8 + 2 * tq + e;
            bool vis = true;
            if (need_bound) vis = kv_idx < kv1;
            if (V::kHasMask && need_mask) vis = vis && var.mask(row, kv_idx);
            const float raw = s[mi][n][2 * h + e];
            float x;
            if constexpr (!V::kUseSoftmax) {
              x = vis ? var.score(row, raw * sm_scale, kv_idx) : 0.f;
            } else if constexpr (V::kScoreIsIdentity) {
              x = vis ? raw * mult[mi][h] : -CUDART_INF_F;
            } else if constexpr (V::kAffineScore) {
              x = vis ? fmaf(raw, mult[mi][h], var.score_bias(row, kv_idx) * kLog2e)
                      : -CUDART_INF_F;
            } else {
              x = vis ? var.score(row, raw * sm_scale, kv_idx) * kLog2e : -CUDART_INF_F;
            }
            s[mi][n][2 * h + e] = x;
            mx = fmaxf(mx, x);
          }
        }
        if constexpr (V::kUseSoftmax) {
          const float m_new = fmaxf(m[mi][h], quad_max(mx));
          const float m_use = safe_max(m_new);
          const float alpha = fast_exp2(m[mi][h] - m_use);
          m[mi][h] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float p = fast_exp2(s[mi][n][2 * h + e] - m_use);
              s[mi][n][2 * h + e] = p;
              sum += p;
            }
          }
          l[mi][h] = l[mi][h] * alpha + sum;
#pragma unroll
          for (int n = 0; n < NO; ++n) {
            o[mi][n][2 * h] *= alpha;
            o[mi][n][2 * h + 1] *= alpha;
          }
        }
      }
    }

    // O += P V with P from registers.
    uint32_t pa[MQ][4];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
      pa[mi][0] = mma::Dtype<T>::pack(s[mi][0][0], s[mi][0][1]);
      pa[mi][1] = mma::Dtype<T>::pack(s[mi][0][2], s[mi][0][3]);
      pa[mi][2] = mma::Dtype<T>::pack(s[mi][1][0], s[mi][1][1]);
      pa[mi][3] = mma::Dtype<T>::pack(s[mi][1][2], s[mi][1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < NO / 2; ++dn) {
      uint32_t b[4];
      const int rv = wkv + (lane % 8) + 8 * ((lane / 8) % 2);
      mma::ldmatrix_x4_trans(b, mma::smem_addr(sv) + Layout::offset(rv, dn * 2 + lane / 16));
#pragma unroll
      for (int mi = 0; mi < MQ; ++mi) {
        mma::mma_16816<T>(o[mi][2 * dn], pa[mi], b[0], b[1]);
        mma::mma_16816<T>(o[mi][2 * dn + 1], pa[mi], b[2], b[3]);
      }
    }
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the combine buffers

  // ---- Combine the warps' states (fixed order).
  float* c_o = reinterpret_cast<float*>(smem_bytes);       // [warps][ROWS][D]
  float* c_m = c_o + kWarps * ROWS * D;                    // [warps][ROWS]
  float* c_l = c_m + kWarps * ROWS;                        // [warps][ROWS]
  float* c_f = c_l + kWarps * ROWS;                        // [warps][ROWS] factors
  float* c_inv = c_f + kWarps * ROWS;                      // [ROWS]
  float* c_lse = c_inv + ROWS;                             // [ROWS]
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mi * 16 + g + 8 * h;
      float* dst = c_o + (warp * ROWS + r) * D + 2 * tq;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[mi][n][2 * h], o[mi][n][2 * h + 1]);
      }
      const float lsum = quad_sum(l[mi][h]);
      if (tq == 0) {
        c_m[warp * ROWS + r] = m[mi][h];
        c_l[warp * ROWS + r] = lsum;
      }
    }
  }
  __syncthreads();
  if (tid < ROWS) {
    const int r = tid;
    if constexpr (V::kUseSoftmax) {
      float mt = -CUDART_INF_F;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mt = fmaxf(mt, c_m[w * ROWS + r]);
      const float mu = safe_max(mt);
      float lt = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(c_m[w * ROWS + r] - mu);
        c_f[w * ROWS + r] = f;
        lt += c_l[w * ROWS + r] * f;
      }
      c_inv[r] = lt > 0.f ? 1.f / lt : 0.f;
      c_lse[r] = lt > 0.f ? (mu + log2f(lt)) * kLn2 : -CUDART_INF_F;
    } else {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) c_f[w * ROWS + r] = 1.f;
      c_inv[r] = 1.f;
      c_lse[r] = 0.f;
    }
  }
  __syncthreads();

  const int part = item[ATTNC_WI_PART];
  constexpr int C4 = D / 4;
  for (int i = tid; i < ROWS * C4; i += kThreads) {
    const int r = i / C4;
    const int col = (i - r * C4) * 4;
    if (r >= rows_valid) continue;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = c_f[w * ROWS + r];
      const float4 x = *reinterpret_cast<const float4*>(c_o + (w * ROWS + r) * D + col);
      acc[0] += f * x.x;
      acc[1] += f * x.y;
      acc[2] += f * x.z;
      acc[3] += f * x.w;
    }
    const float inv = c_inv[r];
    const int rr = row0 + r;
    const int token = rr / group;
    const int head = kv_head * group + rr % group;
    if (part >= 0) {
      const int64_t prow =
          (static_cast<int64_t>(part) * q_len + token) * a.num_qo_heads + head;
      *reinterpret_cast<float4*>(a.part_o + prow * D + col) =
          make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      if (col == 0) a.part_lse[prow] = c_lse[r];
    } else {
      const bool visible = !V::kUseSoftmax || inv > 0.f;
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) y[e] = acc[e] * inv;
      if constexpr (V::kHasOutput) {
        if (visible) {
          const Row row = var.row(token, head);
#pragma unroll
          for (int e = 0; e < 4; ++e) y[e] = var.output(row, y[e]);
        }
      }
      T* dst = static_cast<T*>(a.o) + (tok_base + token) * a.o_stride_tok +
               static_cast<int64_t>(head) * a.o_stride_head + col;
      uint2 packed;
      packed.x = mma::Dtype<T>::pack(y[0], y[1]);
      packed.y = mma::Dtype<T>::pack(y[2], y[3]);
      *reinterpret_cast<uint2*>(dst) = packed;
      if (a.lse != nullptr && col == 0)
        a.lse[(tok_base + token) * a.num_qo_heads + head] = c_lse[r];
    }
  }
  __syncthreads();  // the next item reuses shared memory
}

template <class V, class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    decode_kernel(const AttncDecodeArgs a, const typename V::Params params) {
  static_assert(VariantContract<V>::ok, "");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  if constexpr (Tile::kLegacy) {
    const int q_len = a.header[ATTNC_DH_Q_LEN];
    const int begin = a.cta_indptr[blockIdx.x];
    const int end = a.cta_indptr[blockIdx.x + 1];
    for (int w = begin; w < end; ++w) {
      int32_t item[ATTNC_WI_SIZE];
      const int4* src =
          reinterpret_cast<const int4*>(a.items + static_cast<int64_t>(w) * ATTNC_WI_SIZE);
      const int4 lo = src[0];
      const int4 hi = src[1];
      item[0] = lo.x; item[1] = lo.y; item[2] = lo.z; item[3] = lo.w;
      item[4] = hi.x; item[5] = hi.y; item[6] = hi.z; item[7] = hi.w;
      const int request = item[ATTNC_WI_REQUEST];
      const int kv_len = a.req_kv_len[request];
      const V var(params, RequestInfo{request, q_len, kv_len, a.num_qo_heads, a.num_kv_heads,
                                      Tile::kHeadDim, a.sm_scale});
      decode_item_legacy<V, T, Tile>(a, var, item, q_len, kv_len, smem_bytes);
    }
  } else {
    decode_cta<V, T, Tile>(a, params, smem_bytes);
  }
}

// One warp per (split request, token, head) row: merges the request's partial states in
// chunk order, applies V::output and writes O (and LSE).
template <class V, class T, int HEAD_DIM>
__global__ void __launch_bounds__(128)
    decode_merge_kernel(const AttncDecodeArgs a, const typename V::Params params) {
  constexpr int kWarps = 4;
  const int q_len = a.header[ATTNC_DH_Q_LEN];
  const int total = a.header[ATTNC_DH_MERGE_ROWS];
  const int per_req = q_len * a.num_qo_heads;
  const int lane = threadIdx.x % 32;
  for (int row = blockIdx.x * kWarps + threadIdx.x / 32; row < total;
       row += gridDim.x * kWarps) {
    const int mi = row / per_req;
    const int rem = row - mi * per_req;
    const int token = rem / a.num_qo_heads;
    const int head = rem - token * a.num_qo_heads;
    const int32_t* me = a.merge_items + mi * ATTNC_MI_SIZE;
    const int request = me[ATTNC_MI_REQUEST];
    const int chunks = me[ATTNC_MI_NUM_CHUNKS];
    const int base = me[ATTNC_MI_PART_BASE];
    auto row_of = [&](int c) -> int64_t {
      return (static_cast<int64_t>(base + c) * q_len + token) * a.num_qo_heads + head;
    };
    const V var(params, RequestInfo{request, q_len, a.req_kv_len[request], a.num_qo_heads,
                                    a.num_kv_heads, HEAD_DIM, a.sm_scale});
    const int64_t orow = static_cast<int64_t>(request) * q_len + token;
    T* dst = static_cast<T*>(a.o) + orow * a.o_stride_tok +
             static_cast<int64_t>(head) * a.o_stride_head;
    const float lse = warp_merge_row<V, T, HEAD_DIM>(a.part_o, a.part_lse, chunks, row_of, var,
                                                     var.row(token, head), dst, lane);
    if (a.lse != nullptr && lane == 0) a.lse[orow * a.num_qo_heads + head] = lse;
  }
}

}  // namespace attnc
