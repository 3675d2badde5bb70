// Owns: every integer code that crosses the C ABI between attnc's native code and Python:
// the launcher errors of the prefill and decode modules, the return codes of the host planners
// (attnc/kernels/host/) and the page-table check that failed. Plain #defines, one per
// line, so the one Python mirror (attnc/runtime/abi.py) is checked against this file by
// parsing it (tests/codegen/test_abi_codes.py).
#pragma once

// Launcher return codes beyond cudaError_t values (attnc_prefill, attnc_decode, *_shape).
#define ATTNC_E_BAD_PARAMS_SIZE 10001
#define ATTNC_E_BAD_HEAD_DIM 10002
#define ATTNC_E_BAD_LAYOUT 10003
#define ATTNC_E_BAD_TILE 10004

// Return codes of the host planners (attnc_decode_*, attnc_prefill_*; host/c_boundary.h).
#define ATTNC_PLAN_OK 0
#define ATTNC_PLAN_OUT_OF_RANGE 1  // an input beyond the planner's integer or float limits
#define ATTNC_PLAN_CAPACITY 2      // more work items than max_items (summary.num_items says how many)
#define ATTNC_PLAN_INVALID 3       // a page-table check failed (the result's error says which)
#define ATTNC_PLAN_CUDA 4          // a CUDA call failed (AttncStepResult.cuda_error)
#define ATTNC_PLAN_NO_MEMORY 5     // the planner's host scratch could not be allocated

// The page-table or index-list check that failed (AttncStepResult.error and
// AttncPrefillResult.error after ATTNC_PLAN_INVALID); index/value/value2 say where. The
// codes from 10 on are the prefill planner's only.
#define ATTNC_PT_INDPTR_EMPTY 1       // kv_indptr has no entries
#define ATTNC_PT_INDPTR_START 2       // value = kv_indptr[0] != 0
#define ATTNC_PT_INDPTR_DECREASING 3  // index i: value = kv_indptr[i] < value2 = kv_indptr[i-1]
#define ATTNC_PT_LAST_COUNT 4         // index = batch entries expected, value = entries given
#define ATTNC_PT_LAST_RANGE 5         // index i, value = kv_last_page_len[i] outside [1, page_size]
#define ATTNC_PT_BATCH_CAPACITY 6     // value = batch > max_batch
#define ATTNC_PT_PAGE_CAPACITY 7      // value = kv_indptr[-1] > max_pages
#define ATTNC_PT_INDICES_SHORT 8      // value = kv_indices entries < value2 = kv_indptr[-1]
#define ATTNC_PT_INDEX_NEGATIVE 9     // value = the smallest (negative) page id
#define ATTNC_PT_QO_INDPTR_EMPTY 10       // qo_indptr has no entries
#define ATTNC_PT_QO_INDPTR_START 11       // value = qo_indptr[0] != 0
#define ATTNC_PT_QO_INDPTR_DECREASING 12  // index i: value = qo_indptr[i] < value2 = qo_indptr[i-1]
#define ATTNC_PT_INDPTR_COUNT 13          // value = kv_indptr entries != value2 = qo_indptr's
#define ATTNC_PT_QUERY_TOKENS 14          // index = request, value = its query tokens > the limit
#define ATTNC_PT_KV_TOKENS 15             // index = request, value = its KV tokens > the limit,
                                          // value2 = its pages (-1: ragged KV)
