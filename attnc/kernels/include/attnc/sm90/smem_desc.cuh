// Owns: the 64-bit shared-memory matrix descriptors of wgmma for tiles stored with the 128-byte
// swizzle (the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B), and the byte offsets of that
// layout for tiles written by threads (cp.async) in the same shape.
//
// Tile layout ("column blocks"): a [rows x cols] tile of 16-bit values is stored as cols / 64
// column blocks one after another, each [rows x 128 bytes]; inside a block, 16-byte chunk c of
// row r lives at r * 128 + ((c ^ (r % 8)) << 4). Every block starts 1024-byte aligned, so an
// 8-row group (1024 bytes) is one swizzle atom.
#pragma once

#include <stdint.h>

namespace attnc {
namespace sm90 {

// Byte offset of 16-byte chunk `chunk` (8 elements; chunk < cols / 8) of row `row` in a tile of
// `rows` rows laid out in 128-byte swizzled column blocks.
__device__ __forceinline__ uint32_t swizzled_offset(int rows, int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * rows * 128 + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

// Descriptor of a 128B-swizzled operand at shared address `addr` with leading byte offset
// `lbo` and stride byte offset `sbo` (both multiples of 16).
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // layout type 1: 128-byte swizzle
  return desc;
}

// K-major operand (rows along M or N, the 16 K values of one k-step contiguous): the tile at
// `tile` with `rows` rows; k-step kk (16 columns) starts 32 bytes further inside the 128-byte
// row, and every 4 k-steps at the next column block. 8-row groups are 1024 bytes apart.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile, int rows, int kk) {
  const uint32_t addr = tile + static_cast<uint32_t>((kk >> 2) * rows * 128 + (kk & 3) * 32);
  return make_desc_sw128(addr, 16, 1024);
}

// MN-major B operand (K along the tile's rows, N along its columns), e.g. V in O += P V: k-step
// kk covers rows 16kk..16kk+15; column blocks of 64 N values are rows * 128 bytes apart (the
// leading byte offset), 8-row groups along K 1024 bytes (the stride byte offset).
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile, int rows, int kk) {
  const uint32_t addr = tile + static_cast<uint32_t>(kk * 16 * 128);
  return make_desc_sw128(addr, static_cast<uint32_t>(rows * 128), 1024);
}

// desc_k_major(tile, rows, kk) from desc_k_major(tile, rows, 0): the start address moves by
// the byte offset of k-step kk (a constant when kk is), nothing else changes.
__device__ __forceinline__ uint64_t desc_k_step(uint64_t desc0, int rows, int kk) {
  return desc0 + static_cast<uint64_t>(((kk >> 2) * rows * 128 + (kk & 3) * 32) >> 4);
}

// The value, hidden from the optimiser: a descriptor rebuilt from it per use is not hoisted
// out of the KV loop as one register pair per k-step.
__device__ __forceinline__ uint64_t opaque(uint64_t x) {
  uint64_t y;
  asm volatile("mov.b64 %0, %1;\n" : "=l"(y) : "l"(x));
  return y;
}

}  // namespace sm90
}  // namespace attnc
