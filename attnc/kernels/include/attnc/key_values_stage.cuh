// Owns: one pipeline stage's key values (V::KeyValues: what a variant's score and mask compute
// from the key alone, a bias or a document id per key), computed once per key by a CTA's
// threads and written into a block of shared memory beside the stage, for the score hooks to
// read through TileKeys (score_hooks.cuh) instead of computing them per element. The Hopper
// producer (sm90/staged_keys.cuh) and the FA2 main loop (prefill_mainloop.cuh) both stage them.
#pragma once

#include <stdint.h>

#include "variant_contract.cuh"

namespace attnc {

// The bytes of one key's staged values: sizeof(V::KeyValues), 0 for a variant without them.
template <class V, bool = variant_has_key_values<V>::value>
struct KeyValueBytes {
  static constexpr int value = 0;
};
template <class V>
struct KeyValueBytes<V, true> {
  static constexpr int value = static_cast<int>(sizeof(typename V::KeyValues));
};

// The key values of one tile of KV_TILE keys, by THREADS threads: thread t takes the keys
// kv0 + t + i * THREADS; a key at or past kv1 (a tail tile) takes the values of kv1 - 1, the
// key the score hooks see there. touch prefetches their reads into L1 ahead of the stage;
// load computes them into registers and store writes them into the stage's block (held across
// a wait: the Hopper producer); write does both at once, only for the tile's keys.
template <class V, int KV_TILE, int THREADS>
struct StageKeys {
  static constexpr int kPer = (KV_TILE + THREADS - 1) / THREADS;
  static constexpr int kWords = static_cast<int>(sizeof(typename V::KeyValues) / 4);
  typename V::KeyValues values[kPer];

  __device__ __forceinline__ static void touch(const V& var, int kv0, int kv1, int t) {
    if constexpr (variant_touches_key_reads<V>::value) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) var.touch_key_reads(min(kv0 + t + i * THREADS, kv1 - 1));
    }
  }
  __device__ __forceinline__ void load(const V& var, int kv0, int kv1, int t) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) values[i] = var.key_values(min(kv0 + t + i * THREADS, kv1 - 1));
  }
  __device__ __forceinline__ static void store_one(uint32_t block, int key,
                                                   const typename V::KeyValues& v) {
    uint32_t w[kWords];
    __builtin_memcpy(w, &v, sizeof(w));
#pragma unroll
    for (int j = 0; j < kWords; ++j)
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(block + (key * kWords + j) * 4u), "r"(w[j]));
  }
  __device__ __forceinline__ void store(uint32_t block, int t) const {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int key = t + i * THREADS;
      if (key >= KV_TILE) break;
      store_one(block, key, values[i]);
    }
  }
  __device__ __forceinline__ static void write(const V& var, uint32_t block, int kv0, int kv1,
                                               int t) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int key = t + i * THREADS;
      if (key >= KV_TILE) break;
      store_one(block, key, var.key_values(min(kv0 + key, kv1 - 1)));
    }
  }
};

}  // namespace attnc
