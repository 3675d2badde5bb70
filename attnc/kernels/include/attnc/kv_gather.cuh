// Owns: where a request's K/V rows live in device memory for the three KV layouts of
// prefill_args.h (ragged, paged NHD, paged HND): the request's kv_len and the element offset
// of row kv_idx of one KV head (the same offset serves the K and the V tensor). Strides,
// page size and layout are read from the kernel's argument struct (constant memory), so a
// KvRows keeps only three registers' worth of per-request state.
#pragma once

#include <stdint.h>

#include "prefill_args.h"

namespace attnc {

struct KvRows {
  int64_t base;    // ragged: offset of the request's first token and head; paged: head offset
  int page_begin;  // paged: index of the request's first page in kv_indices
  int kv_len;

  __device__ __forceinline__ static KvRows make(const AttncPrefillArgs& a, int request,
                                                int kv_head) {
    KvRows r;
    const int begin = a.kv_indptr[request];
    const int end = a.kv_indptr[request + 1];
    r.page_begin = begin;
    if (a.kv_layout == ATTNC_KV_RAGGED) {
      r.kv_len = end - begin;
      r.base = static_cast<int64_t>(begin) * a.kv_stride_tok +
               static_cast<int64_t>(kv_head) * a.kv_stride_head;
    } else {
      const int pages = end - begin;
      r.kv_len = pages > 0 ? (pages - 1) * a.page_size + a.kv_last_page_len[request] : 0;
      r.base = static_cast<int64_t>(kv_head) * a.kv_stride_head;
    }
    return r;
  }

  // Element offset of token kv_idx (0 <= kv_idx < kv_len) of this request and head.
  __device__ __forceinline__ int64_t offset(const AttncPrefillArgs& a, int kv_idx) const {
    if (a.kv_layout == ATTNC_KV_RAGGED)
      return base + static_cast<int64_t>(kv_idx) * a.kv_stride_tok;
    const int page = kv_idx / a.page_size;
    const int in_page = kv_idx - page * a.page_size;
    return base + static_cast<int64_t>(a.kv_indices[page_begin + page]) * a.kv_stride_page +
           static_cast<int64_t>(in_page) * a.kv_stride_tok;
  }
};

}  // namespace attnc
