// Owns: the C ABI of the tile-map builder a prefill module exports (tile_map_builder.cuh):
// the argument structs of attnc_build_tile_map and attnc_queue_tile_map and their version.
// Plain C, mirrored field by field by attnc/runtime/planning/tile_map.py.
#pragma once
#include <stdint.h>

#define ATTNC_TILE_MAP_ABI_VERSION 4

// Arguments of attnc_build_tile_map (mirrored by attnc/runtime/planning/tile_map.py).
typedef struct AttncTileMapArgs {
  uint8_t* tile_map;               // [num_entries] out
  const int32_t* tile_map_start;   // [batch + 1] offset of request b's map
  const int32_t* qo_indptr;        // [batch + 1] flattened query offsets
  const int32_t* kv_token_start;   // [batch + 1] flattened KV token offsets
  const void* variant_params;      // host pointer to the variant's Params struct
  int64_t variant_params_size;     // sizeof(Params) as the caller sees it
  int32_t batch_size;
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t tile_q_tokens;           // query tokens per map row
  int32_t kv_block;                // keys per map column
  int32_t mask_heads;              // query heads evaluated: 1 when the mask reads no head
  int32_t num_entries;             // tile_map_start[batch]
  float sm_scale;
} AttncTileMapArgs;

// The copies around one build (optional argument of attnc_build_tile_map): the head lists
// from page-locked host memory into the workspace before the classifier, the map back into
// page-locked host memory after it, and the wait for both, so that a plan makes one call.
typedef struct AttncTileMapCopies {
  const void* heads_host;  // tile_map_start, qo_indptr, kv_token_start as the workspace holds them
  void* heads_device;      // their place in the workspace
  int64_t heads_bytes;
  uint8_t* map_host;       // [num_entries] out: the map
} AttncTileMapCopies;

// The plan's packed lists, from page-locked host memory into the workspace: the first step
// attnc_queue_tile_map queues (the classifier and the item step read them).
typedef struct AttncPlanUpload {
  const void* host;
  void* device;
  int64_t bytes;
} AttncPlanUpload;
