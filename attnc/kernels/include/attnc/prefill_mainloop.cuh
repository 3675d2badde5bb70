// Owns: the KV main loop of the FA2 prefill CTA: the walk over the non-empty KV tiles of a
// range (V::classify, or the plan's tile map for masks that read per-token tensors
// (tile_map_view.cuh), once per stage, the class carried through the pipeline with the tile),
// the cp.async pipeline that streams K/V stages into swizzled shared memory (per-thread source
// cursors: one multiply-add per stage for ragged KV, one page lookup per row for paged; strides
// read from the kernel arguments where used, to keep registers for the accumulators), and
// per stage the S tiles of Tile::kKvSub keys: S = Q K^T, score transform and mask (only on
// PARTIAL sub-tiles or the ragged end), online softmax and O += P V, with the warp math the
// decode kernel shares (warp_qk_pv.cuh, score_hooks.cuh, online_softmax.cuh).
// A variant whose score reads key values (V::KeyValues) has them staged (kPrefillKeyBytes): the
// CTA computes each key's values once into a block beside the stage (key_values_stage.cuh),
// one tile ahead of its math, and the score hooks read them from there (TileKeys) instead of
// computing them per element.
// The caller has committed the cp.async group of the Q tile (rows at s_q) and initialised
// o, m, l; on return every cp.async group has completed. Returns whether this thread met a
// page id outside the cache (its rows were zero-filled; the caller writes NaN rows).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "cp_async.cuh"
#include "key_values_stage.cuh"
#include "kv_gather.cuh"
#include "mma.cuh"
#include "online_softmax.cuh"
#include "score_hooks.cuh"
#include "smem_layout.cuh"
#include "tile_map_view.cuh"
#include "variant_contract.cuh"
#include "warp_qk_pv.cuh"

namespace attnc {

// The bytes of one key's values the FA2 kernel stages for variant V (V::KeyValues): only for a
// score that reads by key, which evaluates them on every tile, and up to two fields. A mask
// alone evaluates them on PARTIAL tiles only, where staging did not pay: doc_causal 8K on FA2
// ran 1% slower staged (H100; benchmarks/RESULTS.md runs 64 and 65), against 3-28% faster for
// a per-key bias, its bounds-checked form and its logarithm at head_dim 64 and 128 (at 256
// from 1% slower for the plain bias to 8% faster). More fields stay per element: staged, four
// (a bias and three conditions) made the head_dim 64 kernels spill 56 to 168 bytes of stack,
// eight conditions 168 on sm_80.
constexpr int kPrefillMaxKeyBytes = 8;
template <class V>
constexpr int kPrefillKeyBytes =
    variant_score_reads_by_key<V>::value && KeyValueBytes<V>::value <= kPrefillMaxKeyBytes
        ? KeyValueBytes<V>::value
        : 0;

// The key values of the FA2 main loop's tiles, where kPrefillKeyBytes<V> > 0 (else every call
// is empty): the score reads them on every tile, so each tile has them written into its
// stage's block one tile ahead of its math, their reads touched into L1 when its K/V is
// issued. The block of the tile after the one computed is free (its last reader passed the
// iteration's barrier) and the next barrier publishes it. Tiles by index t: keys
// [begin + t * kKvTile, min(that + kKvTile, end)).
template <class V, class Tile>
struct PrefillTileKeys {
  static constexpr int kBytes = kPrefillKeyBytes<V>;
  static constexpr int KVT = Tile::kKvTile;
  using Stage = StageKeys<V, KVT, Tile::kThreads>;
  const V& var;
  uint32_t s_keys;
  int begin, end;

  __device__ __forceinline__ uint32_t block(int stage) const {
    return s_keys + static_cast<uint32_t>(stage * KVT * kBytes);
  }
  __device__ __forceinline__ void touch(int t) const {
    if constexpr (kBytes > 0) {
      const int kv0 = begin + t * KVT;
      Stage::touch(var, kv0, min(kv0 + KVT, end), threadIdx.x);
    }
  }
  __device__ __forceinline__ void write(int t, int stage) const {
    if constexpr (kBytes > 0) {
      const int kv0 = begin + t * KVT;
      Stage::write(var, block(stage), kv0, min(kv0 + KVT, end), threadIdx.x);
    }
  }
};

// Issues this thread's cp.async copies (chunk `chunk` of rows row0 + it * kRowStep) of the K
// and V rows of the tile starting at key kv0 into the stage whose K tile is at shared address
// dk (its V tile Tile::kStages tiles further); keys at or past kv_end, and rows whose page id
// is outside the cache, are zero-filled. Returns whether a row had such a page id.
template <class T, class Tile, class Cursor>
__device__ __forceinline__ bool prefill_issue_kv_tile(const AttncPrefillArgs& args,
                                                      const Cursor& cursor, int kv0, int kv_end,
                                                      uint32_t dk, int row0, int chunk) {
  constexpr int KVT = Tile::kKvTile;
  constexpr int kRowStep = Tile::kThreads / (Tile::kHeadDim / 8);
  using Layout = SwizzledRows<Tile::kHeadDim>;
  constexpr uint32_t kTileBytes = KVT * Layout::kRowBytes;
  // Swizzle period of this thread's rows: row0 + it * kRowStep repeats its (row % 8) every
  // kPeriod rows, so the shared offsets are kPeriod bases plus compile-time displacements.
  static_assert(kRowStep % 8 == 0 || 8 % kRowStep == 0, "row step must divide or be a multiple of 8");
  constexpr int kPeriod = kRowStep % 8 == 0 ? 1 : 8 / kRowStep;
  auto smem_row = [&](int it) -> uint32_t {
    return Layout::offset(row0 + (it % kPeriod) * kRowStep, chunk) +
           (it / kPeriod) * kPeriod * kRowStep * Layout::kRowBytes;
  };
  auto issue = [&](auto all_valid) {
    constexpr bool kAll = decltype(all_valid)::value;
    const int64_t v_minus_k = Cursor::template v_minus_k<T>(args);
    // ok is a compile-time true for ragged rows of a whole tile; paged rows pass the check.
    return cursor.template for_rows<T, kAll>(args, kv0, kv_end,
                                             [&](int it, const char* src, bool ok) {
                                               const uint32_t d = dk + smem_row(it);
                                               cp_async_16(d, src, ok);
                                               cp_async_16(d + Tile::kStages * kTileBytes,
                                                           src + v_minus_k, ok);
                                             });
  };
  if (kv0 + KVT <= kv_end) return issue(std::true_type{});
  return issue(std::false_type{});
}

// The S tiles of one pipeline stage, keys [kv0, kv1) at k_base / v_base (this lane's ldmatrix
// addresses): per S tile of Tile::kKvSub keys S = Q K^T, the score hooks (mask and bound only
// where needed: PARTIAL sub-tiles or the ragged end; key values from the stage's block at
// keys_block where the variant stages them), the online-softmax step and O += P V.
template <class V, class T, class Tile, class QFrag>
__device__ __forceinline__ void prefill_stage_math(
    const V& var, const QFrag& q_frag, uint32_t q_base, uint32_t k_base, uint32_t v_base,
    uint32_t keys_block, int kv0, int kv1, bool partial, int q0, int q1, const TileMapRow& map,
    const typename V::Row (&rows)[Tile::kMmaQ][2], const float (&mult)[Tile::kMmaQ][2],
    float sm_scale, float (&o)[Tile::kMmaQ][Tile::kHeadDim / 8][4], float (&m)[Tile::kMmaQ][2],
    float (&l)[Tile::kMmaQ][2]) {
  constexpr int KVT = Tile::kKvTile;
  constexpr int KSUB = Tile::kKvSub;
  constexpr int NSUB = KVT / KSUB;
  using Layout = SwizzledRows<Tile::kHeadDim>;
  constexpr int kKeyBytes = kPrefillKeyBytes<V>;
  using Keys = KeySource<V, (kKeyBytes > 0)>;
  const int tq = threadIdx.x % 4;
  // One S tile of KSUB keys [ks0, ks1) at k_base / v_base.
  auto s_tile = [&](uint32_t kb, uint32_t vb, int ks0, int ks1, bool masked) {
    float s[Tile::kMmaQ][KSUB / 8][4];
    warp_qk<T, Layout, Tile::kQInRegs>(s, q_frag, q_base, kb);
    const auto keys = Keys::at(keys_block + static_cast<uint32_t>((ks0 - kv0) * kKeyBytes));
    if (masked) {
      transform_scores<true>(var, rows, mult, s, ks0, ks1, tq, sm_scale, keys);
    } else {
      transform_scores<false>(var, rows, mult, s, ks0, ks1, tq, sm_scale, keys);
    }
    if constexpr (V::kUseSoftmax) warp_softmax_step<V>(s, m, l, o, mult);
    warp_pv<T, Layout>(o, s, vb);
  };
  if constexpr (NSUB == 1) {
    s_tile(k_base, v_base, kv0, kv1, partial || kv1 - kv0 < KVT);
  } else {
#pragma unroll 1
    for (int sub = 0; sub < NSUB; ++sub) {
      const int ks0 = kv0 + sub * KSUB;
      if (ks0 >= kv1) break;
      const int ks1 = min(ks0 + KSUB, kv1);
      bool masked = ks1 - ks0 < KSUB;
      if (partial) {
        const TileClass sc = item_tile_class(var, map, q0, q1, ks0, ks1);
        if (sc == TileClass::kEmpty) continue;
        masked = masked || sc == TileClass::kPartial;
      }
      const uint32_t step = static_cast<uint32_t>(sub * KSUB * Layout::kRowBytes);
      s_tile(k_base + step, v_base + step, ks0, ks1, masked);
    }
  }
}

// This lane's ldmatrix addresses (see SwizzledRows::walk): its Q rows' base, and its offsets
// within a K and a V stage.
struct LaneFragments {
  uint32_t q_base, k_off, v_off;
  template <class Tile>
  __device__ __forceinline__ static LaneFragments make(uint32_t s_q, int warp, int lane) {
    using Layout = SwizzledRows<Tile::kHeadDim>;
    LaneFragments f;
    // A (Q): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15): row lane%8 + 8*((lane/8)%2), chunk
    // lane/16.
    f.q_base = s_q + Layout::offset(warp * 16 * Tile::kMmaQ + (lane % 8) + 8 * ((lane / 8) % 2),
                                    lane / 16);
    // B (K): matrices (kv 0-7, k 0-7), (kv 0-7, k 8-15), (kv 8-15, k 0-7), (kv 8-15, k 8-15).
    f.k_off = Layout::offset((lane % 8) + 8 * (lane / 16), (lane / 8) % 2);
    // B (V, transposed): matrices (kv 0-7, d 0-7), (kv 8-15, d 0-7), (kv 0-7, d 8-15), ...
    f.v_off = Layout::offset((lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
    return f;
  }
};

// This warp's Q fragments into registers once the Q tile has landed (its cp.async group is
// older than the first Tile::kStages - 1 K/V stages).
template <class Tile, int MQ, int KD>
__device__ __forceinline__ void prefill_q_to_regs(uint32_t (&q_frag)[MQ][KD][4], uint32_t q_base) {
  using Layout = SwizzledRows<Tile::kHeadDim>;
  cp_async_wait<Tile::kStages - 1>();
  __syncthreads();
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)
      mma::ldmatrix_x4(q_frag[mi][kk], Layout::walk(q_base, 2 * mi, 2 * kk));
}

template <class V, class T, class Tile>
__device__ __forceinline__ bool prefill_kv_loop(
    const AttncPrefillArgs& args, const V& var, const KvRows& kv, int request,
    const KvRange range, int q0, int q1, const TileMapRow& map, uint32_t s_q, uint32_t s_k,
    uint32_t s_v, uint32_t s_keys,
    const typename V::Row (&rows)[Tile::kMmaQ][2], const float (&mult)[Tile::kMmaQ][2],
    float sm_scale, float (&o)[Tile::kMmaQ][Tile::kHeadDim / 8][4], float (&m)[Tile::kMmaQ][2],
    float (&l)[Tile::kMmaQ][2]) {
  constexpr int D = Tile::kHeadDim;
  constexpr int kThreads = Tile::kThreads;
  constexpr int MQ = Tile::kMmaQ;
  constexpr int KVT = Tile::kKvTile;   // keys per pipeline stage
  constexpr int STAGES = Tile::kStages;
  constexpr bool kQInRegs = Tile::kQInRegs;
  constexpr int KD = D / 16;
  constexpr int CH = D / 8;
  using Layout = SwizzledRows<D>;
  constexpr uint32_t kTileBytes = KVT * Layout::kRowBytes;
  static_assert((KVT * CH) % kThreads == 0, "KV tile chunks must split evenly over threads");
  constexpr int kIters = KVT * CH / kThreads;  // rows this thread copies per stage
  constexpr int kRowStep = kThreads / CH;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

  const int num_tiles =
      range.end > range.begin ? (range.end - range.begin + KVT - 1) / KVT : 0;

  // ---- Loader: this thread copies chunk `chunk` of rows row0 + it * kRowStep of each stage.
  const int chunk = tid % CH;
  const int row0 = tid / CH;
  using Cursor = KvTileCursor<kIters, kRowStep>;
  const Cursor cursor = Cursor::template make<T>(args, kv, request, row0, chunk);
  bool saw_bad = false;  // a page id outside the cache (page_check.cuh)
  auto load_tile = [&](int kv0, int stage) {
    saw_bad |= prefill_issue_kv_tile<T, Tile>(args, cursor, kv0, range.end,
                                              s_k + stage * kTileBytes, row0, chunk);
  };

  // ---- Tile walk, by walk position w (0 .. num_tiles - 1; num_tiles: none): tile w, or
  // num_tiles - 1 - w where the walk is reversed (kv_walk_reversed). next_tile: the walk
  // position of the next non-empty tile at or after w, and its class.
  constexpr bool kReverse = kv_walk_reversed<V>;
  auto tile_of = [&](int w) -> int { return kReverse ? num_tiles - 1 - w : w; };
  auto next_tile = [&](int w, TileClass& cls) -> int {
    if constexpr (kReverse)
      return num_tiles - 1 -
             prev_nonempty_tile<KVT>(var, map, q0, q1, range, num_tiles - 1 - w, cls);
    return next_nonempty_tile<KVT>(var, map, q0, q1, range, num_tiles, w, cls);
  };

  // ---- Key values, where the variant stages them (PrefillTileKeys).
  const PrefillTileKeys<V, Tile> keys{var, s_keys, range.begin, range.end};

  // Walk positions of the tiles loaded and not yet computed, oldest first (num_tiles: none),
  // with their classes.
  int pend_t[STAGES - 1];
  TileClass pend_c[STAGES - 1];
  TileClass c_load;
  int t_load = next_tile(0, c_load);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    pend_t[s] = t_load;
    pend_c[s] = c_load;
    if (t_load < num_tiles) {
      load_tile(range.begin + tile_of(t_load) * KVT, s);
      if (s > 0) keys.touch(tile_of(t_load));
      t_load = next_tile(t_load + 1, c_load);
    }
    cp_async_commit();
  }
  if (pend_t[0] < num_tiles) keys.write(tile_of(pend_t[0]), 0);

  const LaneFragments lf = LaneFragments::make<Tile>(s_q, warp, lane);
  const uint32_t q_base = lf.q_base;

  uint32_t q_frag[kQInRegs ? MQ : 1][kQInRegs ? KD : 1][4];
  if constexpr (kQInRegs) prefill_q_to_regs<Tile>(q_frag, q_base);

  int stage = 0;
  while (pend_t[0] < num_tiles) {
    const int t = pend_t[0];
    const TileClass cls = pend_c[0];
#pragma unroll
    for (int s = 0; s + 1 < STAGES - 1; ++s) {
      pend_t[s] = pend_t[s + 1];
      pend_c[s] = pend_c[s + 1];
    }
    pend_t[STAGES - 2] = t_load;
    pend_c[STAGES - 2] = c_load;

    cp_async_wait<STAGES - 2>();
    __syncthreads();
    {
      // Refill the stage consumed in the previous iteration.
      int fill = stage + STAGES - 1;
      if (fill >= STAGES) fill -= STAGES;
      if (t_load < num_tiles) {
        load_tile(range.begin + tile_of(t_load) * KVT, fill);
        keys.touch(tile_of(t_load));
        t_load = next_tile(t_load + 1, c_load);
      }
      cp_async_commit();
    }
    const uint32_t k_base = s_k + stage * kTileBytes + lf.k_off;
    const uint32_t v_base = s_v + stage * kTileBytes + lf.v_off;
    const int kv0 = range.begin + tile_of(t) * KVT;
    const int kv1 = min(kv0 + KVT, range.end);
    const bool partial = V::kHasMask && cls == TileClass::kPartial;
    prefill_stage_math<V, T, Tile>(var, q_frag, q_base, k_base, v_base,
                                   keys.block(stage), kv0, kv1, partial, q0, q1, map, rows, mult,
                                   sm_scale, o, m, l);
    stage = stage + 1 == STAGES ? 0 : stage + 1;
    // The next tile's values, into the next stage's block.
    if (pend_t[0] < num_tiles) keys.write(tile_of(pend_t[0]), stage);
  }
  cp_async_wait<0>();
  return saw_bad;
}

}  // namespace attnc
