// Owns: the CTA shape of the Hopper prefill per head_dim (warp roles, query rows, keys per KV
// stage, pipeline depth, register split), its shared-memory map (Q tile, K and V stages,
// mbarriers) and the query tokens per work item that attnc_prefill_tile_q_tokens reports.
//
// One CTA = warpgroup 0 (producer: K/V loads) + kConsumers consumer warpgroups of 64 packed
// query rows each: three (192 rows) for the lighter variants at head_dim 64 and 128 (see
// Sm90Consumers), so one warpgroup's softmax runs under two others' GEMMs, and each K/V
// stage serves 192 rows; two (128 rows) otherwise. Keys per stage: sm90_default_kv_tile,
// and Sm90TwoShapeOf for head_dim 256. Timing experiments (tests/gpu/kernel_harness/run_sm90.sh
// EXTRA=...) may override ATTNC_SM90_STAGES, ATTNC_SM90_KV_TILE and ATTNC_SM90_HEAVY_KV_TILE;
// ATTNC_SM90_NO_TMA makes the launcher load every K/V tile by cp.async. Tiles live in
// 128-byte swizzled column blocks (smem_desc.cuh); every tile starts 1024-byte aligned.
#pragma once

#include <stdint.h>

#include "../key_values_stage.cuh"
#include "../variant_contract.cuh"

namespace attnc {
namespace sm90 {

// Keys per stage (= S tile) by default: 128 at head_dim 64 and for two consumers at 128; 64
// at 256; 80 for three consumers at 128 (their 160 registers hold O and an 80-key S: with 96
// keys ptxas serialises the wgmmas and spills; 80 pays a tile's bookkeeping on a quarter more
// keys than 64). Sm90TwoShapeOf gives light variants with affine scores 80 at 256.
constexpr int sm90_default_kv_tile(int head_dim, int consumers) {
  return head_dim == 256 ? 64 : head_dim == 128 && consumers == 3 ? 80 : 128;
}

// KEY_BYTES: the bytes of one key's staged values (V::KeyValues, staged_keys.cuh), 0 for a
// variant that stages none; each stage then holds a block of kKvTile of them.
template <int HEAD_DIM, int CONSUMERS = 2, int KV_TILE = sm90_default_kv_tile(HEAD_DIM, CONSUMERS),
          int KEY_BYTES = 0>
struct PrefillSm90Shape {
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
                "attnc sm90 prefill: head_dim must be 64, 128 or 256");
  static_assert(CONSUMERS == 2 || (CONSUMERS == 3 && HEAD_DIM <= 128),
                "attnc sm90 prefill: three consumers only at head_dim 64 and 128");
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kConsumers = CONSUMERS;  // consumer warpgroups
  static constexpr int kRows = 64 * kConsumers;  // packed query rows per item
  static_assert(KV_TILE % 16 == 0 && KV_TILE >= 64 && KV_TILE <= 144,
                "attnc sm90 prefill: 64 to 144 keys per stage, a multiple of 16");
#ifdef ATTNC_SM90_KV_TILE
  static constexpr int kKvTile = ATTNC_SM90_KV_TILE;  // timing experiments only
#else
  static constexpr int kKvTile = KV_TILE;  // keys per stage (= S tile)
#endif
#ifdef ATTNC_SM90_STAGES
  static constexpr int kStages = ATTNC_SM90_STAGES;  // timing experiments only
#else
  // Four stages at head_dim 64 (128 keys; 152 KB with three consumers): sliding window 1024
  // at 8K ran 5% faster than on three, causal and soft-cap the same (RESULTS.md, run 46).
  static constexpr int kStages =
      HEAD_DIM == 256 || kKvTile > 128 ? 2 : kKvTile <= 80 || HEAD_DIM == 64 ? 4 : 3;
#endif
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // Register split of the CTA's pool (kThreads x the launch bound's share, 168 for 384
  // threads, 128 for 512): the producer gathers paged rows and classifies tiles (64-bit math
  // for union masks) in kProducerRegs; consumers hold O, S and P in kConsumerRegs (no spills
  // at any head_dim, checked by tests/codegen/test_sm90_compile.py).
  static constexpr int kProducerRegs = kConsumers == 2 ? 72 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 216 : 160;
  static constexpr int kLaunchRegs = (65536 / kThreads) & ~7;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= kThreads * kLaunchRegs,
                "more registers than one CTA holds");
  static constexpr int kConsumerThreads = 128 * kConsumers;  // arrivals that free a stage

  static constexpr uint32_t kQBytes = kRows * HEAD_DIM * 2;
  static constexpr uint32_t kTileBytes = kKvTile * HEAD_DIM * 2;
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kTileBytes;
  // The blocks of a stepped bias in the QK GEMM (kGemmBiasVariant, gemm_bias.cuh), 16
  // columns of 16-bit values each, without swizzle: the key offsets (kKvTile rows) and the
  // rows' coefficients (kRows rows). Held by the three-consumer shape at head_dim 128.
  static constexpr bool kHasBiasBlocks = kConsumers == 3 && HEAD_DIM == 128;
  static constexpr uint32_t kBiasKOffset = kVOffset + kStages * kTileBytes;
  static constexpr uint32_t kBiasKBytes = kHasBiasBlocks ? kKvTile * 32 : 0;
  static constexpr uint32_t kBiasQOffset = kBiasKOffset + kBiasKBytes;
  static constexpr uint32_t kBiasQBytes = kHasBiasBlocks ? kRows * 32 : 0;
  static constexpr uint32_t kBarOffset = kBiasQOffset + kBiasQBytes;
  static constexpr uint32_t kBarBytes = 4 * kStages * 8;  // full/empty x K/V per stage
  static constexpr uint32_t kInfoOffset = kBarOffset + kBarBytes;
  static constexpr uint32_t kInfoBytes = kStages * 32;  // one StageInfo per stage
  // Two words through which the producer's thread 0 hands the item index it took to the
  // other producer threads (ItemOrder, item_order.cuh).
  static constexpr uint32_t kFetchOffset = kInfoOffset + kInfoBytes;
  // The staged key values of each stage (KEY_BYTES per key), 16-byte aligned.
  static constexpr int kKeyBytes = KEY_BYTES;
  static constexpr uint32_t kKeysOffset = (kFetchOffset + 8 + 15) & ~15u;
  static constexpr uint32_t kKeysBytes = kStages * kKvTile * KEY_BYTES;
  // + 1024: the dynamic shared-memory base is aligned up to 1024 bytes inside the kernel.
  static constexpr int kSmemBytes =
      static_cast<int>((KEY_BYTES > 0 ? kKeysOffset + kKeysBytes : kFetchOffset + 8) + 1024);
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm_90 CTA may hold");
};

// Shared-memory addresses of one CTA (base 1024-byte aligned).
template <class Shape>
struct PrefillSm90Smem {
  uint32_t base;

  __device__ __forceinline__ uint32_t q() const { return base; }
  __device__ __forceinline__ uint32_t k(int stage) const {
    return base + Shape::kKOffset + stage * Shape::kTileBytes;
  }
  __device__ __forceinline__ uint32_t v(int stage) const {
    return base + Shape::kVOffset + stage * Shape::kTileBytes;
  }
  // The bias blocks (kGemmBiasVariant, gemm_bias.cuh): key offsets and row coefficients.
  __device__ __forceinline__ uint32_t bias_k() const { return base + Shape::kBiasKOffset; }
  __device__ __forceinline__ uint32_t bias_q() const { return base + Shape::kBiasQOffset; }
  // Barriers: full_k, full_v (the producer's arrival + the stage's bytes), empty_k, empty_v
  // (every consumer thread arrives once it no longer reads the stage).
  __device__ __forceinline__ uint32_t full_k(int stage) const {
    return base + Shape::kBarOffset + 8 * stage;
  }
  __device__ __forceinline__ uint32_t full_v(int stage) const {
    return full_k(stage) + 8 * Shape::kStages;
  }
  __device__ __forceinline__ uint32_t empty_k(int stage) const {
    return full_k(stage) + 16 * Shape::kStages;
  }
  __device__ __forceinline__ uint32_t empty_v(int stage) const {
    return full_k(stage) + 24 * Shape::kStages;
  }
  // The StageInfo the producer publishes with the stage's K (read after full_k).
  __device__ __forceinline__ uint32_t info(int stage) const {
    return base + Shape::kInfoOffset + 32 * stage;
  }
  // Word i (0 or 1) of the item index the producer's thread 0 took.
  __device__ __forceinline__ uint32_t fetched(int i) const {
    return base + Shape::kFetchOffset + 4 * i;
  }
  // The staged key values of a stage (Shape::kKeyBytes > 0, staged_keys.cuh).
  __device__ __forceinline__ uint32_t keys(int stage) const {
    return base + Shape::kKeysOffset + stage * Shape::kKvTile * Shape::kKeyBytes;
  }
};

// One 32-bit word of the CTA's shared memory (the map's single words: fetched,
// StageInfo::next). Volatile, so kept in order with each other and with the barriers (also
// volatile asm) that publish them; no "memory" clobber, which made ptxas spill consumers.
__device__ __forceinline__ void st_shared(uint32_t addr, int value) {
  asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(addr), "r"(value));
}
__device__ __forceinline__ int ld_shared(uint32_t addr) {
  int value;
  asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(value) : "r"(addr));
  return value;
}

// What the producer tells the consumers about the tile in a stage, written before its
// arrival on full_k: keys [kv0, kv1), the tile class, flags, and on the item's last stage the
// item the CTA runs next (the producer picks the CTA's items, ItemOrder; >= num_work when none
// is left).
struct StageInfo {
  static constexpr int kLast = 1;     // the item's last stage
  static constexpr int kNoTile = 2;   // the item has no non-empty tile: nothing was loaded
  static constexpr int kCpAsync = 4;  // filled by cp.async (consumers fence the proxies)
  static constexpr int kBadPage = 8;  // a row's page id was outside the cache (zero-filled):
                                      // the item's rows are written as NaN
  int kv0;
  int kv1;
  int cls;    // TileClass
  int flags;
  int next;   // the CTA's next item

  // Keys, class and flags in the first 16 bytes (one vector load), `next` in the next word.
  __device__ __forceinline__ void store(uint32_t addr) const {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(kv0), "r"(kv1),
                 "r"(cls), "r"(flags)
                 : "memory");
    st_shared(addr + 16, next);
  }
  // Reads all but `next` (read_next reads it only where it is used, so that it holds no
  // register while the stage's scores are computed).
  __device__ __forceinline__ static StageInfo load(uint32_t addr) {
    StageInfo s;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(s.kv0), "=r"(s.kv1), "=r"(s.cls), "=r"(s.flags)
                 : "r"(addr)
                 : "memory");
    s.next = 0;
    return s;
  }
  __device__ __forceinline__ static int read_next(uint32_t addr) { return ld_shared(addr + 16); }
};

// Named barrier ids (0 is __syncthreads): consumer w waits at kSchedBarrier + w for its turn
// to issue its GEMMs (consumers take turns round-robin); kQBarrier + w joins the threads of
// consumer w; kProducerBarrier the producer's threads.
constexpr int kMaxConsumers = 3;
constexpr int kSchedBarrier = 1;
constexpr int kQBarrier = kSchedBarrier + kMaxConsumers;
constexpr int kProducerBarrier = kQBarrier + kMaxConsumers;

// A softmax variant whose bias is stepped (linear in kv_idx, such as ALiBi) computes that bias
// in its QK GEMM at head_dim 128 (on three consumers): one more k-step of 16 adds
// (step / mult) x j, j the key's index in its tile, to every score, from three 16-bit pieces
// of step / mult per row and a block whose row j holds j (exact in bf16 and fp16 up to 256
// keys), both in shared memory (gemm_bias.cuh); the bias at the tile's first key joins the
// softmax once per row and tile (kRowsScaled, online_softmax.cuh). A tile's per-element work
// is then the identity score's. A warp whose rows do not fit (a step past kMaxStepPerKey, a multiplier
// that is not finite and positive) adds 0 in the GEMM and evaluates its bias per element.
template <class V, int HEAD_DIM>
constexpr bool kGemmBiasVariant = HEAD_DIM == 128 && V::kUseSoftmax && V::kAffineScore &&
                                  !V::kScoreIsIdentity && variant_bias_step<V>::value;

// Consumer warpgroups of variant V's kernel at HEAD_DIM: three at head_dim 64 and 128 for the
// lighter variants (softmax; at 64 also no stepped bias and no per-token mask tensor, whose
// data mask spills there with three), else two. A sink sets where a row's softmax starts (and,
// with an output transform, adds one term at its end) and adds nothing to the per-tile work,
// so a sink variant is light when its sink-free twin is (on two consumers the window-128 sink
// row ran 16% below its twin on three, RESULTS.md run 34). A stepped bias is light at 128,
// where the QK GEMM computes it (kGemmBiasVariant; ALiBi 8K 17% faster there with the KV walk
// from the diagonal back, RESULTS.md run 52).
// Three leave each consumer 160 registers: the other variants spill there at head_dim 64, and
// at 128 sigmoid ran slower with three (RESULTS.md, run 25). A module of a light
// variant holds both shapes; plans whose longest query is shorter than kThreeConsumersMinQ
// take two. ATTNC_SM90_CONSUMERS=2 or 3 forces the widest count at head_dim 64 and 128
// (timing experiments only; the runtime builds a light variant's module from two sources,
// which the forced count can contradict: WideShape's static_assert then stops the build).
// attnc/codegen/module.py (sm90_has_three_consumer_kernel) repeats the light-class rule.
template <class V, int HEAD_DIM>
struct Sm90Consumers {
  static constexpr bool kLight = V::kUseSoftmax &&
                                 (!variant_mask_reads_tokens<V>::value || HEAD_DIM == 128) &&
                                 (!variant_bias_step<V>::value || kGemmBiasVariant<V, HEAD_DIM>);
#ifdef ATTNC_SM90_CONSUMERS
  static constexpr int value = HEAD_DIM <= 128 ? ATTNC_SM90_CONSUMERS : 2;
#else
  static constexpr int value = HEAD_DIM <= 128 && kLight ? 3 : 2;
#endif
};

// The two-consumer shape of variant V's kernel at HEAD_DIM: at 256, 80-key stages (two of
// them, 224 KB) for light variants whose score is affine in S and whose mask reads no
// per-token tensor (the light class at head_dim 64): the 64-key kernel's per-tile work on a
// quarter more keys (RESULTS.md, run 32). 64 keys for the rest: soft-cap's tanh and the
// document mask spill with 80. Else sm90_default_kv_tile.
// ATTNC_SM90_HEAVY_KV_TILE (timing experiments only; 144 fits ALiBi and sigmoid in 216
// registers, with two stages: ALiBi -0.2%, sigmoid +2%, RESULTS.md run 33) sets it for the
// variants outside the light class at 128.
template <class V, int HEAD_DIM>
struct Sm90TwoKeys {
#ifdef ATTNC_SM90_HEAVY_KV_TILE
  static constexpr int kHeavy =
      HEAD_DIM == 128 && !Sm90Consumers<V, 128>::kLight ? ATTNC_SM90_HEAVY_KV_TILE : 0;
#else
  static constexpr int kHeavy = 0;
#endif
  static constexpr bool kLight256 =
      HEAD_DIM == 256 && Sm90Consumers<V, 64>::kLight && V::kAffineScore;
  static constexpr int value = kHeavy   ? kHeavy
                               : kLight256 ? 80
                                           : sm90_default_kv_tile(HEAD_DIM, 2);
};

// The bytes of one key's values that variant V's kernel of shape Base stages with each stage
// (sizeof V::KeyValues, staged_keys.cuh): 0 for a variant without key values, or where the
// blocks would not fit the CTA's shared memory (its consumers then read the tensors
// themselves, prefetched into L1 by the producer).
template <class V, class Base>
struct Sm90KeyBytes {
  static constexpr int kBytes = KeyValueBytes<V>::value;
  static constexpr bool kFits =
      Base::kSmemBytes + 16 + Base::kStages * Base::kKvTile * kBytes <= 227 * 1024;
  static constexpr int value = kFits ? kBytes : 0;
};

// A shape of variant V's kernel with the key values it stages.
template <class V, int HEAD_DIM, int CONSUMERS, int KV_TILE = sm90_default_kv_tile(HEAD_DIM, CONSUMERS)>
using Sm90ShapeWithKeys =
    PrefillSm90Shape<HEAD_DIM, CONSUMERS, KV_TILE,
                     Sm90KeyBytes<V, PrefillSm90Shape<HEAD_DIM, CONSUMERS, KV_TILE>>::value>;

template <class V, int HEAD_DIM>
using Sm90TwoShapeOf = Sm90ShapeWithKeys<V, HEAD_DIM, 2, Sm90TwoKeys<V, HEAD_DIM>::value>;

// The CTA shape of variant V's kernel at HEAD_DIM with the most consumers it takes (only the
// chosen shape is instantiated: a three-consumer shape at head_dim 256 does not exist).
template <class V, int HEAD_DIM, bool = Sm90Consumers<V, HEAD_DIM>::value == 3>
struct Sm90WidestShape {
  using Type = Sm90TwoShapeOf<V, HEAD_DIM>;
};
template <class V, int HEAD_DIM>
struct Sm90WidestShape<V, HEAD_DIM, true> {
  using Type = Sm90ShapeWithKeys<V, HEAD_DIM, 3>;
};
template <class V, int HEAD_DIM>
using Sm90ShapeOf = typename Sm90WidestShape<V, HEAD_DIM>::Type;

// Whether a plan tile of `rows` packed rows runs on variant V's three-consumer shape (the
// launch and the occupancy query ask this; prefill_sm90_tile_q_tokens sizes the tile).
template <class V, int HEAD_DIM>
__host__ __device__ constexpr bool takes_three_consumers(long long rows) {
  return Sm90ShapeOf<V, HEAD_DIM>::kConsumers == 3 && rows > PrefillSm90Shape<HEAD_DIM, 2>::kRows;
}

// The longest query from which a light variant's plan takes the three-consumer shape: its
// 192-row items are fewer, so shorter queries (at 1024 of 8192 keys: 171 items of one cost
// on 132 SMs, against 256 with 128 rows) balance worse (RESULTS.md, run 25). From 2048 (run
// 32, 80-key stages): kernel time at 2K -9% for sliding window 1024 and -11% for causal at
// head_dim 64, +0.4 to +2% for causal at 128.
constexpr int kThreeConsumersMinQ = 2048;

// Query tokens per work item: as many as fill the packed rows of the shape for max_q_len
// (0 when the group alone does not fit, or an argument is out of range).
template <class V, int HEAD_DIM>
inline int prefill_sm90_tile_q_tokens(int head_dim, int group, int max_q_len) {
  constexpr int kWidest = Sm90ShapeOf<V, HEAD_DIM>::kRows;
  if (head_dim != HEAD_DIM || group <= 0 || max_q_len < 0) return 0;
  constexpr int kTwo = PrefillSm90Shape<HEAD_DIM, 2>::kRows;
  const int rows = max_q_len >= kThreeConsumersMinQ ? kWidest : kTwo;
  return group <= rows ? rows / group : 0;
}

}  // namespace sm90
}  // namespace attnc
