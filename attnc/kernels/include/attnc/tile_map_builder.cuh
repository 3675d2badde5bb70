// Owns: the host side of the tile map (tile_map.cuh) in a prefill module: the argument checks
// and the launch of tile_map_kernel<V>, and ATTNC_DEFINE_TILE_MAP_BUILDER, which exports the
// builder the planner calls (`attnc_build_tile_map`: the classifier, optionally with the
// copies around it and the wait, AttncTileMapCopies; `attnc_queue_tile_map`: for a plan that
// does not wait, its lists up, the classifier and the item step, queued, AttncPlanUpload;
// the structs: tile_map_args.h).
#pragma once

#include <stdint.h>

#include <cstring>
#include <type_traits>

#include "abi_codes.h"
#include "item_map_order.cuh"
#include "tile_map.cuh"
#include "tile_map_args.h"
#include "variant_contract.cuh"

#ifdef __CUDACC__
#include <cuda_runtime.h>

namespace attnc {

// The checks and the launch of tile_map_kernel<V> (launch_tile_map's body for variants
// whose mask reads per-token tensors).
template <class V>
int launch_tile_map_kernel(const AttncTileMapArgs& a, cudaStream_t stream) {
  using P = typename V::Params;
  const bool size_ok = a.variant_params_size == static_cast<int64_t>(sizeof(P)) ||
                       (std::is_empty<P>::value && a.variant_params_size == 0);
  if (!size_ok || (!std::is_empty<P>::value && a.variant_params == nullptr))
    return ATTNC_E_BAD_PARAMS_SIZE;
  if (a.num_entries < 0 || a.batch_size < 0) return ATTNC_E_BAD_LAYOUT;
  if (a.num_entries == 0) return 0;
  if (a.tile_map == nullptr || a.tile_map_start == nullptr || a.qo_indptr == nullptr ||
      a.kv_token_start == nullptr || a.batch_size == 0)
    return ATTNC_E_BAD_LAYOUT;
  if (a.tile_q_tokens <= 0 || a.kv_block <= 0 || a.mask_heads < 1 ||
      a.mask_heads > a.num_qo_heads || a.num_kv_heads <= 0 ||
      a.num_qo_heads % a.num_kv_heads != 0)
    return ATTNC_E_BAD_LAYOUT;
  P params;
  if (!std::is_empty<P>::value) std::memcpy(&params, a.variant_params, sizeof(params));
  const int needed = (a.num_entries + kTileMapWarps - 1) / kTileMapWarps;
  const int blocks = needed < kTileMapMaxBlocks ? needed : kTileMapMaxBlocks;
  tile_map_kernel<V><<<blocks, kTileMapThreads, 0, stream>>>(a, params);
  return static_cast<int>(cudaGetLastError());
}

// Checks the arguments and launches tile_map_kernel<V> on `stream`; 0 or an error code.
// Only variants whose mask reads per-token tensors instantiate the kernel (for the others
// V::classify is exact and the kernels ignore a map): ATTNC_E_BAD_LAYOUT for them.
template <class V>
int launch_tile_map(const AttncTileMapArgs& a, cudaStream_t stream) {
  if constexpr (!variant_mask_reads_tokens<V>::value) {
    (void)a;
    (void)stream;
    return ATTNC_E_BAD_LAYOUT;
  } else {
    return launch_tile_map_kernel<V>(a, stream);
  }
}

// attnc_build_tile_map's body: the classifier on `stream`, between the copies when given
// (then the stream is waited for before returning).
template <class V>
int build_tile_map_step(const AttncTileMapArgs& a, const AttncTileMapCopies* copies,
                        cudaStream_t stream) {
  if (copies == nullptr) return launch_tile_map<V>(a, stream);
  if (copies->heads_bytes < 0 || (copies->heads_bytes > 0 && (copies->heads_host == nullptr ||
                                                              copies->heads_device == nullptr)))
    return ATTNC_E_BAD_LAYOUT;
  if (a.num_entries > 0 && copies->map_host == nullptr) return ATTNC_E_BAD_LAYOUT;
  cudaError_t st = cudaMemcpyAsync(copies->heads_device, copies->heads_host,
                                   static_cast<size_t>(copies->heads_bytes),
                                   cudaMemcpyHostToDevice, stream);
  if (st != cudaSuccess) return static_cast<int>(st);
  const int launched = launch_tile_map<V>(a, stream);
  if (launched != 0) return launched;
  if (a.num_entries > 0) {
    st = cudaMemcpyAsync(copies->map_host, a.tile_map, static_cast<size_t>(a.num_entries),
                         cudaMemcpyDeviceToHost, stream);
    if (st != cudaSuccess) return static_cast<int>(st);
  }
  return static_cast<int>(cudaStreamSynchronize(stream));
}

// attnc_queue_tile_map's body: on `stream`, the plan's lists up, the classifier, then the
// item step (item_map_order.cuh); nothing waits. The upload and the item step are checked
// before anything is queued.
template <class V>
int queue_tile_map_step(const AttncTileMapArgs& a, const AttncItemOrderArgs& order,
                        const AttncPlanUpload& upload, cudaStream_t stream) {
  if (upload.bytes <= 0 || upload.host == nullptr || upload.device == nullptr)
    return ATTNC_E_BAD_LAYOUT;
  const int bad = check_item_map_order(order);
  if (bad != 0) return bad;
  const cudaError_t st = cudaMemcpyAsync(upload.device, upload.host,
                                         static_cast<size_t>(upload.bytes),
                                         cudaMemcpyHostToDevice, stream);
  if (st != cudaSuccess) return static_cast<int>(st);
  const int launched = launch_tile_map<V>(a, stream);
  if (launched != 0) return launched;
  return launch_item_map_order(order, stream);
}

}  // namespace attnc

// Defines attnc_build_tile_map (0 or an error code; `copies` may be null: launch only),
// attnc_queue_tile_map (the plan's lists up, the classifier, then item_map_order.cuh's step
// that cuts a plan's items to the map and orders them by it, all queued on the stream) and
// attnc_tile_map_abi_version for V.
#define ATTNC_DEFINE_TILE_MAP_BUILDER(V)                                                    \
  extern "C" __attribute__((visibility("default"))) int attnc_build_tile_map(              \
      const AttncTileMapArgs* args, const AttncTileMapCopies* copies, void* cuda_stream) {  \
    if (args == nullptr) return ATTNC_E_BAD_LAYOUT;                                         \
    return ::attnc::build_tile_map_step<V>(*args, copies,                                   \
                                           static_cast<cudaStream_t>(cuda_stream));         \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int attnc_queue_tile_map(              \
      const AttncTileMapArgs* args, const AttncItemOrderArgs* order,                        \
      const AttncPlanUpload* upload, void* cuda_stream) {                                   \
    if (args == nullptr || order == nullptr || upload == nullptr)                           \
      return ATTNC_E_BAD_LAYOUT;                                                            \
    return ::attnc::queue_tile_map_step<V>(*args, *order, *upload,                          \
                                           static_cast<cudaStream_t>(cuda_stream));         \
  }                                                                                         \
  extern "C" __attribute__((visibility("default"))) int attnc_tile_map_abi_version(void) { \
    return ATTNC_TILE_MAP_ABI_VERSION;                                                      \
  }
#endif  // __CUDACC__
