// Owns: the C ABI of a prefill module: the argument struct the Python runtime fills with
// ctypes and the exported launcher. Plain C so ctypes can mirror it field by field.
#pragma once
#include <stdint.h>

#include "attnc/abi_codes.h"

#define ATTNC_PREFILL_ABI_VERSION 4

enum AttncKvLayout {
  ATTNC_KV_RAGGED = 0,      // k/v: [total_kv, H_kv, D]; kv_indptr holds token offsets
  ATTNC_KV_PAGED_NHD = 1,   // cache [pages, 2, page_size, H_kv, D]; kv_indptr holds page offsets
  ATTNC_KV_PAGED_HND = 2,   // cache [pages, 2, H_kv, page_size, D]
};

// One work item = ATTNC_PI_SIZE int32 at args.items: query tile q_tile (tokens
// [q_tile * tile_q_tokens, ...)) of one request and KV head, over the KV chunk
// [kv_begin, kv_end) (intersected with the variant's kv_range). part_row < 0: write the final
// O (and LSE). part_row >= 0: the tile is split over several chunks; write fp32 partial
// states to rows part_row + token_in_tile * num_qo_heads + head of part_o / part_lse.
// A variant's sink (V::kHasSink) is part of an unsplit item's rows from their start; partial
// states never include it and the merge kernel adds it once per row, so the planner needs no
// notion of which chunk owns it.
enum AttncPrefillItem {
  ATTNC_PI_REQUEST = 0,
  ATTNC_PI_Q_TILE = 1,
  ATTNC_PI_KV_HEAD = 2,
  ATTNC_PI_KV_BEGIN = 3,
  ATTNC_PI_KV_END = 4,
  ATTNC_PI_PART_ROW = 5,
  // Item 0 only, written by the Hopper kernel (the planner leaves them 0): the items CTAs
  // have taken past their first, and the CTAs that have taken their last; the launch's last
  // CTA sets both back to 0, so every launch (a CUDA graph's replays too) starts afresh.
  ATTNC_PI_NEXT = 6,
  ATTNC_PI_CTAS_DONE = 7,
  ATTNC_PI_SIZE = 8,
};

// One split query tile = ATTNC_PM_SIZE int32 at args.merge_items. Chunk c (c < num_chunks,
// merged in that order) of the tile's n tokens owns the partial rows
// part_row_base + c * n * num_qo_heads + token_in_tile * num_qo_heads + head.
enum AttncPrefillMerge {
  ATTNC_PM_REQUEST = 0,
  ATTNC_PM_Q_TILE = 1,
  ATTNC_PM_NUM_CHUNKS = 2,
  ATTNC_PM_PART_ROW_BASE = 3,
  ATTNC_PM_SIZE = 4,
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
  const int32_t* items;             // [num_work, ATTNC_PI_SIZE], heaviest first
  const int32_t* merge_items;       // [num_merge, ATTNC_PM_SIZE]; NULL when num_merge = 0
  float* part_o;                    // fp32 partial O rows [*, head_dim] (normalised; plain
                                    // sums for normalize = none); NULL when num_merge = 0
  float* part_lse;                  // natural-log LSE per partial row (0 for normalize = none)
  int64_t q_stride_tok, q_stride_head;
  int64_t o_stride_tok, o_stride_head;
  int64_t kv_stride_page;           // paged: elements between pages; ragged: 0
  int64_t kv_stride_tok;            // between tokens (inside a page for paged)
  int64_t kv_stride_head;           // between KV heads
  int32_t batch_size;
  int32_t num_work;                 // work items = CTAs of the prefill kernel
  int32_t num_merge;                // split query tiles = entries of merge_items
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t page_size;                // paged: tokens per page; ragged: 1
  int32_t kv_layout;                // AttncKvLayout
  int32_t tile_q_tokens;            // query tokens per work item (rows = tokens * group)
  float sm_scale;
  const void* variant_params;       // host pointer to the variant's Params struct
  int64_t variant_params_size;      // sizeof(Params) as the caller sees it
  // Paged: device page-id check (page_check.cuh): a page id outside [0, num_pages) is never
  // dereferenced, the rows of the work items that read it are written as NaN (O and LSE),
  // and the id is reported into *page_status (NULL: not reported). Ragged: unused.
  uint64_t* page_status;
  int32_t num_pages;                // paged: pages in the KV cache (k.shape[0]); ragged:
                                    // tokens in k (k.shape[0]; 0: not given)
  // [batch + 1]: flattened index of request b's first KV token (prefix sums of kv_len over
  // requests, whatever the KV layout); RequestInfo::kv_start. NULL: 0 for every request.
  const int32_t* kv_token_start;
  // Tile map (NULL: tile classes from V::classify). Request b's map starts at
  // tile_map[tile_map_start[b]] and is row-major [num_q_tiles_b][ceil(kv_len_b / kv_block)]
  // of uint8 AttncTileMapClass, one row per query tile of tile_q_tokens tokens, one column
  // per tile_map_kv_block keys. A kernel KV tile over several columns is EMPTY if all are
  // EMPTY, FULL if all are FULL, else PARTIAL.
  const uint8_t* tile_map;
  const int32_t* tile_map_start;    // [batch + 1]
  int32_t tile_map_kv_block;        // keys per map column (64)
} AttncPrefillArgs;

// Values of the bytes of AttncPrefillArgs.tile_map (same as attnc::TileClass).
enum AttncTileMapClass {
  ATTNC_TILE_EMPTY = 0,
  ATTNC_TILE_FULL = 1,
  ATTNC_TILE_PARTIAL = 2,
};

#ifdef __cplusplus
extern "C" {
#endif
// Returns 0 on success, otherwise a cudaError_t value or one of the ATTNC_E* codes below.
int attnc_prefill(const AttncPrefillArgs* args, void* cuda_stream);
int attnc_prefill_abi_version(void);
// Query tokens per work item the launcher will use for this shape (the planner asks first).
int attnc_prefill_tile_q_tokens(int32_t head_dim, int32_t group_size, int32_t max_q_len);
// CTAs of that shape one SM of the current device holds at once (the planner sizes KV chunks
// from it); <= 0 on an error (no device, bad arguments).
int attnc_prefill_ctas_per_sm(int32_t head_dim, int32_t group_size, int32_t max_q_len);
#ifdef __cplusplus
}
#endif
