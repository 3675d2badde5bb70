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

// One stage's key values, computed by the 128 producer threads into registers (load) and
// written into the stage's block (store); touch prefetches their reads into L1 first. Thread t
// takes the keys kv0 + t + i * 128 of the tile; a key at or past kv1 (a tail tile) takes the
// values of kv1 - 1, the key the score hooks see there. Used only where Shape::kKeyBytes > 0.
template <class V, class Shape>
struct StageKeys {
  static constexpr int kThreads = 128;
  static constexpr int kPer = (Shape::kKvTile + kThreads - 1) / kThreads;
  typename V::KeyValues values[kPer];

  __device__ __forceinline__ void touch(const V& var, int kv0, int kv1, int t) const {
    if constexpr (variant_touches_key_reads<V>::value) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) var.touch_key_reads(min(kv0 + t + i * kThreads, kv1 - 1));
    }
  }
  __device__ __forceinline__ void load(const V& var, int kv0, int kv1, int t) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) values[i] = var.key_values(min(kv0 + t + i * kThreads, kv1 - 1));
  }
  __device__ __forceinline__ void store(uint32_t block, int t) const {
    constexpr int kWords = static_cast<int>(sizeof(typename V::KeyValues) / 4);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int key = t + i * kThreads;
      if (key >= Shape::kKvTile) break;
      uint32_t w[kWords];
      __builtin_memcpy(w, &values[i], sizeof(w));
#pragma unroll
      for (int j = 0; j < kWords; ++j)
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(block + (key * kWords + j) * 4u),
                     "r"(w[j]));
    }
  }
};

// What the consumers' score hooks read a stage's key values through: TileKeys over the
// stage's block when the shape stages them, else DirectKeys (the hooks read the tensors).
template <class V, class Shape, bool = (Shape::kKeyBytes > 0)>
struct StageKeySource {
  using Type = DirectKeys;
  __device__ __forceinline__ static Type at(uint32_t) { return DirectKeys(); }
};
template <class V, class Shape>
struct StageKeySource<V, Shape, true> {
  using Type = TileKeys<V>;
  __device__ __forceinline__ static Type at(uint32_t block) { return TileKeys<V>{block}; }
};

}  // namespace sm90
}  // namespace attnc
