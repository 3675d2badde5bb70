// Owns: the load side of the decode pipeline: the walk over the (work item, visible KV tile)
// sequence of a CTA, gathering each tile's K and V rows from the pages with 16-byte cp.async
// copies into swizzled shared-memory stages (page ids fetched a tile ahead where the tile
// shape leaves registers for them) and each item's packed Q rows into its Q slot.
// Every thread of the CTA runs the loader in lock step with the compute side (decode_kernel.cuh).
// Page ids are range-checked where they are used (page_check.cuh): a row whose id is outside
// [0, num_pages) is zero-filled instead of read, the id reported, and the shared flag of the
// item's Q slot set (decode_bad_page_flag); at the item's end the CTA reads and clears it
// (decode_kernel.cuh) and the item's rows are NaN.
#pragma once

#include <stdint.h>

#include "cp_async.cuh"
#include "decode_args.h"
#include "decode_item.cuh"
#include "mma.cuh"
#include "page_check.cuh"
#include "smem_layout.cuh"

namespace attnc {

// One flag per Q slot (Tile::kQSlots <= kDecodeMaxQSlots): nonzero when a loaded row of the
// slot's current item had a bad page id. In shared memory so the main loop carries no
// register for it (the 32-row shapes have none to spare).
constexpr int kDecodeMaxQSlots = 4;
static __shared__ uint32_t decode_bad_page_flag[kDecodeMaxQSlots];

// ATTNC_DECODE_L2_HINT: 0, 128 or 256: L2 prefetch size hint on the K/V cp.async copies.
#ifndef ATTNC_DECODE_L2_HINT
#define ATTNC_DECODE_L2_HINT 0
#endif

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

// Loader state of one thread. Tile::kCrossItem: the loader walks ahead into the CTA's next
// items and keeps its own copy of the item it loads (`item`); otherwise the compute side
// restarts it at every item (start_item) and passes its item to issue().
template <class V, class T, class Tile>
struct DecodeLoader {
  static constexpr int D = Tile::kHeadDim;
  static constexpr int CH = D / 8;  // 16-byte chunks per row
  static constexpr int NIT = Tile::kCopiesPerThread;
  static constexpr int kRowStep = Tile::kThreads / CH;
  static constexpr int KVT = Tile::kKvTile;
  static constexpr int ROWS = Tile::kRows;
  using Layout = SwizzledRows<D>;

  const AttncDecodeArgs& a;
  const typename V::Params& params;
  uint32_t s_q, s_k, s_v;  // shared addresses of the Q slots, K stages, V stages
  int w_end, q_len, group, page_size, page_shift;
  int c_ld;  // this thread's 16-byte chunk of a row
  int r_ld;  // its first row of a tile (then every kRowStep rows)

  DecodeItem item{};     // the item being loaded (Tile::kCrossItem only)
  int w = 0;             // its index in the work list
  int t = 0;             // its next tile
  int stage = 0;         // stage of the next tile
  int qcount = 0;        // items with tiles opened so far (Q slot = count % kQSlots)
  int qslot = 0;         // Q slot of the item being loaded
  bool active = false;   // a tile is ready to issue
  bool first = false;    // that tile is the item's first: load Q with it
  const int32_t* pages = nullptr;
  int64_t head_off = 0;
  int pid[Tile::kPrefetchPageIds ? NIT : 1];  // page ids of the next tile's rows

  __device__ __forceinline__ int page_of(int kv) const {
    return page_shift >= 0 ? kv >> page_shift : kv / page_size;
  }

  __device__ __forceinline__ void load_page_ids(const DecodeItem& li) {
    if constexpr (Tile::kPrefetchPageIds) {
      const int kv0 = li.begin + t * KVT;
      const int kv1 = min(kv0 + KVT, li.end);
#pragma unroll
      for (int i = 0; i < NIT; ++i) {
        const int kv = kv0 + r_ld + i * kRowStep;
        pid[i] = kv < kv1 ? __ldg(pages + page_of(kv)) : 0;
      }
    }
  }

  // The item's packed Q rows into its Q slot (cp.async, rows past the item zero-filled).
  __device__ __forceinline__ void load_q(const DecodeItem& li) const {
    const T* q_ptr = static_cast<const T*>(a.q);
    const int64_t tok_base = static_cast<int64_t>(li.request) * q_len;
    const uint32_t sq = s_q + qslot * ROWS * Layout::kRowBytes;
    for (int r = r_ld; r < ROWS; r += kRowStep) {
      const bool ok = r < li.rows_valid;
      const int rr = li.row0 + (ok ? r : 0);
      const int64_t off = (tok_base + rr / group) * a.q_stride_tok +
                          static_cast<int64_t>(li.kv_head * group + rr % group) * a.q_stride_head;
      cp_async_16(sq + Layout::offset(r, c_ld), q_ptr + off + c_ld * 8, ok);
    }
  }

  // Starts loading item wi (already read into `li`) at its first visible tile ti.
  __device__ __forceinline__ void start_item(int wi, const DecodeItem& li, int ti) {
    if constexpr (Tile::kCrossItem) item = li;
    w = wi;
    t = ti;
    active = true;
    first = true;
    qslot = qcount % Tile::kQSlots;
    ++qcount;
    pages = a.page_ids + __ldg(a.req_page_begin + li.request);
    head_off = static_cast<int64_t>(li.kv_head) * a.kv_stride_head;
    load_page_ids(li);
    if constexpr (!Tile::kCrossItem) load_q(li);  // the slot is free: the last item is done
  }

  // Opens the first item in [wi, w_end) that has a visible tile (none: the loader stops).
  __device__ __forceinline__ void open(int wi) {
    active = false;
    for (; wi < w_end; ++wi) {
      const DecodeItem li = decode_open_item<V, ROWS, KVT, D>(a, params, wi, q_len, group);
      const V lv(params, decode_request_info<D>(a, li, q_len));
      const int ti = decode_next_tile<V, KVT>(lv, li, 0);
      if (ti < li.num_tiles) {
        start_item(wi, li, ti);
        return;
      }
    }
  }

  // Issues the next tile of `li` (the loader's own item with kCrossItem) into its stage and
  // moves on to the next visible tile (with kCrossItem: into the next items).
  __device__ __forceinline__ void issue(const DecodeItem& li);

  // Issues the first Tile::kStages - 1 tiles, one cp.async group each (not unrolled: at
  // 32 rows the unrolled copies cost the registers of the accumulators).
  __device__ __forceinline__ void prime(const DecodeItem& li) {
#pragma unroll 1
    for (int s = 0; s < Tile::kStages - 1; ++s) {
      issue(li);
      cp_async_commit();
    }
  }
};

template <class V, class T, class Tile>
__device__ __forceinline__ void DecodeLoader<V, T, Tile>::issue(const DecodeItem& li) {
  constexpr int kIssueUnroll = Tile::kPrefetchPageIds ? NIT : 2;
  if (!active) return;
  if (Tile::kCrossItem && first) {
    first = false;
    load_q(li);
  }
  const T* k_ptr = static_cast<const T*>(a.k);
  const T* v_ptr = static_cast<const T*>(a.v);
  const int kv0 = li.begin + t * KVT;
  const int kv1 = min(kv0 + KVT, li.end);
  const uint32_t dk = s_k + stage * KVT * Layout::kRowBytes;
  const uint32_t dv = s_v + stage * KVT * Layout::kRowBytes;
  const int num_pages = a.num_pages;
  bool bad_tile = false;  // a row's page id was outside [0, num_pages): never dereferenced
  int bad_id = 0;
#pragma unroll kIssueUnroll
  for (int i = 0; i < NIT; ++i) {
    const int r = r_ld + i * kRowStep;
    const int kv = kv0 + r;
    const bool in_range = kv < kv1;
    const int page = page_of(kv);
    const int in_page = kv - page * page_size;
    int id = 0;
    if constexpr (Tile::kPrefetchPageIds) {
      id = pid[i];
    } else {
      id = in_range ? __ldg(pages + page) : 0;
    }
    const bool bad = in_range && page_id_bad(id, num_pages);
    bad_tile |= bad;  // reported once after the loop: no branch among the copies
    bad_id = bad ? id : bad_id;
    const bool ok = in_range && !bad;
    const int64_t off = ok ? head_off + static_cast<int64_t>(id) * a.kv_stride_page +
                                 static_cast<int64_t>(in_page) * a.kv_stride_tok
                           : 0;
    const uint32_t s = Layout::offset(r, c_ld);
    decode_cp_async_16(dk + s, k_ptr + off + c_ld * 8, ok);
    decode_cp_async_16(dv + s, v_ptr + off + c_ld * 8, ok);
  }
  if (bad_tile) {  // the rows were zero-filled
    decode_bad_page_flag[qslot] = 1;
    report_bad_page(a.page_status, li.request, bad_id);
  }
  stage = stage + 1 == Tile::kStages ? 0 : stage + 1;
  const V lv(params, decode_request_info<D>(a, li, q_len));
  t = decode_next_tile<V, KVT>(lv, li, t + 1);
  if (t < li.num_tiles) {
    load_page_ids(li);
  } else if constexpr (Tile::kCrossItem) {
    open(w + 1);
  } else {
    active = false;
  }
}

}  // namespace attnc
