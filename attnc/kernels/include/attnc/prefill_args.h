// Owns: the C ABI of a prefill module: the argument struct the Python runtime fills with
// ctypes and the exported launcher. Plain C so ctypes can mirror it field by field.
#pragma once
#include <stdint.h>

#define ATTNC_PREFILL_ABI_VERSION 1

enum AttncKvLayout {
  ATTNC_KV_RAGGED = 0,      // k/v: [total_kv, H_kv, D]; kv_indptr holds token offsets
  ATTNC_KV_PAGED_NHD = 1,   // cache [pages, 2, page_size, H_kv, D]; kv_indptr holds page offsets
  ATTNC_KV_PAGED_HND = 2,   // cache [pages, 2, H_kv, page_size, D]
};

// All strides are in elements. Index tensors are int32 on the device.
typedef struct AttncPrefillArgs {
  const void* q;                    // [total_q, H_qo, D]
  const void* k;                    // ragged: [total_kv, H_kv, D]; paged: K half of the cache
  const void* v;                    // ragged: [total_kv, H_kv, D]; paged: V half of the cache
  void* o;                          // [total_q, H_qo, D], same dtype as q
  float* lse;                       // [total_q, H_qo] natural-log LSE, or NULL
  const int32_t* qo_indptr;         // [batch + 1]
  const int32_t* kv_indptr;         // [batch + 1]: token offsets (ragged) or page offsets
  const int32_t* kv_indices;        // paged: page ids; ragged: NULL
  const int32_t* kv_last_page_len;  // paged: [batch]; ragged: NULL
  const int32_t* work_request;      // [num_work]: request index of each work item
  const int32_t* work_q_tile;       // [num_work]: query tile index inside that request
  int64_t q_stride_tok, q_stride_head;
  int64_t o_stride_tok, o_stride_head;
  int64_t kv_stride_page;           // paged: elements between pages; ragged: 0
  int64_t kv_stride_tok;            // between tokens (inside a page for paged)
  int64_t kv_stride_head;           // between KV heads
  int32_t batch_size;
  int32_t num_work;                 // grid x = num_work, grid y = num_kv_heads
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t page_size;                // paged: tokens per page; ragged: 1
  int32_t kv_layout;                // AttncKvLayout
  int32_t tile_q_tokens;            // query tokens per work item (rows = tokens * group)
  float sm_scale;
  const void* variant_params;       // host pointer to the variant's Params struct
  int64_t variant_params_size;      // sizeof(Params) as the caller sees it
} AttncPrefillArgs;

#ifdef __cplusplus
extern "C" {
#endif
// Returns 0 on success, otherwise a cudaError_t value or one of the ATTNC_E* codes below.
int attnc_prefill(const AttncPrefillArgs* args, void* cuda_stream);
int attnc_prefill_abi_version(void);
// Query tokens per work item the launcher will use for this shape (the planner asks first).
int attnc_prefill_tile_q_tokens(int32_t head_dim, int32_t group_size, int32_t max_q_len);
#ifdef __cplusplus
}
#endif

#define ATTNC_E_BAD_PARAMS_SIZE 10001
#define ATTNC_E_BAD_HEAD_DIM 10002
#define ATTNC_E_BAD_LAYOUT 10003
#define ATTNC_E_BAD_TILE 10004
