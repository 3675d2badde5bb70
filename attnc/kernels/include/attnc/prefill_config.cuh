// Owns: the tile shapes of the FA2 prefill kernel: for each head_dim, the CTA shapes for
// 16, 64 and 128 packed query rows (warps, m16 tiles per warp, keys per pipeline stage and
// per S tile, pipeline depth, whether Q stays in registers), their shared-memory size, and the
// choice of query tokens per work item that attnc_prefill_tile_q_tokens reports to the planner.
#pragma once

namespace attnc {

// One CTA shape. Rows = 16 * MMA_Q * WARPS packed (token, head) rows; every warp owns
// 16 * MMA_Q of them and walks the whole KV range. A pipeline stage holds KV_TILE keys, computed
// as KV_TILE / KV_SUB S tiles of KV_SUB keys (fewer barriers, cp.async rounds and tile
// classifications per key than one S tile per stage, at the registers of a KV_SUB-key S tile).
template <int HEAD_DIM, int WARPS, int MMA_Q, int KV_TILE, int STAGES, bool Q_IN_REGS,
          int MIN_BLOCKS, int KV_SUB = KV_TILE>
struct PrefillTile {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kWarps = WARPS;
  static constexpr int kThreads = 32 * WARPS;
  static constexpr int kMmaQ = MMA_Q;
  static constexpr int kRows = 16 * MMA_Q * WARPS;
  static constexpr int kKvTile = KV_TILE;
  static constexpr int kKvSub = KV_SUB;
  static constexpr int kStages = STAGES;
  static constexpr bool kQInRegs = Q_IN_REGS;
  static constexpr int kMinBlocks = MIN_BLOCKS;
  // 16-bit elements: Q tile + STAGES x (K tile + V tile).
  static constexpr int kSmemBytes = 2 * HEAD_DIM * (kRows + 2 * STAGES * KV_TILE);
  static_assert(KV_SUB % 16 == 0 && KV_TILE % KV_SUB == 0,
                "the KV stage must be a multiple of the S tile, itself a multiple of 16");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
};

// Shapes per head_dim: Small (16 rows), Medium (64 rows) and Large (the most rows; long
// queries). Measured alternatives are listed in tests/gpu/kernel_harness/NOTES.md.
// ATTNC_PREFILL_TUNE selects alternative Large shapes: 1 = stages of two S tiles (64 keys as
// 2 x 32 at d=128, 128 as 2 x 64 at d=64), what the runtime builds for sm_90
// (modules.prefill_arch_flags; with nvcc 13.0 its d=128 kernel has 16 bytes of stack on
// sm_90a, two LDL a stage: tests/codegen/test_fa2_staged_keys_compile.py; it spills a few bytes on
// sm_80); 2 = 64-key stages of two 32-key S tiles at d=256 (one CTA per SM, a timing
// experiment of tests/gpu/kernel_harness, untimed); 0, the default, for other archs.
#ifndef ATTNC_PREFILL_TUNE
#define ATTNC_PREFILL_TUNE 0
#endif
template <int HEAD_DIM>
struct PrefillShapes;

// The family of d=64 and d=128: a one-warp Small and a four-warp Medium that keep Q in
// registers over 64-key stages, and a Large of four warps x 2 m16 tiles over LARGE_KV-key
// stages (ATTNC_PREFILL_TUNE 1: TUNED_KV-key stages of TUNED_SUB-key S tiles).
template <int HEAD_DIM, int MEDIUM_BLOCKS, int LARGE_KV, int TUNED_KV, int TUNED_SUB>
struct RegisterQShapes {
  using Small = PrefillTile<HEAD_DIM, 1, 1, 64, 2, true, 8>;
  using Medium = PrefillTile<HEAD_DIM, 4, 1, 64, 2, true, MEDIUM_BLOCKS>;
#if ATTNC_PREFILL_TUNE == 1
  using Large = PrefillTile<HEAD_DIM, 4, 2, TUNED_KV, 2, false, 2, TUNED_SUB>;
#else
  using Large = PrefillTile<HEAD_DIM, 4, 2, LARGE_KV, 2, false, 2>;
#endif
};

template <>
struct PrefillShapes<64> : RegisterQShapes<64, 3, 64, 128, 64> {};

template <>
struct PrefillShapes<128> : RegisterQShapes<128, 2, 32, 64, 32> {};

template <>
struct PrefillShapes<256> {
  using Small = PrefillTile<256, 1, 1, 16, 2, false, 4>;
  using Medium = PrefillTile<256, 4, 1, 32, 2, false, 2>;
#if ATTNC_PREFILL_TUNE == 2
  using Large = PrefillTile<256, 4, 1, 64, 2, false, 1, 32>;
#else
  using Large = Medium;
#endif
};

template <int HEAD_DIM>
constexpr int prefill_max_rows() {
  return PrefillShapes<HEAD_DIM>::Large::kRows;
}

// Query tokens per work item for a request shape: the smallest row count among 16, 64 and
// the Large shape's that holds max_q_len * group rows (the Large one when none does), divided
// by the group. 0 when the group alone does not fit the largest tile or an argument is out of
// range.
template <int HEAD_DIM>
inline int prefill_tile_q_tokens(int head_dim, int group, int max_q_len) {
  if (head_dim != HEAD_DIM || group <= 0 || max_q_len < 0) return 0;
  const long long need = static_cast<long long>(max_q_len) * group;
  const int shapes[3] = {16, 64, prefill_max_rows<HEAD_DIM>()};
  for (int rows : shapes) {
    if (rows < group) continue;
    if (need <= rows || rows == prefill_max_rows<HEAD_DIM>()) return rows / group;
  }
  return 0;
}

}  // namespace attnc
