// Owns: the checks of a batch's index lists that both host planners run on the raw int32 host
// arrays (the decode step, decode_step.h, and the prefill batch check, prefill_plan_check.h):
// indptrs, the paged KV's page table (last-page lengths, page ids, the decode workspace's
// capacity), the longest request the kernels take, and the KV length of a paged request. A
// failed check fills a Fault with an ATTNC_PT_* code (attnc/abi_codes.h) and the offending
// index and values; Python words it (attnc/runtime/checks/page_table.py planner_error).
#pragma once
#include <stdint.h>

#include "attnc/abi_codes.h"
#include "decode_plan_ids.h"

namespace attnc {
namespace page_table {

// Most query or KV tokens of one request: int32 less a margin for the kernels' tile
// arithmetic (kv0 + tile, (end - begin + tile - 1) / tile). MAX_QUERY_TOKENS and
// MAX_KV_TOKENS of attnc/dsl/limits.py are the same number.
constexpr int64_t kMaxRequestTokens = INT32_MAX - 65535;

// A request's KV tokens in a paged cache: (pages - 1) * page_size + last, 0 without pages
// (pages <= 0). Computed in uint64 and wrapped to int64, so values no check let through give
// a number, never undefined behaviour (checks/limits.py paged_kv_tokens is the Python one).
inline int64_t paged_kv_len(int64_t pages, int64_t page_size, int64_t last) {
  if (pages <= 0) return 0;
  return static_cast<int64_t>(static_cast<uint64_t>(pages - 1) * static_cast<uint64_t>(page_size) +
                              static_cast<uint64_t>(last));
}

// A failed check: its ATTNC_PT_* code and where (abi_codes.h says what each field holds).
struct Fault {
  int64_t error = 0, index = 0, value = 0, value2 = 0;
};

// Record a fault; false, for ``return fail(...)`` in a check.
inline bool fail(Fault* f, int64_t error, int64_t index, int64_t value, int64_t value2) {
  *f = Fault{error, index, value, value2};
  return false;
}

// The codes of one indptr's faults.
struct IndptrCodes {
  int64_t empty, start, decreasing;
};
constexpr IndptrCodes kKvIndptr{ATTNC_PT_INDPTR_EMPTY, ATTNC_PT_INDPTR_START,
                                ATTNC_PT_INDPTR_DECREASING};
constexpr IndptrCodes kQoIndptr{ATTNC_PT_QO_INDPTR_EMPTY, ATTNC_PT_QO_INDPTR_START,
                                ATTNC_PT_QO_INDPTR_DECREASING};

// An indptr v[0, n): at least one entry, starting at 0, non-decreasing (the first drop is
// the one reported).
inline bool indptr_ok(const int32_t* v, int64_t n, const IndptrCodes& c, Fault* f) {
  if (n <= 0 || v == nullptr) return fail(f, c.empty, 0, 0, 0);
  if (v[0] != 0) return fail(f, c.start, 0, v[0], 0);
  for (int64_t i = 1; i < n; ++i)
    if (v[i] < v[i - 1]) return fail(f, c.decreasing, i, v[i], v[i - 1]);
  return true;
}

// The page table of a paged batch, its kv_indptr already through indptr_ok.
struct Table {
  const int32_t* indptr;  // kv_indptr [batch + 1]: page offsets
  int64_t batch;
  const int32_t* last;  // kv_last_page_len [last_len]
  int64_t last_len;
  const int32_t* ids;  // kv_indices [ids_len]
  int64_t ids_len;
  int64_t page_size;
  int64_t max_batch;  // the decode workspace's capacity (INT64_MAX: none)
  int64_t max_pages;
  bool scan_ids;   // check the page ids' values here (false: on the device, or checked later)
  bool ids_first;  // the prefill order: page ids before last-page lengths (see check_page_table)
  int32_t* stage = nullptr;  // when not null, with scan_ids: the scanned ids are copied here
};

// kv_last_page_len: one entry per request, in [1, page_size] for a request with pages (the
// first outside is reported).
inline bool last_ok(const Table& t, Fault* f) {
  if (t.last_len != t.batch) return fail(f, ATTNC_PT_LAST_COUNT, t.batch, t.last_len, 0);
  for (int64_t i = 0; i < t.batch; ++i)
    if (t.indptr[i + 1] > t.indptr[i] && (t.last[i] < 1 || t.last[i] > t.page_size))
      return fail(f, ATTNC_PT_LAST_RANGE, i, t.last[i], 0);
  return true;
}

// The batch and its page ids fit the decode workspace.
inline bool capacity_ok(const Table& t, Fault* f) {
  if (t.batch > t.max_batch) return fail(f, ATTNC_PT_BATCH_CAPACITY, 0, t.batch, 0);
  const int64_t nnz = t.indptr[t.batch];
  if (nnz > t.max_pages) return fail(f, ATTNC_PT_PAGE_CAPACITY, 0, nnz, 0);
  return true;
}

// kv_indices: at least kv_indptr[-1] entries, and with scan_ids none of those negative (the
// smallest is reported; the nnz ids are copied to t.stage on the way when it is not null);
// *max_page is the largest (-1: none, or not scanned).
inline bool ids_ok(const Table& t, Fault* f, int64_t* max_page) {
  const int64_t nnz = t.indptr[t.batch];
  if (t.ids_len < nnz) return fail(f, ATTNC_PT_INDICES_SHORT, 0, t.ids_len, nnz);
  *max_page = -1;
  if (!t.scan_ids || nnz <= 0) return true;
  const decode_plan::IdRange ids = decode_plan::id_range(t.ids, t.stage, nnz);
  if (ids.lo < 0) return fail(f, ATTNC_PT_INDEX_NEGATIVE, 0, ids.lo, 0);
  *max_page = ids.hi;
  return true;
}

// The page-table checks after kv_indptr's, the first failure reported. The decode order:
// last-page lengths, capacity, page ids (tests/codegen/decode_schedule_oracle.py); with
// ids_first the prefill order: page ids, last-page lengths (its Python checks',
// runtime/wrappers/prefill_batch.py check_indices; it has no capacity to check). *max_page:
// the largest page id scanned (-1: none).
inline bool check_page_table(const Table& t, Fault* f, int64_t* max_page) {
  *max_page = -1;
  if (t.ids_first) return capacity_ok(t, f) && ids_ok(t, f, max_page) && last_ok(t, f);
  return last_ok(t, f) && capacity_ok(t, f) && ids_ok(t, f, max_page);
}

// The request whose length len(b) (b < batch) is the largest, the first of equals, when that
// length is over kMaxRequestTokens (the request Python's checks/limits.py names), with the
// length in *tokens; -1 when no request is over.
template <class Len>
inline int64_t longest_over_limit(int64_t batch, Len len, int64_t* tokens) {
  int64_t at = -1;
  *tokens = kMaxRequestTokens;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = len(b);
    if (n > *tokens) at = b, *tokens = n;
  }
  return at;
}

}  // namespace page_table
}  // namespace attnc
