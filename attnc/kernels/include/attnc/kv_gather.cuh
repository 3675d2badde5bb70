// Owns: where a request's K/V rows live in device memory for the three KV layouts of
// prefill_args.h (ragged, paged NHD, paged HND): the request's kv_len and the element offset
// of row kv_idx of one KV head (the same offset serves the K and the V tensor), and the
// per-thread cursor the prefill pipeline uses to address the rows it copies for a tile.
#pragma once

#include <stdint.h>

#include "fast_divmod.cuh"
#include "page_check.cuh"
#include "prefill_args.h"

namespace attnc {

struct KvRows {
  const int32_t* page_ids;  // paged: this request's pages; ragged: NULL
  int64_t base;             // ragged: first token of the request and head; paged: head offset
  int64_t stride_tok;
  int64_t stride_page;
  int page_size;
  int kv_len;

  __device__ __forceinline__ static KvRows make(const AttncPrefillArgs& a, int request,
                                                int kv_head) {
    KvRows r;
    const int begin = a.kv_indptr[request];
    const int end = a.kv_indptr[request + 1];
    r.stride_tok = a.kv_stride_tok;
    r.stride_page = a.kv_stride_page;
    if (a.kv_layout == ATTNC_KV_RAGGED) {
      r.page_ids = nullptr;
      r.page_size = 1;
      r.kv_len = end - begin;
      r.base = static_cast<int64_t>(begin) * a.kv_stride_tok +
               static_cast<int64_t>(kv_head) * a.kv_stride_head;
    } else {
      r.page_ids = a.kv_indices + begin;
      r.page_size = a.page_size;
      const int pages = end - begin;
      r.kv_len = pages > 0 ? (pages - 1) * a.page_size + a.kv_last_page_len[request] : 0;
      r.base = static_cast<int64_t>(kv_head) * a.kv_stride_head;
    }
    return r;
  }

  // Element offset of token kv_idx (0 <= kv_idx < kv_len) of this request and head.
  __device__ __forceinline__ int64_t offset(int kv_idx) const {
    if (page_ids == nullptr) return base + static_cast<int64_t>(kv_idx) * stride_tok;
    const int page = kv_idx / page_size;
    const int in_page = kv_idx - page * page_size;
    return base + static_cast<int64_t>(page_ids[page]) * stride_page +
           static_cast<int64_t>(in_page) * stride_tok;
  }
};

// The rows one thread copies for every KV tile: rows row0 + it * kRowStep (it < kIters) of the
// tile, chunk `chunk` of each. Holds only the byte address of the thread's first chunk in K,
// the request index and the page divisor's multiplier in registers; strides and the K/V base
// pointers are read from the kernel arguments (constant bank, uniform registers) where used.
// A tile costs one multiply-add (ragged) or one page lookup per row (paged), a row one 64-bit
// add (ragged).
template <int kIters, int kRowStep>
struct KvTileCursor {
  const char* k_thread;  // ragged: &K[base + row0 * stride_tok + chunk * 8]; paged: &K[base + chunk * 8]
  uint32_t div_mul;      // paged: FastDiv multiplier of page_size (shift: ceil(log2))
  int request;
  int row0;

  template <class T>
  __device__ __forceinline__ static KvTileCursor make(const AttncPrefillArgs& a,
                                                      const KvRows& kv, int request, int row0,
                                                      int chunk) {
    KvTileCursor c;
    const bool paged = kv.page_ids != nullptr;
    c.request = request;
    c.div_mul = FastDiv::make(paged ? a.page_size : 1).mul;
    c.row0 = row0;
    const int64_t el =
        kv.base + chunk * 8 + (paged ? 0 : static_cast<int64_t>(row0) * a.kv_stride_tok);
    c.k_thread = reinterpret_cast<const char*>(static_cast<const T*>(a.k) + el);
    return c;
  }

  template <class T>
  __device__ __forceinline__ static int64_t v_minus_k(const AttncPrefillArgs& a) {
    return reinterpret_cast<const char*>(a.v) - reinterpret_cast<const char*>(a.k);
  }

  // Calls f(it, src, valid) for this thread's rows of the tile starting at token kv0, src the K
  // source address of the row; rows at or past kv_end (only when !kAllValid) and paged rows
  // whose page id is outside [0, a.num_pages) get valid = false and the address of the
  // thread's first row (never read: zero-filled). Returns whether a row had such a page id
  // (each one is reported into a.page_status, page_check.cuh).
  template <class T, bool kAllValid, class F>
  __device__ __forceinline__ bool for_rows(const AttncPrefillArgs& a, int kv0, int kv_end,
                                           F&& f) const {
    const int64_t tok_bytes = a.kv_stride_tok * static_cast<int64_t>(sizeof(T));
    if (a.kv_layout == ATTNC_KV_RAGGED) {
      const char* p = k_thread + static_cast<int64_t>(kv0) * tok_bytes;
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const bool valid = kAllValid || kv0 + row0 + it * kRowStep < kv_end;
        f(it, valid ? p : k_thread, valid);
        p += kRowStep * tok_bytes;
      }
      return false;
    } else {
      const int32_t* page_ids = a.kv_indices + a.kv_indptr[request];
      const uint32_t div_shift = a.page_size > 1 ? 32 - __clz(a.page_size - 1) : 0;
      const int64_t page_bytes = a.kv_stride_page * static_cast<int64_t>(sizeof(T));
      // At most 8 page lookups in flight at a time (registers).
      constexpr int kUnroll = kIters <= 8 ? kIters : 4;
      bool bad_tile = false;
      int bad_id = 0;
#pragma unroll kUnroll
      for (int it = 0; it < kIters; ++it) {
        const int idx = kv0 + row0 + it * kRowStep;
        const bool valid = kAllValid || idx < kv_end;
        const int j = valid ? idx : 0;
        const int page =
            static_cast<int>((__umulhi(div_mul, static_cast<uint32_t>(j)) + j) >> div_shift);
        const int in_page = j - page * a.page_size;
        const int id = page_ids[page];
        const bool bad = valid && page_id_bad(id, a.num_pages);
        bad_tile |= bad;
        bad_id = bad ? id : bad_id;
        f(it,
          bad ? k_thread
              : k_thread + static_cast<int64_t>(id) * page_bytes +
                    static_cast<int64_t>(in_page) * tok_bytes,
          valid && !bad);
      }
      if (bad_tile) report_bad_page(a.page_status, request, bad_id);
      return bad_tile;
    }
  }
};

}  // namespace attnc
