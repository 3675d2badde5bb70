// Owns: the C ABI of a decode module: the argument struct the Python runtime fills with
// ctypes, the layout of the work lists plan() writes into the device workspace, and the
// exported functions. Plain C so ctypes can mirror it field by field.
//
// Everything that changes from one plan() to the next lives in the device workspace (the
// header, the per-CTA work lists, the per-request arrays, the page ids), so a CUDA graph
// captured once replays correctly after a new plan(); the fields of AttncDecodeArgs stay
// fixed for a wrapper (pointers, strides, heads, rows per item, grid sizes).
#pragma once
#include <stdint.h>

#include "attnc/abi_codes.h"

#define ATTNC_DECODE_ABI_VERSION 3

// int32 header at args.header.
enum AttncDecodeHeader {
  ATTNC_DH_NUM_ITEMS = 0,   // work items in use
  ATTNC_DH_Q_LEN = 1,       // query tokens per request (1..8)
  ATTNC_DH_BATCH = 2,       // requests
  ATTNC_DH_MERGE_ROWS = 3,  // (request, token, head) rows the merge kernel combines
  ATTNC_DH_NUM_MERGE = 4,   // split requests (entries of args.merge_items)
  ATTNC_DH_SIZE = 16,
};

// One work item = ATTNC_WI_SIZE int32 at args.items: KV chunk [kv_begin, kv_end) of one
// request and KV head, for the packed (token, head) rows [row_block * rows_per_item, ...).
// part >= 0: the request is split; write the fp32 partial state to slot `part` of the
// partial buffers (without the variant's sink: the merge kernel adds it). part < 0: write the
// final output.
enum AttncDecodeItem {
  ATTNC_WI_REQUEST = 0,
  ATTNC_WI_KV_HEAD = 1,
  ATTNC_WI_ROW_BLOCK = 2,
  ATTNC_WI_KV_BEGIN = 3,
  ATTNC_WI_KV_END = 4,
  ATTNC_WI_PART = 5,
  ATTNC_WI_SIZE = 8,
};

// One split request = ATTNC_MI_SIZE int32 at args.merge_items; its chunks own the partial
// slots [part_base, part_base + num_chunks), merged in that order.
enum AttncDecodeMerge {
  ATTNC_MI_REQUEST = 0,
  ATTNC_MI_NUM_CHUNKS = 1,
  ATTNC_MI_PART_BASE = 2,
  ATTNC_MI_SIZE = 4,
};

#define ATTNC_DECODE_FLAG_MERGE 1  // launch the merge kernel after the decode kernel

// Partial slot s holds rows ((s * q_len + token) * num_qo_heads + head) of part_o
// ([rows, head_dim] fp32, normalised O) and part_lse (natural log; 0 for normalize=none,
// whose partial O is the unnormalised sum).
typedef struct AttncDecodeArgs {
  const void* q;                  // [batch * q_len, H_qo, D]
  const void* k;                  // K half of the paged cache
  const void* v;                  // V half of the paged cache
  void* o;                        // [batch * q_len, H_qo, D], same dtype as q
  float* lse;                     // [batch * q_len, H_qo] natural-log LSE, or NULL
  const int32_t* header;          // [ATTNC_DH_SIZE]
  const int32_t* cta_indptr;      // [num_ctas + 1]: CTA b runs items [indptr[b], indptr[b+1])
  const int32_t* items;           // [max items, ATTNC_WI_SIZE]
  const int32_t* req_page_begin;  // [max batch]: first entry of the request in page_ids
  const int32_t* req_kv_len;      // [max batch]: KV tokens of the request
  const int32_t* page_ids;        // page ids of all requests, one after another
  const int32_t* merge_items;     // [max batch, ATTNC_MI_SIZE]
  float* part_o;
  float* part_lse;
  int64_t q_stride_tok, q_stride_head;
  int64_t o_stride_tok, o_stride_head;
  int64_t kv_stride_page, kv_stride_tok, kv_stride_head;  // elements
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t page_size;
  int32_t kv_layout;              // AttncKvLayout of prefill_args.h (1 NHD, 2 HND)
  int32_t rows_per_item;          // packed rows per work item (attnc_decode_shape)
  int32_t num_ctas;               // grid of the decode kernel
  int32_t merge_ctas;             // grid of the merge kernel
  int32_t flags;                  // ATTNC_DECODE_FLAG_*
  float sm_scale;
  const void* variant_params;     // host pointer to the variant's Params struct
  int64_t variant_params_size;    // sizeof(Params) as the caller sees it
  // Device page-id check (page_check.cuh): a page id outside [0, num_pages) is never
  // dereferenced, the rows of the work items that read it are written as NaN (O and LSE),
  // and the id is reported into *page_status (NULL: not reported).
  uint64_t* page_status;
  int32_t num_pages;              // pages in the KV cache (k.shape[0])
  // [batch + 1]: flattened index of request b's first KV token (prefix sums of kv_len);
  // RequestInfo::kv_start. NULL: 0 for every request.
  const int32_t* kv_token_start;
} AttncDecodeArgs;

#ifdef __cplusplus
extern "C" {
#endif
// Returns 0 on success, otherwise a cudaError_t value or an ATTNC_E* code.
int attnc_decode(const AttncDecodeArgs* args, void* cuda_stream);
int attnc_decode_abi_version(void);
// For head_dim and the packed rows one request needs per KV head (q_len * group): writes
// out[0] = rows per work item, out[1] = KV tokens per CTA tile, out[2] = CTAs per SM the
// kernel fits on the current device. Returns 0 or an error code.
int attnc_decode_shape(int32_t head_dim, int32_t rows_needed, int32_t* out);
#ifdef __cplusplus
}
#endif

