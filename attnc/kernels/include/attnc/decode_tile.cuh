// Owns: the CTA shapes of the decode kernel: DecodeTile (warps, packed query rows, KV tile,
// pipeline stages, occupancy target, shared-memory budget) and DecodeTileFor, the tuned shape
// for each (head_dim, 16-row mma tiles per item) the launcher instantiates.
#pragma once

namespace attnc {

// Compile-time knob (the default is the tuned choice; the decode harness builds the other):
// ATTNC_DECODE_CROSS_ITEM: 1 lets the loads of a CTA's next work item start while the
//   current item still computes (one pipeline over all items of the CTA); 0 refills the
//   pipeline at every item start.
#ifndef ATTNC_DECODE_CROSS_ITEM
#define ATTNC_DECODE_CROSS_ITEM 1
#endif

// One CTA shape: 4 warps x 16 KV tokens per tile, 16 * MQ packed query rows, STAGES K/V
// tiles in flight, at least MIN_BLOCKS CTAs per SM. CROSS_ITEM: the pipeline runs across
// work items, which needs one Q slot per stage (an item's Q arrives with its first tile);
// otherwise a single Q slot.
template <int HEAD_DIM, int MQ, int STAGES, int MIN_BLOCKS, bool CROSS_ITEM>
struct DecodeTile {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMmaQ = MQ;
  static constexpr int kRows = 16 * MQ;
  static constexpr int kWarpKv = 16;
  static constexpr int kKvTile = kWarps * kWarpKv;
  static constexpr int kStages = STAGES;
  static constexpr int kMinBlocks = MIN_BLOCKS;
  static constexpr bool kCrossItem = CROSS_ITEM;
  // 16-byte K (and V) copies per thread and tile.
  static constexpr int kCopiesPerThread = kKvTile * (HEAD_DIM / 8) / kThreads;
  // The loader fetches the page ids of the next tile one tile ahead, in registers: only
  // where the accumulators leave room for them (16 rows, d <= 128).
  static constexpr bool kPrefetchPageIds = MQ == 1 && HEAD_DIM <= 128;
  static constexpr int kQSlots = CROSS_ITEM ? STAGES : 1;
  static constexpr int kQBytes = 2 * HEAD_DIM * kRows;            // one Q slot
  static constexpr int kHalfStageBytes = 2 * HEAD_DIM * kKvTile;  // K (or V) of one stage
  // Warp-state exchange of the combine: per slot and lane, (m, l) of each of its rows.
  static constexpr int kMlBytes = 2 * 32 * 2 * MQ * 8;
  static constexpr int kSmemBytes = kQSlots * kQBytes + 2 * STAGES * kHalfStageBytes + kMlBytes;
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static_assert((kKvTile * (HEAD_DIM / 8)) % kThreads == 0,
                "KV tile chunks must split evenly over threads");
  // The combine keeps one warp's O fragments (fp32) in the K or the V half of a free stage.
  static_assert(kRows * HEAD_DIM * 4 <= kHalfStageBytes, "combine slot must fit a half stage");
};

template <int HEAD_DIM, int MQ>
struct DecodeTileFor;
template <>
struct DecodeTileFor<64, 1> {
  using type = DecodeTile<64, 1, 4, 3, ATTNC_DECODE_CROSS_ITEM != 0>;
};
// 32 rows at d=64: under the 168 registers of three CTAs per SM the masked variants spill;
// two CTAs per SM.
template <>
struct DecodeTileFor<64, 2> {
  using type = DecodeTile<64, 2, 3, 2, ATTNC_DECODE_CROSS_ITEM != 0>;
};
template <>
struct DecodeTileFor<128, 1> {
  using type = DecodeTile<128, 1, 3, 2, ATTNC_DECODE_CROSS_ITEM != 0>;
};
// 32 rows at d=128: one Q slot per stage would not leave room for two CTAs per SM.
template <>
struct DecodeTileFor<128, 2> {
  using type = DecodeTile<128, 2, 3, 2, false>;
};
// d=256: two stages keep the shared memory of one CTA under the 163 KB of sm_80; the O
// accumulators take half of the 255 registers, which leave no room for the loader's own item
// of the cross-item pipeline (it spills), so the pipeline refills at every item.
template <>
struct DecodeTileFor<256, 1> {
  using type = DecodeTile<256, 1, 2, 1, false>;
};

template <int HEAD_DIM>
constexpr int decode_max_rows() {
  return HEAD_DIM <= 128 ? 32 : 16;
}

}  // namespace attnc
