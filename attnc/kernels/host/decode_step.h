// Owns: the host side of one BatchDecodeWrapper.plan() after its scalar checks: the
// page-table checks on the raw int32 host arrays, the wait for the previous copies out of the
// pinned buffers (a CUDA event), host page ids checked and staged in one pass
// (decode_plan_ids.h), the plan (decode_plan.h), and the two stream-ordered copies
// (pinned work region -> workspace, page ids -> workspace) followed by the event record. The
// CUDA calls go through ``Cuda`` (decode_step_cuda.h). The checks run once per plan: in
// ``step``, or in ``check_tables`` when the caller needs the KV lengths first (the mask's
// range rows read them), followed by ``step_checked``. The caller's tables are read once:
// kv_indptr and kv_last_page_len are copied before the checks, which read the copies (as the
// lengths and page begins kept from the check do), and host page ids are checked while they
// are copied to the stage (the stage, not the caller's ids, is what gets copied on).
#pragma once
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "decode_plan.h"
#include "decode_plan_ids.h"
#include "decode_step_cuda.h"
#include "mask_range_rows.h"
#include "page_table_check.h"

namespace attnc {
namespace decode_plan {

// A failed page-table check into ``r``: ATTNC_PLAN_INVALID.
inline int invalid(AttncStepResult* r, const page_table::Fault& f) {
  r->error = f.error;
  r->index = f.index;
  r->value = f.value;
  r->value2 = f.value2;
  return ATTNC_PLAN_INVALID;
}

// Each request's span under the mask's range rows (tests/mask_ranges_oracle.py decode_spans):
// its q_len queries are the last q_len positions of its KV and see [begin, end)
// (mask_range_rows.h kv_range of the query rows [0, q_len), wrap guards included); offset[r]
// is begin clipped to the request and rounded down to a multiple of kv_tile, length[r] the
// tokens from there to end clipped to the request (0: none). False when the rows are
// malformed for ``batch`` or kv_tile / q_len is not positive (nothing written). ``c`` is
// scratch.
inline bool decode_spans(const AttncRangeRows& m, const int64_t* kv, int64_t batch, int64_t q_len,
                         int64_t kv_tile, int64_t* offset, int64_t* length,
                         std::vector<int64_t>& c) {
  if (!mask_ranges::rows_ok(m, batch) || kv_tile <= 0 || q_len <= 0) return false;
  c.resize(static_cast<size_t>(std::max<int64_t>(m.num_rows, 1)));
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t k = kv[r];
    mask_ranges::row_constants(m, r, q_len, k, c.data());
    const bool wraps = mask_ranges::may_wrap(m, c.data(), q_len, k);
    int64_t begin, end;
    mask_ranges::kv_range(m, c.data(), wraps, 0, q_len, k, &begin, &end);
    const int64_t first = std::min(std::max<int64_t>(begin, 0), k) / kv_tile * kv_tile;
    offset[r] = first;
    length[r] = std::max<int64_t>(std::min(std::max<int64_t>(end, 0), k) - first, 0);
  }
  return true;
}

// The caller's kv_indptr and kv_last_page_len (the latter only with one entry per request,
// else no check reads its entries) copied into ``s.tables``, each entry read once: another
// thread writing them during the step cannot make what is checked differ from what is used
// (kv_indptr[-1] past max_pages after the capacity check, then a page-id copy past the
// workspace's page-id region). *indptr / *last: the copies (the caller's pointers when
// nothing is copied: no entries, a null array, or more requests than max_batch, which the
// capacity check refuses whatever the entries hold: the thread's scratch is never grown past
// the planner's batch for a table it refuses).
inline void copy_tables(const AttncStepParams& p, Scratch& s, const int32_t** indptr,
                        const int32_t** last) {
  *indptr = p.kv_indptr;
  *last = p.last_page_len;
  const int64_t n = p.kv_indptr != nullptr && p.indptr_len > 0 ? p.indptr_len : 0;
  const int64_t m = p.last_page_len != nullptr && p.last_len == n - 1 ? p.last_len : 0;
  if (n == 0 || n - 1 > p.max_batch) return;
  s.tables.resize(static_cast<size_t>(n + m));
  memcpy(s.tables.data(), p.kv_indptr, static_cast<size_t>(n) * 4);
  *indptr = s.tables.data();
  if (m == 0) return;
  memcpy(s.tables.data() + n, p.last_page_len, static_cast<size_t>(m) * 4);
  *last = s.tables.data() + n;
}

// The page-table checks of BatchDecodeWrapper.plan on the int32 host arrays (copied first:
// copy_tables), in this order:
// kv_indptr (entries, start, non-decreasing; not when the caller checked them:
// ``indptr_checked``), kv_last_page_len (count, range), batch and page capacity, kv_indices
// (entries; the host ids' values are stage_host_ids'): page_table_check.h, the decode order.
// A failure is ATTNC_PLAN_INVALID with an ATTNC_PT_* code and the offending index and values
// in ``r`` (Python words them: attnc/runtime/checks/page_table.py). On success: kv_out / page_begin_out and the result's
// batch, nnz and max_page (-1: ids not scanned yet). Writes nothing else.
inline int check_page_table(const AttncStepParams& s, AttncStepResult* r, Scratch& scratch) {
  page_table::Fault f;
  const int32_t *ip, *last;
  copy_tables(s, scratch, &ip, &last);
  if (!s.indptr_checked && !page_table::indptr_ok(ip, s.indptr_len, page_table::kKvIndptr, &f))
    return invalid(r, f);
  const int64_t batch = s.indptr_len - 1;
  const page_table::Table t{ip, batch, last, s.last_len, s.kv_indices, s.indices_len,
                            s.page_size, s.max_batch, s.max_pages,
                            /*scan_ids=*/false, /*ids_first=*/false};
  int64_t max_page;
  if (!page_table::check_page_table(t, &f, &max_page))
    return invalid(r, f);
  for (int64_t i = 0; i < batch; ++i) {
    s.page_begin_out[i] = ip[i];
    s.kv_out[i] = page_table::paged_kv_len(int64_t(ip[i + 1]) - ip[i], s.page_size, last[i]);
  }
  r->batch = batch;
  r->nnz = ip[batch];
  r->max_page = max_page;
  return ATTNC_PLAN_OK;
}

inline int cuda_failed(AttncStepResult* r, cudaError_t e) {
  r->cuda_error = static_cast<int64_t>(e);
  return ATTNC_PLAN_CUDA;
}

// Host page ids (after the wait for the copies out of page_stage): the negative-id check of
// the page table, the largest id into r->max_page, and the ids into page_stage, in one pass
// (the one read of the caller's ids: the stage holds the values checked).
inline int stage_host_ids(const AttncStepParams& s, AttncStepResult* r) {
  if (s.indices_on_device || r->nnz <= 0) return ATTNC_PLAN_OK;
  if (s.page_stage == nullptr || s.page_stage_bytes < r->nnz * 4)
    return cuda_failed(r, cudaErrorInvalidValue);  // the caller sizes the stage
  const IdRange ids =
      id_range(s.kv_indices, reinterpret_cast<int32_t*>(s.page_stage), r->nnz);
  if (ids.lo < 0) return invalid(r, {ATTNC_PT_INDEX_NEGATIVE, 0, ids.lo, 0});
  r->max_page = ids.hi;
  return ATTNC_PLAN_OK;
}

// For a variant that reads a kv_len tensor: whether the step's KV tokens fit the int32
// kv_token_start (and the int32 indices of that tensor); when not, r->total_kv holds their
// count. A length beyond page_table::kMaxRequestTokens is left to plan()
// (ATTNC_PLAN_OUT_OF_RANGE either way).
inline bool token_starts_fit(const AttncStepParams& s, AttncStepResult* r) {
  if (s.dev_token_start == nullptr) return true;
  int64_t total = 0;
  for (int64_t i = 0; i < r->batch; ++i) {
    const int64_t k = s.kv_out[i];
    if (k < 0 || k > page_table::kMaxRequestTokens) return true;
    total += k;  // fewer than 2^31 lengths below 2^31 each: no overflow
  }
  if (total <= kMaxLen) return true;
  r->total_kv = total;
  return false;
}

// kv_token_start of a variant that reads a kv_len tensor (after the wait): the prefix sums of
// the KV lengths as int32 (wrapping, as torch's int32 cumsum) into token_stage, the total into
// r->total_kv.
inline void stage_token_starts(const AttncStepParams& s, AttncStepResult* r) {
  r->total_kv = 0;
  if (s.dev_token_start == nullptr) return;
  uint32_t sum = 0;
  s.token_stage[0] = 0;
  for (int64_t i = 0; i < r->batch; ++i) {
    sum += static_cast<uint32_t>(static_cast<uint64_t>(s.kv_out[i]));
    s.token_stage[i + 1] = static_cast<int32_t>(sum);
  }
  r->total_kv = static_cast<int32_t>(sum);
}

// The copies of the work region (``work_bytes`` bytes, already in plan.buf), of the ``nnz``
// page ids (host ids from page_stage, filled by stage_host_ids) and of kv_token_start (when
// the variant reads one), then the event record. The caller has waited for the previous
// copies.
inline int upload(const AttncStepParams& s, int64_t work_bytes, int64_t nnz,
                  AttncStepResult* r) {
  Cuda& c = cuda();
  cudaError_t e = cudaSuccess;
  if (work_bytes > 0)
    e = c.copy(s.dev_work, s.plan.buf, static_cast<size_t>(work_bytes), cudaMemcpyHostToDevice,
               s.stream);
  if (e != cudaSuccess) return cuda_failed(r, e);
  if (nnz > 0) {
    const size_t bytes = static_cast<size_t>(nnz) * 4;
    if (s.indices_on_device) {
      e = c.copy(s.dev_page_ids, s.kv_indices, bytes, cudaMemcpyDeviceToDevice, s.stream);
    } else {
      e = c.copy(s.dev_page_ids, s.page_stage, bytes, cudaMemcpyHostToDevice, s.stream);
    }
    if (e != cudaSuccess) return cuda_failed(r, e);
  }
  if (s.dev_token_start != nullptr) {
    e = c.copy(s.dev_token_start, s.token_stage, static_cast<size_t>(r->batch + 1) * 4,
               cudaMemcpyHostToDevice, s.stream);
    if (e != cudaSuccess) return cuda_failed(r, e);
  }
  e = c.record(const_cast<AttncStepParams&>(s));
  return e == cudaSuccess ? ATTNC_PLAN_OK : cuda_failed(r, e);
}

// The step after check_page_table has passed (``r`` holds its batch, nnz and max_page,
// kv_out / page_begin_out its lengths and page begins; ``ids_staged``: check_tables has
// waited for the previous copies and staged the host page ids): step's outcomes, the checks
// aside.
inline int step_after_checks(AttncStepParams& s, AttncStepResult* r, Scratch& scratch,
                             bool ids_staged) {
  if (!token_starts_fit(s, r)) return ATTNC_PLAN_OUT_OF_RANGE;
  int rc = ATTNC_PLAN_OK;
  if (!ids_staged) {
    const cudaError_t e = cuda().wait(s);
    if (e != cudaSuccess) return cuda_failed(r, e);
    rc = stage_host_ids(s, r);
    if (rc != ATTNC_PLAN_OK) return rc;
  }
  AttncPlanParams p = s.plan;
  p.batch = r->batch;
  p.kv_lens = s.kv_out;
  p.req_page_begin = s.page_begin_out;
  if (s.ranges.rows != nullptr) {  // the mask's spans of this step's KV lengths
    if (s.span_offset == nullptr || s.span_len == nullptr ||
        !decode_spans(s.ranges, s.kv_out, r->batch, p.q_len, p.kv_tile, s.span_offset,
                      s.span_len, scratch.range_c))
      return ATTNC_PLAN_OUT_OF_RANGE;
    p.plan_lens = s.span_len;
    p.kv_offset = s.span_offset;
    p.visible_count = r->batch;
  }
  rc = plan(p, &r->summary, scratch);
  if (rc != ATTNC_PLAN_OK) return rc;
  stage_token_starts(s, r);
  return upload(s, r->summary.work_bytes, r->nnz, r);
}

// attnc_decode_check: check_page_table of the tables, then (after the wait for the previous
// copies out of the stage) the host page ids checked as they are staged, the one read of them
// (step_checked copies the stage on); s.tables_checked says whether all passed (for
// step_checked). ATTNC_PLAN_CUDA: the wait failed or the stage is too small.
inline int check_tables(AttncStepParams& s, AttncStepResult* r, Scratch& scratch) {
  s.tables_checked = 0;
  int rc = check_page_table(s, r, scratch);
  if (rc != ATTNC_PLAN_OK) return rc;
  const cudaError_t e = cuda().wait(s);
  if (e != cudaSuccess) return cuda_failed(r, e);
  rc = stage_host_ids(s, r);
  s.tables_checked = rc == ATTNC_PLAN_OK;
  return rc;
}

// BatchDecodeWrapper.plan after its scalar checks. ATTNC_PLAN_OK: planned, copies queued and
// the event recorded. ATTNC_PLAN_INVALID: a check failed (r->error), nothing written (a
// negative host page id is found after the wait, in the pass that stages the ids; the
// stage is not read until the next copies). ATTNC_PLAN_CAPACITY (r->summary.num_items) /
// ATTNC_PLAN_OUT_OF_RANGE: the checks passed (batch, nnz, max_page, kv_out, page_begin_out
// set) and the previous copies are done, nothing written: the caller raises (r->total_kv >
// INT32_MAX: the step's KV tokens do not fit the int32 kv_token_start of a variant that reads
// a kv_len tensor). ATTNC_PLAN_CUDA: a CUDA call failed (r->cuda_error).
inline int step(AttncStepParams& s, AttncStepResult* r, Scratch& scratch) {
  r->total_kv = 0;
  s.tables_checked = 0;
  const int rc = check_page_table(s, r, scratch);
  if (rc != ATTNC_PLAN_OK) return rc;
  return step_after_checks(s, r, scratch, /*ids_staged=*/false);
}

// step of the tables check_tables last passed, without checking them again (``r`` must hold
// that check's result): when the caller needs their KV lengths before the step (the mask's
// range rows read them). ATTNC_PLAN_OUT_OF_RANGE, nothing done, when no check passed for the
// tables now in ``s``. Clears s.tables_checked.
inline int step_checked(AttncStepParams& s, AttncStepResult* r, Scratch& scratch) {
  r->total_kv = 0;
  if (!s.tables_checked) return ATTNC_PLAN_OUT_OF_RANGE;
  s.tables_checked = 0;
  return step_after_checks(s, r, scratch, /*ids_staged=*/true);
}

}  // namespace decode_plan
}  // namespace attnc
