// Owns: the shared-memory layout of a [rows, HEAD_DIM] tile of 16-bit values: rows stored
// one after another, each row split into 16-byte chunks whose index is XOR-swizzled with
// (row % 8) so that the 8 rows an ldmatrix phase reads (and the rows cp.async writes) fall on
// distinct bank groups.
#pragma once

namespace attnc {

template <int HEAD_DIM>
struct SwizzledRows {
  static_assert(HEAD_DIM % 64 == 0, "swizzled rows need a multiple of 8 chunks of 16 bytes");
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row

  // Element offset of chunk `chunk` (8 elements) of row `row`.
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return row * HEAD_DIM + ((chunk ^ (row & 7)) << 3);
  }
};

}  // namespace attnc
