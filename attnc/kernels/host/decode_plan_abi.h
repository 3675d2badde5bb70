// Owns: the C ABI of the host decode planner: the parameter, summary, step and result
// structs that Python fills and reads through ctypes
// (attnc/runtime/planning/decode_plan_library.py).
// The return and page-table error codes are those of attnc/abi_codes.h.
#pragma once
#include <stdint.h>

#include "attnc/abi_codes.h"
#include "mask_range_rows.h"

#define ATTNC_PLAN_MAX_SPLIT_FACTORS 4

// The planner library is built with hidden visibility; its entry points are exported.
#define ATTNC_PLAN_EXPORT __attribute__((visibility("default")))

extern "C" {

// Inputs of attnc_decode_plan. Mirrored by ctypes in
// attnc/runtime/planning/decode_plan_library.py (PlanParams; its sizeof is checked when the
// library is loaded).
typedef struct AttncPlanParams {
  // The step's shape and cost model (the oracle: schedule).
  int64_t batch;
  int64_t q_len;
  int64_t num_qo_heads;
  int64_t num_kv_heads;
  int64_t row_blocks;
  int64_t num_ctas;
  int64_t kv_tile;
  int64_t max_part_rows;
  int64_t min_chunk;
  int64_t max_items;  // < 0: no limit
  double alpha;
  double beta;
  const int64_t* kv_lens;         // [batch]
  const int64_t* req_page_begin;  // [batch] (written as int32: the low 32 bits)
  // The work region: buf[0, buf_bytes) and the byte offsets of WorkspaceLayout.
  uint8_t* buf;
  int64_t buf_bytes;
  int64_t off_header;
  int64_t off_cta_indptr;
  int64_t off_req_page_begin;
  int64_t off_req_kv_len;
  int64_t off_merge_items;
  int64_t off_items;
  // Test-only copies of the plan's arrays (each may be null): items [out_items_cap, 8]
  // int32, cost [out_items_cap] float64, cta_indptr [num_ctas + 1] int32, merge_items
  // [batch, 4] int32, num_chunks [batch] int64. Contents are undefined unless ATTNC_PLAN_OK.
  int32_t* out_items;
  double* out_cost;
  int64_t out_items_cap;
  int32_t* out_cta_indptr;
  int32_t* out_merge_items;
  int64_t* out_num_chunks;
  // The KV the chunks of each request cover (decode_step.h / tests/mask_ranges_oracle.py:
  // decode_spans): [kv_offset[r], kv_offset[r] + plan_lens[r]), inside
  // [0, kv_lens[r]]. Null plan_lens: whole requests. visible_count must equal batch.
  const int64_t* plan_lens;
  const int64_t* kv_offset;
  int64_t visible_count;
  // The candidate chunks besides "no split": the cost per CTA divided by each factor (>= 1),
  // split_factors[0, num_split_factors), at most ATTNC_PLAN_MAX_SPLIT_FACTORS of them.
  int64_t split_factors[ATTNC_PLAN_MAX_SPLIT_FACTORS];
  int64_t num_split_factors;
} AttncPlanParams;

// Outputs of attnc_decode_plan (ATTNC_PLAN_CAPACITY fills num_items only).
typedef struct AttncPlanSummary {
  int64_t num_items;       // work items
  int64_t num_split;       // split requests (rows of the merge list)
  int64_t merge_rows;      // packed query rows the merge kernel combines
  int64_t chunk_size;      // KV tokens per chunk (0 when nothing is split)
  int64_t num_part_slots;  // partial-state slots (one per chunk of a split request)
  int64_t total_chunks;    // KV chunks over all requests
  int64_t work_bytes;      // bytes of the work region to copy (write_work_region's result)
} AttncPlanSummary;

// Inputs of attnc_decode_step. Mirrored by ctypes in decode_plan_library.py (StepParams).
typedef struct AttncStepParams {
  // The planner's arguments; batch, kv_lens and req_page_begin are set by the step (to
  // kv_out and page_begin_out).
  AttncPlanParams plan;
  // The page table: int32 host arrays.
  const int32_t* kv_indptr;  // [indptr_len]
  int64_t indptr_len;
  // Nonzero: the caller has checked kv_indptr's entries in this very array (at least one,
  // the first 0, non-decreasing: runtime/checks/tensors.py check_indptr_values, where a
  // plan-time tensor param is sized by it), and the checks here do not check them again.
  int64_t indptr_checked;
  const int32_t* last_page_len;  // [last_len]
  int64_t last_len;
  int64_t page_size;
  int64_t max_batch;        // capacity of kv_out and page_begin_out
  int64_t max_pages;        // page ids the workspace holds
  int64_t* kv_out;          // [max_batch] KV length per request
  int64_t* page_begin_out;  // [max_batch] kv_indptr[:-1]
  const int32_t* kv_indices;  // [indices_len], on the device or the host
  int64_t indices_len;
  int64_t indices_on_device;
  // Set by attnc_decode_check when the tables above pass its checks (0 when they fail), their
  // host page ids then staged in page_stage; attnc_decode_step_checked plans only tables so
  // checked, and clears it, as attnc_decode_step does. Whoever points the struct at other
  // tables or another stage clears it.
  int64_t tables_checked;
  // The copies, ordered on ``stream`` of CUDA device ``device``.
  uint8_t* dev_work;        // the workspace (the work region starts at its byte 0)
  uint8_t* dev_page_ids;    // the workspace's page id region
  uint8_t* page_stage;      // pinned staging buffer of host page ids
  int64_t page_stage_bytes;
  void* stream;
  int64_t device;
  // Owned by the library: recorded after the copies (null until the first one).
  void* event;
  // The mask's range rows (mask_range_rows.h; null rows: plan_lens / kv_offset as ``plan``
  // has them): the step computes each request's span from its KV length into span_offset /
  // span_len [max_batch] (decode_step.h: decode_spans) and plans only those.
  AttncRangeRows ranges;
  int64_t* span_offset;
  int64_t* span_len;
  // Variants that read a kv_len tensor: the workspace's kv_token_start region (null: none)
  // and its pinned staging buffer [max_batch + 1] int32: the step writes the prefix sums of
  // the KV lengths there and copies them with the work lists.
  uint8_t* dev_token_start;
  int32_t* token_stage;
} AttncStepParams;

// Outputs of attnc_decode_step and attnc_decode_check.
typedef struct AttncStepResult {
  int64_t error;  // ATTNC_PT_* code of ATTNC_PLAN_INVALID
  int64_t index;
  int64_t value;
  int64_t value2;
  int64_t batch;     // after the checks pass
  int64_t nnz;       // kv_indptr[-1]
  int64_t max_page;  // largest host page id (-1: none, or ids on the device)
  int64_t cuda_error;  // cudaError_t of ATTNC_PLAN_CUDA
  AttncPlanSummary summary;  // ATTNC_PLAN_OK (num_items only for ATTNC_PLAN_CAPACITY)
  // KV tokens of the step as int32 (kv_token_start's last entry; 0 without), or their int64
  // count past INT32_MAX with ATTNC_PLAN_OUT_OF_RANGE (they do not fit kv_token_start)
  int64_t total_kv;
} AttncStepResult;

}  // extern "C"
