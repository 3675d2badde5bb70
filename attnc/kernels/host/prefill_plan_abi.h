// Owns: the C ABI of the host prefill planner: the parameter and result structs that Python
// fills and reads through ctypes (attnc/runtime/planning/prefill_plan_library.py mirrors them
// field for field; their sizeof is checked when the library is loaded). The return codes are
// the planner codes of attnc/abi_codes.h.
#pragma once
#include <stdint.h>

#include "attnc/abi_codes.h"
#include "mask_range_rows.h"

// The planner library is built with hidden visibility; its entry points are exported.
#define ATTNC_PREFILL_PLAN_EXPORT __attribute__((visibility("default")))

// AttncPrefillResult.error after ATTNC_PLAN_CAPACITY.
#define ATTNC_PP_OUT_BUFFER 1  // the output buffer is short: needed_bytes says how long
#define ATTNC_PP_WORKSPACE 2   // the work lists alone do not fit: needed_bytes says how many
#define ATTNC_PP_COST_BUFFER 3  // out_cost is short: needed_bytes holds the chunks to cost
#define ATTNC_PP_COPY_BUFFER 4  // copy is short: needed_bytes says how many bytes it must hold

extern "C" {

typedef struct AttncPrefillParams {
  // The batch: int32 host arrays as the caller gave them. attnc_prefill_check copies what it
  // reads of them into ``copy`` and points these at the copies, which the plan reads: the
  // caller's memory is read once, whatever it holds later.
  int64_t batch;
  const int32_t* qo_indptr;  // [qo_len]
  int64_t qo_len;
  const int32_t* kv_indptr;  // [kv_len]: token offsets (ragged) or page offsets (paged)
  int64_t kv_len;
  const int32_t* kv_indices;  // [num_indices] page ids; null: ragged KV
  int64_t num_indices;
  const int32_t* kv_last_page_len;  // [num_last]
  int64_t num_last;
  int64_t page_size;
  // Written by attnc_prefill_check, read by attnc_prefill_plan: int64 [batch] each.
  int64_t* q_lens;
  int64_t* kv_lens;
  int64_t lens_cap;  // entries q_lens and kv_lens hold
  // Where attnc_prefill_check copies the tables (copy_cap int32 entries; kept by the caller
  // until the plan is written).
  int32_t* copy;
  int64_t copy_cap;
  // The shape and the cost model (tests/codegen/prefill_schedule_oracle.py).
  int64_t num_qo_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t tile_q_tokens;
  int64_t num_ctas;
  int64_t kv_align;
  int64_t workspace_bytes;
  int64_t map_reserve;
  int64_t min_chunk;
  int64_t max_chunks;
  // > 0: the kernel runs the list by the alternating walk over min(items, walk_ctas) CTAs
  // (the Hopper template), and the items are placed for it (prefill_plan_walk.h); 0: the list
  // stays heaviest first.
  int64_t walk_ctas;
  double alpha;
  double beta;
  // Closed-form KV ranges of the mask (mask_range_rows.h; null rows: every tile may see its
  // whole KV).
  AttncRangeRows ranges;
  // The tile map (uint8 classes, planning/tile_map.py layout); null: none.
  const uint8_t* tile_map;
  int64_t tile_map_len;
  int64_t kv_block;
  // The packed int32 lists (the bytes plan() copies to the start of the workspace).
  uint8_t* out;
  int64_t out_bytes;
  // The cost of each chunk in work-list order (may be null).
  double* out_cost;
  int64_t out_cost_cap;
} AttncPrefillParams;

typedef struct AttncPrefillResult {
  // ATTNC_PP_* after ATTNC_PLAN_CAPACITY; ATTNC_PT_* after ATTNC_PLAN_INVALID, with where
  // in index, value and value2 (attnc/abi_codes.h says what each holds)
  int64_t error;
  int64_t index;
  int64_t value;
  int64_t value2;
  int64_t needed_bytes;  // of ATTNC_PP_OUT_BUFFER, ATTNC_PP_WORKSPACE, ATTNC_PP_COPY_BUFFER
  // attnc_prefill_check
  int64_t total_q;
  int64_t total_kv;  // KV tokens over all requests
  int64_t max_q;     // longest request's query tokens
  int64_t max_page;  // largest page id used (-1: none)
  int64_t nnz;       // kv_indptr[-1]: page ids (paged) or KV tokens (ragged)
  // attnc_prefill_plan
  int64_t num_items;
  int64_t num_merge;
  int64_t num_chunks;
  int64_t part_rows;
  int64_t chunk_size;
  int64_t total_bytes;  // of the packed lists
  int64_t off_qo_indptr;
  int64_t off_kv_indptr;
  int64_t off_kv_token_start;
  int64_t off_tile_map_start;
  int64_t off_kv_indices;  // -1: ragged
  int64_t off_kv_last_page_len;
  int64_t off_items;
  int64_t off_merge_items;
  int64_t batch;        // requests
  int64_t num_indices;  // page ids in the lists (paged)
  int64_t num_last;     // last-page lengths in the lists (paged)
} AttncPrefillResult;

}  // extern "C"
