// Owns: where a request's K/V rows live in device memory for the three KV layouts of
// prefill_args.h (ragged, paged NHD, paged HND): the request's kv_len and the element offset
// of row kv_idx of one KV head (the same offset serves the K and the V tensor).
#pragma once

#include <stdint.h>

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

}  // namespace attnc
