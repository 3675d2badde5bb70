// Owns: TMA for the Hopper kernels: the device-side 3-D and 4-D tiled loads into shared memory
// that complete on an mbarrier, and the host-side encoding of the CUtensorMaps (rows of a
// ragged K/V tensor; rows of the pages of a paged cache) through the driver entry point
// (cuTensorMapEncodeTiled found with cudaGetDriverEntryPointByVersion, so nothing links
// libcuda).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace attnc {
namespace sm90 {

// Loads the box at coordinates (c0, c1, c2) of the tensor map `tmap` (a __grid_constant__
// kernel parameter) into shared memory at `dst`; its bytes count against mbarrier `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* tmap, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The 4-D form (paged caches: column, head, token in page, page).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* tmap, int c0, int c1,
                                            int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                  const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                  const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, looked up once; NULL when unavailable.
inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// Encodes a tiled map of `rank` dims (dims[0] innermost, 64 16-bit elements = one 128-byte
// row of the box) with the 128-byte swizzle; out-of-range elements read as zero. Returns
// false when the driver refuses (or is not found).
inline bool encode_swizzled_map(CUtensorMap* map, const void* base, bool bf16, cuuint32_t rank,
                                const cuuint64_t* dims, const cuuint64_t* strides_bytes,
                                const cuuint32_t* box) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr) return false;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      fn(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank,
         const_cast<void*>(base), dims, strides_bytes, box, elem_strides,
         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// A 3-D map over rows of 16-bit elements at `base`: dims (d0 innermost, d1, d2), byte strides
// of dims 1 and 2, box (64, 1, box_rows).
inline bool encode_rows_map(CUtensorMap* map, const void* base, bool bf16, uint64_t d0,
                            uint64_t d1, uint64_t d2, uint64_t stride1_bytes,
                            uint64_t stride2_bytes, uint32_t box_rows) {
  const cuuint64_t dims[3] = {d0, d1, d2};
  const cuuint64_t strides[2] = {stride1_bytes, stride2_bytes};
  const cuuint32_t box[3] = {64, 1, box_rows};
  return encode_swizzled_map(map, base, bf16, 3, dims, strides, box);
}

// A 4-D map over the pages of a paged cache: dims (d0 innermost columns, heads, tokens per
// page, pages) with the byte strides of the last three, box (64, 1, box_rows, 1). A box never
// leaves its page: rows past the page's end and pages past `pages` read as zero.
inline bool encode_pages_map(CUtensorMap* map, const void* base, bool bf16, uint64_t d0,
                             uint64_t heads, uint64_t page_size, uint64_t pages,
                             uint64_t head_stride_bytes, uint64_t tok_stride_bytes,
                             uint64_t page_stride_bytes, uint32_t box_rows) {
  const cuuint64_t dims[4] = {d0, heads, page_size, pages};
  const cuuint64_t strides[3] = {head_stride_bytes, tok_stride_bytes, page_stride_bytes};
  const cuuint32_t box[4] = {64, 1, box_rows, 1};
  return encode_swizzled_map(map, base, bf16, 4, dims, strides, box);
}

}  // namespace sm90
}  // namespace attnc
