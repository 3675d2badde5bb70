// Owns: the host prefill planner's validation of the batch description (the int32 indptrs,
// page ids and last-page lengths) and the per-request lengths it derives. The checks run in
// the order of the Python ones (runtime/wrappers/prefill_batch.py check_indices, which still
// checks arguments the planner does not take), so the same error wins when several parts are
// wrong; a failed check is ATTNC_PLAN_INVALID with its ATTNC_PT_* code and where in the
// result (Python words it: runtime/checks/page_table.py planner_error).
#pragma once
#include <stdint.h>

#include <algorithm>

#include "page_table_check.h"
#include "prefill_plan_abi.h"

namespace attnc {
namespace prefill_plan {

// Tokens of request b of a checked indptr.
inline int64_t span(const int32_t* indptr, int64_t b) {
  return int64_t(indptr[b + 1]) - indptr[b];
}

// Request b's KV tokens: kv_indptr counts tokens (ragged) or pages (paged).
inline int64_t kv_tokens(const AttncPrefillParams& p, int64_t b) {
  const int64_t k = span(p.kv_indptr, b);
  return p.kv_indices == nullptr ? k
                                 : page_table::paged_kv_len(k, p.page_size, p.kv_last_page_len[b]);
}

// The checks, in order: qo_indptr, kv_indptr (page_table::indptr_ok each), their equal entry
// counts, every request's query tokens within the limit, then for paged KV the page table
// (page_table::check_page_table, ids first), then every request's KV tokens within the limit
// (for each limit, the longest request is reported). p.batch and r->nnz, r->max_page are set
// on the way.
inline bool batch_ok(AttncPrefillParams& p, AttncPrefillResult* r, page_table::Fault* f) {
  using page_table::fail;
  if (!page_table::indptr_ok(p.qo_indptr, p.qo_len, page_table::kQoIndptr, f) ||
      !page_table::indptr_ok(p.kv_indptr, p.kv_len, page_table::kKvIndptr, f))
    return false;
  if (p.kv_len != p.qo_len) return fail(f, ATTNC_PT_INDPTR_COUNT, 0, p.kv_len, p.qo_len);
  p.batch = p.qo_len - 1;
  r->nnz = p.kv_indptr[p.batch];
  int64_t most;
  const auto q_tokens = [&](int64_t b) { return span(p.qo_indptr, b); };
  const int64_t q_at = page_table::longest_over_limit(p.batch, q_tokens, &most);
  if (q_at >= 0) return fail(f, ATTNC_PT_QUERY_TOKENS, q_at, most, 0);
  if (p.kv_indices != nullptr) {
    const page_table::Table t{p.kv_indptr, p.batch, p.kv_last_page_len, p.num_last,
                              p.kv_indices, p.num_indices, p.page_size, INT64_MAX, INT64_MAX,
                              /*scan_ids=*/true, /*ids_first=*/true};
    if (!page_table::check_page_table(t, f, &r->max_page)) return false;
  }
  const auto kv = [&](int64_t b) { return kv_tokens(p, b); };
  const int64_t kv_at = page_table::longest_over_limit(p.batch, kv, &most);
  if (kv_at < 0) return true;
  const int64_t pages = p.kv_indices == nullptr ? -1 : span(p.kv_indptr, kv_at);
  return fail(f, ATTNC_PT_KV_TOKENS, kv_at, most, pages);
}

// Check the batch and write q_lens / kv_lens ([batch] each) and the totals into ``r``.
// ATTNC_PLAN_OUT_OF_RANGE: a paged batch with page_size < 1 (the Python side refuses it
// first, naming page_size).
inline int check_batch(AttncPrefillParams& p, AttncPrefillResult* r) {
  *r = AttncPrefillResult{};
  r->max_page = -1;
  if (p.kv_indices != nullptr && p.page_size < 1) return ATTNC_PLAN_OUT_OF_RANGE;
  page_table::Fault f;
  if (!batch_ok(p, r, &f)) {
    r->error = f.error, r->index = f.index, r->value = f.value, r->value2 = f.value2;
    return ATTNC_PLAN_INVALID;
  }
  if (p.lens_cap < p.batch) {
    r->error = ATTNC_PP_OUT_BUFFER, r->needed_bytes = 8 * p.batch;
    return ATTNC_PLAN_CAPACITY;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    p.q_lens[b] = span(p.qo_indptr, b);
    p.kv_lens[b] = kv_tokens(p, b);
    r->total_kv += p.kv_lens[b];
    r->max_q = std::max(r->max_q, p.q_lens[b]);
  }
  r->total_q = p.qo_indptr[p.batch];
  return ATTNC_PLAN_OK;
}

}  // namespace prefill_plan
}  // namespace attnc
