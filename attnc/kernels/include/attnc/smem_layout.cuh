// Owns: the shared-memory layout of a [rows, HEAD_DIM] tile of 16-bit values: rows stored
// one after another (HEAD_DIM * 2 bytes each, a multiple of 128), each row split into 16-byte
// chunks whose index is XOR-swizzled with (row % 8), so the 8 rows an ldmatrix phase reads and
// the rows cp.async writes fall on distinct bank groups. Tiles must start 128-byte aligned.
#pragma once

#include <stdint.h>

namespace attnc {

template <int HEAD_DIM>
struct SwizzledRows {
  static_assert(HEAD_DIM % 64 == 0, "swizzled rows need a multiple of 8 chunks of 16 bytes");
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static constexpr int kRowBytes = HEAD_DIM * 2;

  // Byte offset of chunk `chunk` (8 elements) of row `row`.
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
  }

  // Fragment walks. `base` is the address of (row0 + r, x) with row0 % 8 == 0 and x in {0, 1}
  // (the lane's part of an ldmatrix phase). Returns the address of
  // (row0 + r + 8 * row_blocks8, x + chunk_step) for an even chunk_step, with one XOR and a
  // compile-time displacement when the steps are compile-time constants.
  __device__ __forceinline__ static uint32_t walk(uint32_t base, int row_blocks8, int chunk_step) {
    return (base ^ static_cast<uint32_t>((chunk_step & 7) << 4)) +
           static_cast<uint32_t>((chunk_step >> 3) * 128 + row_blocks8 * 8 * kRowBytes);
  }
};

}  // namespace attnc
