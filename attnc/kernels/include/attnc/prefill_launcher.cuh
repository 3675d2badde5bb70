// Owns: the host side of the FA2 prefill for one (variant V, dtype T, HEAD_DIM): argument
// checks, the choice of CTA shape from args.tile_q_tokens, the dynamic shared-memory limit,
// the launch, and ATTNC_DEFINE_PREFILL_MODULE, which defines the extern "C" functions of
// prefill_args.h. A generated module is exactly:
//   #include "attnc/prefill_launcher.cuh"
//   <the variant functor struct>
//   ATTNC_DEFINE_PREFILL_MODULE(Name, __nv_bfloat16 or half, HEAD_DIM)
//
// Facts the caller relies on:
// - args.tile_q_tokens must be the value attnc_prefill_tile_q_tokens returned for this
//   head_dim and group (any t > 0 with t * group <= max rows also runs); otherwise
//   ATTNC_E_BAD_TILE. Work item i covers tokens [tile*t, tile*t + t) of its request.
// - variant_params_size must equal sizeof(V::Params); for a Params struct without fields
//   (sizeof 1 in C++) a size of 0 is accepted too and variant_params may be NULL.
// - q, k, v, o must be 16-byte aligned and q/kv strides multiples of 8 elements (16-byte
//   copies); o strides multiples of 2. Otherwise ATTNC_E_BAD_LAYOUT.
// - lse (natural log) is -inf for rows with no visible key (their O is 0). For variants with
//   `normalize = none` (V::kUseSoftmax false) there is no normaliser: lse is written as 0.
// - The output transform V::output is applied to rows with at least one visible key (all
//   rows when V::kUseSoftmax is false).
// - Work items (prefill_args.h: AttncPrefillItem) run in grid order, one CTA each: put the
//   heaviest first. num_work = 0 launches nothing. When num_merge > 0 the merge kernel runs
//   after the prefill kernel on the same stream; it needs part_o, part_lse and merge_items
//   (16-byte aligned) and o strides that are multiples of 4.
// - *variant_params is copied into the launch (by value): the host struct may be reused as
//   soon as attnc_prefill returns. Tensor pointers inside it must be device pointers.
// - The dynamic shared-memory limit is raised once per process and kernel shape, on the
//   device current at the first call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstring>
#include <type_traits>

#include "prefill_args.h"
#include "prefill_config.cuh"
#include "launch_checks.h"
#include "prefill_fa2.cuh"
#include "partial_merge.cuh"
#include "variant_contract.cuh"
#if __has_include("mask_math.cuh")
#include "mask_math.cuh"
#include "module_exports.h"
#endif

namespace attnc {

namespace detail {

template <class V>
int check_prefill_args(const AttncPrefillArgs& a, int head_dim) {
  using launch_checks::aligned16;
  const int status = launch_checks::check_params_and_heads<V>(a, head_dim);
  if (status != 0) return status;
  if (a.num_work < 0 || a.batch_size < 0 || a.num_merge < 0) return ATTNC_E_BAD_LAYOUT;
  if (a.num_work > 0 && (a.items == nullptr || !aligned16(a.items))) return ATTNC_E_BAD_LAYOUT;
  if (a.num_merge > 0) {
    if (a.merge_items == nullptr || a.part_lse == nullptr || a.part_o == nullptr ||
        !aligned16(a.part_o) || a.o_stride_tok % 4 || a.o_stride_head % 4)
      return ATTNC_E_BAD_LAYOUT;
  }
  if (a.kv_layout == ATTNC_KV_RAGGED) {
    // nothing extra
  } else if (a.kv_layout == ATTNC_KV_PAGED_NHD || a.kv_layout == ATTNC_KV_PAGED_HND) {
    if (a.page_size < 1 || a.num_pages < 0 || a.kv_indices == nullptr ||
        a.kv_last_page_len == nullptr)
      return ATTNC_E_BAD_LAYOUT;
  } else {
    return ATTNC_E_BAD_LAYOUT;
  }
  return launch_checks::check_qkvo_layout(a, 2);
}

template <class V, class T, class Tile>
int launch_prefill_tile(const AttncPrefillArgs& a, const typename V::Params& params,
                        cudaStream_t stream) {
  auto kernel = prefill_fa2_kernel<V, T, Tile>;
  constexpr int smem = prefill_fa2_smem_bytes<V, Tile>();
  if (smem > 48 * 1024) {
    // Once per process and instantiation (the attribute sticks to the function).
    static const cudaError_t attr_status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr_status != cudaSuccess) return attr_status;
  }
  kernel<<<static_cast<unsigned>(a.num_work), Tile::kThreads, smem, stream>>>(a, params);
  return cudaGetLastError();
}

// CTAs of this shape one SM of the current device holds at once; <= 0 on an error.
template <class V, class T, class Tile>
int tile_ctas_per_sm() {
  auto kernel = prefill_fa2_kernel<V, T, Tile>;
  constexpr int smem = prefill_fa2_smem_bytes<V, Tile>();
  if (smem > 48 * 1024) {
    static const cudaError_t attr_status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr_status != cudaSuccess) return -static_cast<int>(attr_status);
  }
  int blocks = 0;
  const cudaError_t st =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Tile::kThreads, smem);
  return st == cudaSuccess ? blocks : -static_cast<int>(st);
}

}  // namespace detail

// Launches the prefill for one batch; returns 0, a cudaError_t value or an ATTNC_E* code.
template <class V, class T, int HEAD_DIM>
int launch_prefill(const AttncPrefillArgs& a, cudaStream_t stream) {
  static_assert(launch_checks::Instantiation<V, T, HEAD_DIM>::kOk, "");
  const int status = detail::check_prefill_args<V>(a, HEAD_DIM);
  if (status != 0) return status;
  const int group = a.num_qo_heads / a.num_kv_heads;
  const long long rows = static_cast<long long>(a.tile_q_tokens) * group;
  if (a.tile_q_tokens <= 0 || rows > prefill_max_rows<HEAD_DIM>()) return ATTNC_E_BAD_TILE;
  if (a.num_work == 0) return 0;

  const typename V::Params params = launch_checks::read_params<V>(a);

  using Shapes = PrefillShapes<HEAD_DIM>;
  int launched;
  if (rows <= 16)
    launched = detail::launch_prefill_tile<V, T, typename Shapes::Small>(a, params, stream);
  else if (rows <= 64)
    launched = detail::launch_prefill_tile<V, T, typename Shapes::Medium>(a, params, stream);
  else
    launched = detail::launch_prefill_tile<V, T, typename Shapes::Large>(a, params, stream);
  if (launched != 0 || a.num_merge == 0) return launched;
  const int merge_ctas = a.num_merge < 4096 ? a.num_merge : 4096;
  prefill_merge_kernel<V, T, HEAD_DIM><<<merge_ctas, 128, 0, stream>>>(a, params);
  return cudaGetLastError();
}

// CTAs per SM of the shape launch_prefill picks for (group, max_q_len); <= 0 on an error.
template <class V, class T, int HEAD_DIM>
int prefill_ctas_per_sm(int head_dim, int group, int max_q_len) {
  const int tile = prefill_tile_q_tokens<HEAD_DIM>(head_dim, group, max_q_len);
  if (tile <= 0) return 0;
  const int rows = tile * group;
  using Shapes = PrefillShapes<HEAD_DIM>;
  if (rows <= 16) return detail::tile_ctas_per_sm<V, T, typename Shapes::Small>();
  if (rows <= 64) return detail::tile_ctas_per_sm<V, T, typename Shapes::Medium>();
  return detail::tile_ctas_per_sm<V, T, typename Shapes::Large>();
}

}  // namespace attnc

// Defines the extern "C" functions of prefill_args.h over a launcher's three templates (the
// FA2 and the Hopper module export the same ones): attnc_prefill and its ABI version from
// LAUNCH, attnc_prefill_tile_q_tokens from TILE_Q_TOKENS and attnc_prefill_ctas_per_sm from
// CTAS_PER_SM. Arguments with commas go in parentheses.
#define ATTNC_DEFINE_PREFILL_ENTRIES(LAUNCH, TILE_Q_TOKENS, CTAS_PER_SM)                        \
  ATTNC_DEFINE_LAUNCH_ENTRY(attnc_prefill, AttncPrefillArgs, LAUNCH, ATTNC_PREFILL_ABI_VERSION) \
  ATTNC_EXPORT int attnc_prefill_tile_q_tokens(int32_t head_dim, int32_t group_size,            \
                                               int32_t max_q_len) {                             \
    return TILE_Q_TOKENS(head_dim, group_size, max_q_len);                                      \
  }                                                                                             \
  ATTNC_EXPORT int attnc_prefill_ctas_per_sm(int32_t head_dim, int32_t group_size,              \
                                             int32_t max_q_len) {                               \
    return CTAS_PER_SM(head_dim, group_size, max_q_len);                                        \
  }

// Defines the functions of prefill_args.h for one variant type, one dtype and one head_dim.
#define ATTNC_DEFINE_PREFILL_MODULE(V, T, HEAD_DIM)                       \
  ATTNC_DEFINE_PREFILL_ENTRIES((::attnc::launch_prefill<V, T, HEAD_DIM>), \
                               ::attnc::prefill_tile_q_tokens<HEAD_DIM>,  \
                               (::attnc::prefill_ctas_per_sm<V, T, HEAD_DIM>))
