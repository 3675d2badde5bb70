// Owns: the host prefill planner's validation of the batch description (the int32 indptrs,
// page ids and last-page lengths), the copies of them the checks and the plan read, and the
// per-request lengths it derives. The checks run in the order of the Python ones
// (runtime/wrappers/prefill_batch.py check_indices, which still checks arguments the planner
// does not take), so the same error wins when several parts are wrong; a failed check is
// ATTNC_PLAN_INVALID with its ATTNC_PT_* code and where in the result (Python words it:
// runtime/checks/page_table.py planner_error).
#pragma once
#include <stdint.h>
#include <string.h>

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

// The last-page lengths a paged batch's checks and plan read: one per request kv_indptr
// counts (0 for ragged KV).
inline int64_t last_ints(const AttncPrefillParams& p) {
  if (p.kv_indices == nullptr) return 0;
  return std::min(std::max<int64_t>(p.num_last, 0), std::max<int64_t>(p.kv_len - 1, 0));
}

// Copy n entries of *table to *at, point *table at the copy and move *at past it (a null
// table or n <= 0: nothing copied, *table kept). memmove: a table may be a view of the last
// check's copy of itself (overlapping its destination); passed in another table's role, it
// would be overwritten before it is read.
inline void copy_table(const int32_t** table, int64_t n, int32_t** at) {
  if (*table == nullptr || n <= 0) return;
  memmove(*at, *table, static_cast<size_t>(n) * sizeof(int32_t));
  *table = *at, *at += n;
}

// The checks of the indptrs, in order: qo_indptr, kv_indptr (page_table::indptr_ok each),
// their equal entry counts, every request's query tokens within the limit (the longest
// request is reported). Sets p.batch and r->nnz.
inline bool indptrs_ok(AttncPrefillParams& p, AttncPrefillResult* r, page_table::Fault* f) {
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
  return q_at < 0 || fail(f, ATTNC_PT_QUERY_TOKENS, q_at, most, 0);
}

// After indptrs_ok: for paged KV the page table (page_table::check_page_table, ids first; the
// ids it scans are copied to ``ids_copy``), then every request's KV tokens within the limit
// (the longest request is reported). Sets r->max_page.
inline bool tables_ok(const AttncPrefillParams& p, AttncPrefillResult* r, int32_t* ids_copy,
                      page_table::Fault* f) {
  if (p.kv_indices != nullptr) {
    page_table::Table t{p.kv_indptr, p.batch, p.kv_last_page_len, p.num_last,
                        p.kv_indices, p.num_indices, p.page_size, INT64_MAX, INT64_MAX,
                        /*scan_ids=*/true, /*ids_first=*/true};
    t.stage = ids_copy;
    if (!page_table::check_page_table(t, f, &r->max_page)) return false;
  }
  int64_t most;
  const auto kv = [&](int64_t b) { return kv_tokens(p, b); };
  const int64_t kv_at = page_table::longest_over_limit(p.batch, kv, &most);
  if (kv_at < 0) return true;
  const int64_t pages = p.kv_indices == nullptr ? -1 : span(p.kv_indptr, kv_at);
  return page_table::fail(f, ATTNC_PT_KV_TOKENS, kv_at, most, pages);
}

// ATTNC_PLAN_CAPACITY for a copy buffer that holds fewer than ``ints`` entries.
inline int copy_short(AttncPrefillResult* r, int64_t ints) {
  r->error = ATTNC_PP_COPY_BUFFER, r->needed_bytes = 4 * ints;
  return ATTNC_PLAN_CAPACITY;
}

// Check the batch and write q_lens / kv_lens ([batch] each) and the totals into ``r``.
// The caller's tables are read once: copied into p.copy first (the page ids as the check
// scans them, kv_indptr[-1] of them), the pointers moved to the copies (and num_indices to
// the ids copied), and everything after reads those. After a failed check the pointers may
// still be the caller's: plan nothing then.
// ATTNC_PLAN_CAPACITY with ATTNC_PP_COPY_BUFFER: p.copy is too short (needed_bytes says how
// long it must be; call again with the caller's pointers). ATTNC_PLAN_OUT_OF_RANGE: a paged
// batch with page_size < 1 (the Python side refuses it first, naming page_size).
inline int check_batch(AttncPrefillParams& p, AttncPrefillResult* r) {
  *r = AttncPrefillResult{};
  r->max_page = -1;
  if (p.kv_indices != nullptr && p.page_size < 1) return ATTNC_PLAN_OUT_OF_RANGE;
  const int64_t last = last_ints(p);
  const int64_t small = std::max<int64_t>(p.qo_len, 0) + std::max<int64_t>(p.kv_len, 0) + last;
  if (small > p.copy_cap) return copy_short(r, small);
  int32_t* at = p.copy;
  copy_table(&p.qo_indptr, p.qo_len, &at);
  copy_table(&p.kv_indptr, p.kv_len, &at);
  copy_table(&p.kv_last_page_len, last, &at);
  page_table::Fault f;
  bool ok = indptrs_ok(p, r, &f);
  int32_t* ids_copy = nullptr;
  if (ok && p.kv_indices != nullptr) {
    const int64_t ids = std::min(r->nnz, p.num_indices);  // nnz >= 0: kv_indptr checked
    if (small + ids > p.copy_cap) return copy_short(r, small + ids);
    if (ids > 0) ids_copy = at;
  }
  ok = ok && tables_ok(p, r, ids_copy, &f);
  if (!ok) {
    r->error = f.error, r->index = f.index, r->value = f.value, r->value2 = f.value2;
    return ATTNC_PLAN_INVALID;
  }
  if (p.kv_indices != nullptr) {  // the plan packs the used page ids only, from the copy
    p.num_indices = r->nnz;
    if (at != nullptr) p.kv_indices = at;  // ids_copy, or no ids: a pointer that stays valid
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
