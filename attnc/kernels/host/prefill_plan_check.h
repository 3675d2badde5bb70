// Owns: the host prefill planner's validation of the batch description (the int32 indptrs,
// page ids and last-page lengths, the checks of runtime/checks/tensors.py and limits.py) and
// the per-request lengths it derives. A failed check returns ATTNC_PLAN_INVALID only: the
// caller names the problem with the Python checks, whose words it keeps.
#pragma once
#include <stdint.h>

#include <algorithm>

#include "page_table_check.h"
#include "prefill_plan_abi.h"

namespace attnc {
namespace prefill_plan {

// Most query or KV tokens of one request: int32 less a margin for the kernels' tile
// arithmetic (MAX_QUERY_TOKENS and MAX_KV_TOKENS in attnc/dsl/limits.py; the decode
// planner's kMaxKvLen is the same number).
constexpr int64_t kMaxRequestTokens = (INT64_C(1) << 31) - (INT64_C(1) << 16);

// An indptr: at least one entry, starting at 0, non-decreasing.
inline bool indptr_ok(const int32_t* v, int64_t n) {
  if (n < 1 || v[0] != 0) return false;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] < v[i - 1]) return false;
  return true;
}

// The page table of a paged batch (r->nnz already set): enough non-negative page ids,
// last-page lengths in [1, page_size] for requests with pages (their KV tokens are checked
// against kMaxRequestTokens with the other lengths, in check_batch).
inline bool page_table_ok(const AttncPrefillParams& p, AttncPrefillResult* r) {
  if (p.page_size < 1 || p.num_indices < r->nnz || p.num_last != p.batch) return false;
  int64_t max_page = -1;
  for (int64_t i = 0; i < r->nnz; ++i) {
    if (p.kv_indices[i] < 0) return false;
    max_page = std::max<int64_t>(max_page, p.kv_indices[i]);
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t pages = p.kv_indptr[b + 1] - p.kv_indptr[b], last = p.kv_last_page_len[b];
    if (pages > 0 && (last < 1 || last > p.page_size)) return false;
  }
  r->max_page = max_page;
  return true;
}

// Check the batch and write q_lens / kv_lens ([batch] each) and the totals into ``r``.
inline int check_batch(AttncPrefillParams& p, AttncPrefillResult* r) {
  *r = AttncPrefillResult{};
  r->max_page = -1;
  if (!indptr_ok(p.qo_indptr, p.qo_len) || !indptr_ok(p.kv_indptr, p.kv_len)) {
    return ATTNC_PLAN_INVALID;
  }
  if (p.kv_len != p.qo_len) return ATTNC_PLAN_INVALID;
  p.batch = p.qo_len - 1;
  r->nnz = p.kv_indptr[p.batch];
  if (p.kv_indices != nullptr && !page_table_ok(p, r)) return ATTNC_PLAN_INVALID;
  if (p.lens_cap < p.batch) {
    r->error = ATTNC_PP_OUT_BUFFER, r->needed_bytes = 8 * p.batch;
    return ATTNC_PLAN_CAPACITY;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t q = p.qo_indptr[b + 1] - p.qo_indptr[b];
    const int64_t k = p.kv_indptr[b + 1] - p.kv_indptr[b];
    p.q_lens[b] = q;
    // ragged: kv_indptr counts tokens
    p.kv_lens[b] = p.kv_indices == nullptr
                       ? k
                       : page_table::paged_kv_len(k, p.page_size, p.kv_last_page_len[b]);
    if (q > kMaxRequestTokens || p.kv_lens[b] > kMaxRequestTokens) return ATTNC_PLAN_INVALID;
    r->total_kv += p.kv_lens[b];
    r->max_q = std::max(r->max_q, q);
  }
  r->total_q = p.qo_indptr[p.batch];
  return ATTNC_PLAN_OK;
}

}  // namespace prefill_plan
}  // namespace attnc
