// Owns: the host side of the Hopper (sm_90a) prefill for one (variant V, dtype T, HEAD_DIM):
// argument checks (shared with FA2), the choice of CTA shape, the TMA maps of ragged or paged
// K/V, the persistent grid (min(num_work, SMs) CTAs of Shape::kThreads threads, one per SM),
// the shared-memory opt-in, the launch, the split-KV merge (partial_merge.cuh), and
// ATTNC_DEFINE_PREFILL_SM90_MODULE, which defines the same extern "C" functions as
// ATTNC_DEFINE_PREFILL_MODULE (prefill_args.h), so the runtime loads either module the same
// way. A generated module is exactly:
//   #include "attnc/sm90/prefill_sm90_launcher.cuh"
//   <the variant functor struct>
//   ATTNC_DEFINE_PREFILL_SM90_MODULE(Name, __nv_bfloat16 or half, HEAD_DIM)
// and must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a). A module with a
// three-consumer kernel may instead be two sources linked into one library (WideShape below):
// the same text with `#define ATTNC_SM90_WIDE_ELSEWHERE 1` first, and
//   #include "attnc/sm90/prefill_sm90_launcher.cuh"
//   <the variant functor struct>
//   ATTNC_DEFINE_PREFILL_SM90_WIDE(Name, __nv_bfloat16 or half, HEAD_DIM)
//
// Differences from the FA2 module a caller sees: attnc_prefill_tile_q_tokens answers
// rows / group (128 rows, or 192 for the lighter variants at head_dim 64 and 128 when the
// longest query reaches kThreeConsumersMinQ and their three-consumer kernel needs no more
// local memory than the two-consumer one: the module holds both shapes),
// attnc_prefill_ctas_per_sm answers 1, and work items run in a persistent loop (ItemOrder,
// item_order.cuh; the dynamic fetch counts in item 0's spare words, which the kernel leaves
// 0 when it ends) instead of one CTA each. Every other fact of prefill_launcher.cuh
// holds (strides, alignment, LSE, partial rows, merge).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstring>
#include <type_traits>

#include "../partial_merge.cuh"
#include "../prefill_args.h"
#include "../prefill_launcher.cuh"
#include "../variant_contract.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_kernel.cuh"
#include "prefill_sm90_params.cuh"
#include "tma.cuh"

namespace attnc {
namespace sm90 {

// Rows per TMA box of a paged cache: the largest power of two that divides both page_size and
// kKvTile (a box then never crosses a page, and a tile is whole boxes) when that is at least
// ATTNC_SM90_PAGED_TMA_MIN_ROWS (the swizzle atom's 8 rows), else 0: pages smaller than that,
// or of no such common size (24 keys against 128), gather by cp.async. The 80-key stages of
// three consumers at head_dim 128 take 16-row boxes from pages of 16, 32, 64 or more keys.
#ifndef ATTNC_SM90_PAGED_TMA_MIN_ROWS
#define ATTNC_SM90_PAGED_TMA_MIN_ROWS 8
#endif
template <class Shape>
int paged_box_rows(int page_size) {
  constexpr int KVT = Shape::kKvTile;
  if (page_size < ATTNC_SM90_PAGED_TMA_MIN_ROWS) return 0;
  const int common = page_size & -page_size;  // largest power of two dividing page_size
  const int rows = common < (KVT & -KVT) ? common : (KVT & -KVT);
  return rows >= ATTNC_SM90_PAGED_TMA_MIN_ROWS ? rows : 0;
}

// TMA maps of K and V. Ragged ([tokens, H_kv, D] with the argument strides): the token extent
// is num_pages when given (rows past it read as zeros, so a range's tail tile loads through
// the map too: ragged_tails), else 2^31 - 1 and only tiles wholly inside a request load
// through the maps. Paged: a map over the cache's pages (paged_box_rows). Returns false
// (use cp.async everywhere) when the layout does not fit or encoding fails.
template <class V, class T, class Shape>
bool encode_kv_maps(PrefillSm90Params<V>& prm) {
  const AttncPrefillArgs& a = prm.args;
  constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
  const uint64_t e = sizeof(T);
  if (a.kv_layout == ATTNC_KV_RAGGED) {
    const uint64_t tokens = a.num_pages > 0 ? static_cast<uint64_t>(a.num_pages) : 0x7fffffffull;
    prm.ragged_tails = a.num_pages > 0 ? 1 : 0;
    return encode_rows_map(&prm.tmap_k, a.k, bf16, Shape::kHeadDim, a.num_kv_heads, tokens,
                           a.kv_stride_head * e, a.kv_stride_tok * e, Shape::kKvTile) &&
           encode_rows_map(&prm.tmap_v, a.v, bf16, Shape::kHeadDim, a.num_kv_heads, tokens,
                           a.kv_stride_head * e, a.kv_stride_tok * e, Shape::kKvTile);
  }
  const int rows = paged_box_rows<Shape>(a.page_size);
  if (rows == 0 || a.num_pages <= 0) return false;
  prm.page_rows = rows;
  const auto encode = [&](CUtensorMap* map, const void* base) {
    return encode_pages_map(map, base, bf16, Shape::kHeadDim, a.num_kv_heads, a.page_size,
                            a.num_pages, a.kv_stride_head * e, a.kv_stride_tok * e,
                            a.kv_stride_page * e, rows);
  };
  return encode(&prm.tmap_k, a.k) && encode(&prm.tmap_v, a.v);
}

// Raises the kernel's dynamic shared-memory limit once per process.
template <class V, class T, class Shape>
cudaError_t opt_in_smem() {
  static const cudaError_t status =
      cudaFuncSetAttribute(prefill_sm90_kernel<V, T, Shape>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  return status;
}

// The launch for one CTA shape (checked arguments; tile_q_tokens fits Shape::kRows).
template <class V, class T, class Shape>
int launch_sm90_shape(const AttncPrefillArgs& a, cudaStream_t stream) {
  PrefillSm90Params<V> prm;
  std::memset(static_cast<void*>(&prm), 0, sizeof(prm));
  prm.args = a;
  prm.params = launch_checks::read_params<V>(a);
#ifdef ATTNC_SM90_NO_TMA
  prm.use_tma = 0;  // experiments: every tile by cp.async
#else
  prm.use_tma = encode_kv_maps<V, T, Shape>(prm) ? 1 : 0;
  if (!prm.use_tma) prm.page_rows = 0;
#endif

  const cudaError_t attr = opt_in_smem<V, T, Shape>();
  if (attr != cudaSuccess) return attr;
  int device = 0, sms = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st == cudaSuccess)
    st = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (st != cudaSuccess) return st;
  const int grid = a.num_work < sms ? a.num_work : sms;
  prefill_sm90_kernel<V, T, Shape><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(prm);
  st = cudaGetLastError();
  if (st != cudaSuccess || a.num_merge == 0) return st;
  const int merge_ctas = a.num_merge < 4096 ? a.num_merge : 4096;
  prefill_merge_kernel<V, T, Shape::kHeadDim><<<merge_ctas, 128, 0, stream>>>(a, prm.params);
  return cudaGetLastError();
}

// CTAs per SM of the Hopper kernel: 1 when it fits, <= 0 on an error.
template <class V, class T, class Shape>
int sm90_shape_ctas_per_sm() {
  const cudaError_t attr = opt_in_smem<V, T, Shape>();
  if (attr != cudaSuccess) return -static_cast<int>(attr);
  int blocks = 0;
  const cudaError_t st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, prefill_sm90_kernel<V, T, Shape>, Shape::kThreads, Shape::kSmemBytes);
  return st == cudaSuccess ? blocks : -static_cast<int>(st);
}

// Bytes of local memory (stack frame and spills) of one shape's kernel as loaded on the
// current device, asked once; -1 when the query fails (no device: the host-only checks).
template <class V, class T, class Shape>
long long sm90_shape_local_bytes() {
  static const long long bytes = [] {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, prefill_sm90_kernel<V, T, Shape>) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it for the caller's next check
      return -1LL;
    }
    return static_cast<long long>(attr.localSizeBytes);
  }();
  return bytes;
}

// A module's three-consumer kernel, compiled in this translation unit or, in a split build,
// in a second one. nvcc compiles a translation unit's kernels one after the other, and the
// three-consumer kernel is about half of a light variant's build, so the runtime builds such a
// module from two sources in parallel (the first call of a new variant waits on the longer
// one). A split build defines ATTNC_SM90_WIDE_ELSEWHERE in the module's main source, which
// then declares these three functions, and compiles the second source, which defines them with
// ATTNC_DEFINE_PREFILL_SM90_WIDE. They have hidden visibility like everything of the module
// but its extern "C" entries: one module per shared library, so the names need no variant.
int wide_launch(const AttncPrefillArgs& a, cudaStream_t stream);
int wide_ctas_per_sm();
long long wide_local_bytes();

template <class V, class T, int HEAD_DIM>
struct WideShape {
  using Shape = Sm90ShapeOf<V, HEAD_DIM>;
#ifdef ATTNC_SM90_WIDE_ELSEWHERE
  static_assert(Shape::kConsumers == 3,
                "ATTNC_SM90_WIDE_ELSEWHERE: this variant has no three-consumer kernel at this "
                "head_dim, so its module is built from one source");
  static int launch(const AttncPrefillArgs& a, cudaStream_t stream) {
    return wide_launch(a, stream);
  }
  static int ctas_per_sm() { return wide_ctas_per_sm(); }
  static long long local_bytes() { return wide_local_bytes(); }
#else
  static int launch(const AttncPrefillArgs& a, cudaStream_t stream) {
    return launch_sm90_shape<V, T, Shape>(a, stream);
  }
  static int ctas_per_sm() { return sm90_shape_ctas_per_sm<V, T, Shape>(); }
  static long long local_bytes() { return sm90_shape_local_bytes<V, T, Shape>(); }
#endif
};

// Checks the arguments, then launches the shape the plan's tile was sized for: three
// consumers when its packed rows exceed two consumers' 128
// (prefill_sm90_module_tile_q_tokens).
template <class V, class T, int HEAD_DIM>
int launch_prefill_sm90(const AttncPrefillArgs& a, cudaStream_t stream) {
  static_assert(launch_checks::Instantiation<V, T, HEAD_DIM>::kOk, "");
  using Two = Sm90TwoShapeOf<V, HEAD_DIM>;
  using Widest = Sm90ShapeOf<V, HEAD_DIM>;
  const int status = ::attnc::detail::check_prefill_args<V>(a, HEAD_DIM);
  if (status != 0) return status;
  const int group = a.num_qo_heads / a.num_kv_heads;
  const long long rows = static_cast<long long>(a.tile_q_tokens) * group;
  if (a.tile_q_tokens <= 0 || rows > Widest::kRows) return ATTNC_E_BAD_TILE;
  if (a.num_work == 0) return 0;
  if (takes_three_consumers<V, HEAD_DIM>(rows)) return WideShape<V, T, HEAD_DIM>::launch(a, stream);
  return launch_sm90_shape<V, T, Two>(a, stream);
}

// Whether variant V's three-consumer kernel serves the plans that would take it: it needs no
// more local memory than the two-consumer one. The light class is a compile-time trait, and
// a heavier user variant in it can spill with three consumers' 160 registers where it does
// not with two (score * sigmoid(score) at head_dim 64: 64 bytes); its plans then take two.
template <class V, class T, int HEAD_DIM>
bool three_consumers_serve() {
  using Widest = Sm90ShapeOf<V, HEAD_DIM>;
  if constexpr (Widest::kConsumers != 3) {
    return false;
  } else {
    const long long three = WideShape<V, T, HEAD_DIM>::local_bytes();
    return three <= 0 || three <= sm90_shape_local_bytes<V, T, Sm90TwoShapeOf<V, HEAD_DIM>>();
  }
}

// attnc_prefill_tile_q_tokens of the module: prefill_sm90_tile_q_tokens, with plans held to
// two consumers when the three-consumer kernel does not serve (three_consumers_serve).
template <class V, class T, int HEAD_DIM>
int prefill_sm90_module_tile_q_tokens(int head_dim, int group, int max_q_len) {
  const bool three = three_consumers_serve<V, T, HEAD_DIM>();
  const int max_q = three || max_q_len < kThreeConsumersMinQ ? max_q_len : kThreeConsumersMinQ - 1;
  return prefill_sm90_tile_q_tokens<V, HEAD_DIM>(head_dim, group, max_q);
}

template <class V, class T, int HEAD_DIM>
int prefill_sm90_ctas_per_sm(int head_dim, int group, int max_q_len) {
  const int tile = prefill_sm90_module_tile_q_tokens<V, T, HEAD_DIM>(head_dim, group, max_q_len);
  if (tile <= 0) return 0;
  if (takes_three_consumers<V, HEAD_DIM>(static_cast<long long>(tile) * group))
    return WideShape<V, T, HEAD_DIM>::ctas_per_sm();
  return sm90_shape_ctas_per_sm<V, T, Sm90TwoShapeOf<V, HEAD_DIM>>();
}

}  // namespace sm90
}  // namespace attnc

// Defines attnc_prefill, attnc_prefill_abi_version, attnc_prefill_tile_q_tokens and
// attnc_prefill_ctas_per_sm (prefill_args.h) for one variant type, dtype and head_dim.
#define ATTNC_DEFINE_PREFILL_SM90_MODULE(V, T, HEAD_DIM)    \
  ATTNC_DEFINE_PREFILL_ENTRIES(                             \
      (::attnc::sm90::launch_prefill_sm90<V, T, HEAD_DIM>), \
      (::attnc::sm90::prefill_sm90_module_tile_q_tokens<V, T, HEAD_DIM>), \
      (::attnc::sm90::prefill_sm90_ctas_per_sm<V, T, HEAD_DIM>))

// The second source of a split build (see WideShape): the three functions of V's
// three-consumer kernel, which the main source (built with ATTNC_SM90_WIDE_ELSEWHERE) calls.
#define ATTNC_DEFINE_PREFILL_SM90_WIDE(V, T, HEAD_DIM)                                        \
  static_assert(::attnc::sm90::Sm90ShapeOf<V, HEAD_DIM>::kConsumers == 3,                    \
                "ATTNC_DEFINE_PREFILL_SM90_WIDE: no three-consumer kernel at this head_dim"); \
  int ::attnc::sm90::wide_launch(const AttncPrefillArgs& a, cudaStream_t stream) {           \
    return launch_sm90_shape<V, T, Sm90ShapeOf<V, HEAD_DIM>>(a, stream);                     \
  }                                                                                          \
  int ::attnc::sm90::wide_ctas_per_sm() {                                                    \
    return sm90_shape_ctas_per_sm<V, T, Sm90ShapeOf<V, HEAD_DIM>>();                         \
  }                                                                                          \
  long long ::attnc::sm90::wide_local_bytes() {                                              \
    return sm90_shape_local_bytes<V, T, Sm90ShapeOf<V, HEAD_DIM>>();                         \
  }
