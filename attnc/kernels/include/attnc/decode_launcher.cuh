// Owns: the host side of the decode for one (variant V, dtype T, HEAD_DIM): argument
// checks, the CTA shape from args.rows_per_item, the dynamic shared-memory limit, the
// occupancy query the planner uses, the decode and merge launches, and
// ATTNC_DEFINE_DECODE_MODULE, which defines the extern "C" functions of decode_args.h.
// A generated module is exactly:
//   #include "attnc/decode_launcher.cuh"
//   <the variant functor struct>
//   ATTNC_DEFINE_DECODE_MODULE(Name, __nv_bfloat16 or half, HEAD_DIM)
//
// Facts the caller relies on:
// - The launch reads work counts from the device workspace only, so the same args (same
//   grid, same pointers) stay valid for every later plan of the same shape: CUDA graphs
//   replay after a new plan().
// - rows_per_item must be the value attnc_decode_shape returned (16, or 32 for head_dim
//   <= 128); otherwise ATTNC_E_BAD_TILE.
// - q, k, v, o must be 16-byte aligned, q/kv strides multiples of 8 elements, o strides
//   multiples of 4 (8-byte stores). Otherwise ATTNC_E_BAD_LAYOUT.
// - Rows with no visible key: O 0, LSE -inf. normalize = none: O is the plain weighted sum
//   and LSE 0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstring>
#include <type_traits>

#include "decode_args.h"
#include "decode_kernel.cuh"
#include "decode_merge.cuh"
#include "launch_checks.h"
#include "mask_math.cuh"
#include "module_exports.h"
#include "variant_contract.cuh"

namespace attnc {

namespace decode_detail {

template <class V>
int check_args(const AttncDecodeArgs& a, int head_dim) {
  const int status = launch_checks::check_params_and_heads<V>(a, head_dim);
  if (status != 0) return status;
  if (a.page_size < 1 || a.num_pages < 0 || a.num_ctas < 0 || a.merge_ctas < 0)
    return ATTNC_E_BAD_LAYOUT;
  if (a.header == nullptr || a.cta_indptr == nullptr || a.items == nullptr ||
      a.req_page_begin == nullptr || a.req_kv_len == nullptr || a.page_ids == nullptr ||
      a.merge_items == nullptr || a.part_o == nullptr || a.part_lse == nullptr)
    return ATTNC_E_BAD_LAYOUT;
  if (!launch_checks::aligned16(a.items) || !launch_checks::aligned16(a.part_o))
    return ATTNC_E_BAD_LAYOUT;
  return launch_checks::check_qkvo_layout(a, 4);
}

template <class V, class T, class Tile>
cudaError_t prepare_kernel() {
  constexpr int smem = Tile::kSmemBytes;
  if (smem <= 48 * 1024) return cudaSuccess;
  // Once per process and instantiation (the attribute sticks to the function).
  static const cudaError_t status = cudaFuncSetAttribute(
      decode_kernel<V, T, Tile>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return status;
}

template <class V, class T, class Tile>
int launch_tile(const AttncDecodeArgs& a, const typename V::Params& params,
                cudaStream_t stream) {
  const cudaError_t st = prepare_kernel<V, T, Tile>();
  if (st != cudaSuccess) return st;
  if (a.num_ctas > 0) {
    decode_kernel<V, T, Tile><<<a.num_ctas, Tile::kThreads, Tile::kSmemBytes, stream>>>(a, params);
  }
  return cudaGetLastError();
}

template <class V, class T, class Tile>
int occupancy(int* ctas_per_sm) {
  const cudaError_t st = prepare_kernel<V, T, Tile>();
  if (st != cudaSuccess) return st;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, decode_kernel<V, T, Tile>,
                                                       Tile::kThreads, Tile::kSmemBytes);
}

}  // namespace decode_detail

template <class V, class T, int HEAD_DIM>
int decode_shape(int32_t head_dim, int32_t rows_needed, int32_t* out) {
  if (out == nullptr) return ATTNC_E_BAD_LAYOUT;
  if (head_dim != HEAD_DIM) return ATTNC_E_BAD_HEAD_DIM;
  if (rows_needed <= 0) return ATTNC_E_BAD_TILE;
  int ctas = 0;
  int rows = 16;
  int status;
  if (rows_needed <= 16 || decode_max_rows<HEAD_DIM>() == 16) {
    using Tile = typename DecodeTileFor<HEAD_DIM, 1>::type;
    status = decode_detail::occupancy<V, T, Tile>(&ctas);
  } else {
    using Tile = typename DecodeTileFor<HEAD_DIM, (HEAD_DIM <= 128 ? 2 : 1)>::type;
    status = decode_detail::occupancy<V, T, Tile>(&ctas);
    rows = Tile::kRows;
  }
  out[0] = rows;
  out[1] = DecodeTileFor<HEAD_DIM, 1>::type::kKvTile;
  out[2] = ctas;
  return status;
}

template <class V, class T, int HEAD_DIM>
int launch_decode(const AttncDecodeArgs& a, cudaStream_t stream) {
  static_assert(launch_checks::Instantiation<V, T, HEAD_DIM>::kOk, "");
  const int status = decode_detail::check_args<V>(a, HEAD_DIM);
  if (status != 0) return status;
  const typename V::Params params = launch_checks::read_params<V>(a);
  int rc;
  if (a.rows_per_item == 16) {
    rc = decode_detail::launch_tile<V, T, typename DecodeTileFor<HEAD_DIM, 1>::type>(a, params,
                                                                                    stream);
  } else if (a.rows_per_item == 32 && HEAD_DIM <= 128) {
    rc = decode_detail::launch_tile<V, T,
                                    typename DecodeTileFor<HEAD_DIM, (HEAD_DIM <= 128 ? 2 : 1)>::type>(
        a, params, stream);
  } else {
    return ATTNC_E_BAD_TILE;
  }
  if (rc != 0) return rc;
  if ((a.flags & ATTNC_DECODE_FLAG_MERGE) && a.merge_ctas > 0) {
    decode_merge_kernel<V, T, HEAD_DIM><<<a.merge_ctas, 128, 0, stream>>>(a, params);
    rc = cudaGetLastError();
  }
  return rc;
}

}  // namespace attnc

// Defines attnc_decode, attnc_decode_abi_version and attnc_decode_shape for one variant
// type, one dtype and one head_dim.
#define ATTNC_DEFINE_DECODE_MODULE(V, T, HEAD_DIM)                                         \
  ATTNC_DEFINE_LAUNCH_ENTRY(attnc_decode, AttncDecodeArgs,                                 \
                            (::attnc::launch_decode<V, T, HEAD_DIM>),                      \
                            ATTNC_DECODE_ABI_VERSION)                                      \
  ATTNC_EXPORT int attnc_decode_shape(int32_t head_dim, int32_t rows_needed, int32_t* out) { \
    return ::attnc::decode_shape<V, T, HEAD_DIM>(head_dim, rows_needed, out);              \
  }
