// Owns: the tile shapes of the FA2 prefill kernel: for each head_dim, the CTA shapes for
// 16, 64 and 128 packed query rows (warps, m16 tiles per warp, KV tile width, pipeline depth,
// whether Q stays in registers), their shared-memory size, and the choice of query tokens
// per work item that attnc_prefill_tile_q_tokens reports to the planner.
#pragma once

namespace attnc {

// One CTA shape. Rows = 16 * MMA_Q * WARPS packed (token, head) rows; every warp owns
// 16 * MMA_Q of them and walks the whole KV range.
template <int HEAD_DIM, int WARPS, int MMA_Q, int KV_TILE, int STAGES, bool Q_IN_REGS,
          int MIN_BLOCKS>
struct PrefillTile {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kWarps = WARPS;
  static constexpr int kThreads = 32 * WARPS;
  static constexpr int kMmaQ = MMA_Q;
  static constexpr int kRows = 16 * MMA_Q * WARPS;
  static constexpr int kKvTile = KV_TILE;
  static constexpr int kStages = STAGES;
  static constexpr bool kQInRegs = Q_IN_REGS;
  static constexpr int kMinBlocks = MIN_BLOCKS;
  // 16-bit elements: Q tile + STAGES x (K tile + V tile).
  static constexpr int kSmemBytes = 2 * HEAD_DIM * (kRows + 2 * STAGES * KV_TILE);
  static_assert(KV_TILE % 16 == 0, "KV tile must be a multiple of 16");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
};

// Shapes per head_dim: Small (16 rows), Medium (64 rows) and Large (the most rows; long
// queries). Measured alternatives are listed in tests/gpu/kernel_harness/NOTES.md.
template <int HEAD_DIM>
struct PrefillShapes;

template <>
struct PrefillShapes<64> {
  using Small = PrefillTile<64, 1, 1, 64, 2, true, 8>;
  using Medium = PrefillTile<64, 4, 1, 64, 2, true, 3>;
  using Large = PrefillTile<64, 4, 2, 64, 2, false, 2>;
};

template <>
struct PrefillShapes<128> {
  using Small = PrefillTile<128, 1, 1, 64, 2, true, 8>;
  using Medium = PrefillTile<128, 4, 1, 64, 2, true, 2>;
  using Large = PrefillTile<128, 4, 2, 32, 2, false, 2>;
};

template <>
struct PrefillShapes<256> {
  using Small = PrefillTile<256, 1, 1, 16, 2, false, 4>;
  using Medium = PrefillTile<256, 4, 1, 32, 2, false, 2>;
  using Large = Medium;
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
