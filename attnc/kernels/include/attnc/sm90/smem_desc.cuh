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

// A 128B-swizzled operand's descriptor kept as its two 32-bit halves: `lo` holds the start
// address (bits 0-13, address >> 4) and the leading byte offset (bits 16-29), `hi` the stride
// byte offset (bits 32-45) and the swizzle mode (bits 62-63, 1 = 128-byte swizzle). Moving
// inside a tile only adds to the address field, a 32-bit add on `lo` (shared addresses stay
// below 2^18, so the field never carries into the offset); `hi` stays one constant, which
// keeps the wgmma issue free of 64-bit arithmetic.
struct SmemDesc {
  uint32_t lo;
  uint32_t hi;

  __device__ __forceinline__ static SmemDesc make(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return SmemDesc{((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16),
                    ((sbo & 0x3FFFF) >> 4) | (1u << 30)};
  }
  // The same descriptor read from lane 0 at the point of use: the compiler then knows it is
  // warp-uniform and keeps the k-steps' descriptors in uniform registers (one move from the
  // vector side per use instead of two per k-step). Built per use, it is also not hoisted out
  // of the KV loop as one register pair per k-step (a per-thread base, such as a warpgroup's
  // rows of the Q tile, is not uniform to the compiler, and eight hoisted pairs made heavier
  // variants spill). Every lane of the warp must call it.
  __device__ __forceinline__ SmemDesc warp_uniform() const {
    return SmemDesc{__shfl_sync(0xffffffffu, lo, 0), hi};
  }
  // The descriptor of the same operand `bytes` further on (bytes a multiple of 16).
  __device__ __forceinline__ uint64_t at(uint32_t bytes) const {
    return (static_cast<uint64_t>(hi) << 32) | (lo + (bytes >> 4));
  }
};

// K-major operand (rows along M or N, the 16 K values of one k-step contiguous) at `tile`:
// 8-row groups are 1024 bytes apart (the stride byte offset); the leading byte offset is
// unused for swizzled K-major layouts (16).
__device__ __forceinline__ SmemDesc desc_k_major(uint32_t tile) {
  return SmemDesc::make(tile, 16, 1024);
}

// A K-major operand of 16 columns stored without swizzle ("interleaved"): 8-row x 16-byte core
// matrices, the two of a row group (columns 0-7, 8-15) 128 bytes apart (the leading byte
// offset), row groups 256 bytes apart (the stride byte offset); `hi` has swizzle mode 0.
__device__ __forceinline__ SmemDesc desc_k_major_interleaved(uint32_t block) {
  return SmemDesc{((block & 0x3FFFF) >> 4) | ((128u >> 4) << 16), 256u >> 4};
}

// Byte offset of 16-byte chunk `chunk` (0 or 1) of row `row` in such a block.
__device__ __forceinline__ constexpr uint32_t interleaved_offset(int row, int chunk) {
  return static_cast<uint32_t>((row >> 3) * 256 + chunk * 128 + (row & 7) * 16);
}

// Byte offset of k-step kk (16 columns) in a K-major tile of `rows` rows: 32 bytes further
// inside the 128-byte row, and every 4 k-steps the next column block.
__device__ __forceinline__ constexpr uint32_t k_major_step(int rows, int kk) {
  return static_cast<uint32_t>((kk >> 2) * rows * 128 + (kk & 3) * 32);
}

// MN-major B operand (K along the tile's rows, N along its columns), e.g. V in O += P V, at
// `tile` of `rows` rows: column blocks of 64 N values are rows * 128 bytes apart (the leading
// byte offset), 8-row groups along K 1024 bytes (the stride byte offset).
__device__ __forceinline__ SmemDesc desc_mn_major(uint32_t tile, int rows) {
  return SmemDesc::make(tile, static_cast<uint32_t>(rows * 128), 1024);
}

// Byte offset of k-step kk (rows 16kk .. 16kk + 15) in an MN-major tile.
__device__ __forceinline__ constexpr uint32_t mn_major_step(int kk) {
  return static_cast<uint32_t>(kk * 16 * 128);
}

}  // namespace sm90
}  // namespace attnc
