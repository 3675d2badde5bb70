// Owns: the key values a Hopper prefill stage carries for a variant with key terms
// (V::KeyValues: what its score and mask compute from the key alone, a bias or a document id
// per key). The producer computes each key's values once per stage (their reads prefetched
// into L1 before the stage is free) and writes them beside it (Shape::kKeyBytes > 0, a block
// of kKvTile of them per stage, published by the stage's arrival on full_k like StageInfo);
// every consumer warp then reads them from shared memory (TileKeys, score_hooks.cuh) instead
// of computing them per element. Only stages whose tile reads them carry them
// (stage_holds_keys); for those the consumers hand K back after the scores instead of after S
// (Sm90Consumer::hold_p), so a block is not rewritten while they read it.
#pragma once

#include <stdint.h>

#include "../key_values_stage.cuh"
#include "../score_hooks.cuh"
#include "../variant_contract.cuh"
#include "prefill_sm90_config.cuh"

namespace attnc {
namespace sm90 {

// Whether the consumers evaluate V::mask on the tile of `info` (PARTIAL, or short of a whole
// stage: its keys past the end are masked).
template <class V, class Shape>
__device__ __forceinline__ bool tile_is_masked(const StageInfo& info) {
  return (V::kHasMask && info.cls == static_cast<int>(TileClass::kPartial)) ||
         info.kv1 - info.kv0 < Shape::kKvTile;
}

// Whether the stage of `info` carries key values: the shape stages them, and the tile reads
// them (a score that reads by key, on every tile; a mask alone, only where it is evaluated).
// The producer writes them, and the consumers hand K back after the scores, only then.
template <class V, class Shape>
__device__ __forceinline__ bool stage_holds_keys(const StageInfo& info) {
  if constexpr (Shape::kKeyBytes == 0) {
    return false;
  } else {
    return variant_score_reads_by_key<V>::value || tile_is_masked<V, Shape>(info);
  }
}

// One stage's key values by the 128 producer threads (key_values_stage.cuh).
template <class V, class Shape>
using ProducerStageKeys = StageKeys<V, Shape::kKvTile, 128>;

// What the consumers' score hooks read a stage's key values through (KeySource): TileKeys
// over the stage's block when the shape stages them, else DirectKeys.
template <class V, class Shape>
using StageKeySource = KeySource<V, (Shape::kKeyBytes > 0)>;

}  // namespace sm90
}  // namespace attnc
