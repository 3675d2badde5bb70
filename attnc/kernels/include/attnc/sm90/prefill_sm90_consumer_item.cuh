// Owns: what one Hopper consumer warpgroup keeps of a work item while it runs it: the
// decoded item (the fields the epilogue and the functor need, read once), the packed rows'
// hoisted values (V::row, the exp2 multiplier) and the online-softmax state (m, l, started at
// the sink when the item owns it); and the copy of the warpgroup's 64 Q rows into the
// swizzled Q tile (issued when the item starts, waited for before its first S = Q K^T).
// Starting the next item while the current one finishes is what lets the KV loop
// (prefill_sm90_mainloop.cuh) run from one item into the next without draining.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "../cp_async.cuh"
#include "../fast_divmod.cuh"
#include "../online_softmax.cuh"
#include "../score_hooks.cuh"
#include "../prefill_args.h"
#include "../variant_contract.cuh"
#include "gemm_bias.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_item.cuh"
#include "prefill_sm90_params.cuh"
#include "smem_desc.cuh"
#include "warpgroup.cuh"

namespace attnc {
namespace sm90 {

// Consumer wg copies its 64 rows of item `it`'s Q tile into the swizzled Q tile (rows past
// the item zero-filled), once every warp of the warpgroup is done reading the tile (their
// last S = Q K^T has completed). A packed row is split into token and head by `group`
// (FastDiv), from a pointer to the item's first token and head.
template <class T, class Shape>
__device__ __forceinline__ void issue_q_rows(const AttncPrefillArgs& a, const PrefillSm90Item& it,
                                             const FastDiv& group, uint32_t s_q, int wg) {
  constexpr int CH = Shape::kHeadDim / 8;
  constexpr int kRowStep = 128 / CH;
  const int tid = threadIdx.x % 128;
  const int c = tid % CH;
  const T* q = static_cast<const T*>(a.q) +
               static_cast<int64_t>(it.q_start + it.q0) * a.q_stride_tok +
               static_cast<int64_t>(it.kv_head * group.d) * a.q_stride_head + c * 8;
  named_sync(kQBarrier + wg, 128);
#pragma unroll
  for (int i = 0; i < 64 / kRowStep; ++i) {
    const int r = 64 * wg + tid / CH + i * kRowStep;
    const bool ok = r < it.rows_valid;
    int token, head;
    group.divmod(ok ? r : 0, token, head);
    cp_async_16(s_q + swizzled_offset(Shape::kRows, r, c),
                q + token * a.q_stride_tok + head * a.q_stride_head, ok);
  }
  cp_async_commit();
}

// Waits for this thread's Q copies and makes the warpgroup's rows visible to its wgmma.
__device__ __forceinline__ void wait_q_rows(int wg) {
  cp_async_wait<0>();
  fence_proxy_async();
  named_sync(kQBarrier + wg, 128);
}

// One item as consumer warpgroup wg runs it.
template <class V>
struct ConsumerItem {
  int part_row;   // >= 0: a split tile's first partial row (ATTNC_PI_PART_ROW)
  int q_start;    // the request's first query token
  int q0;         // the tile's first query token in the request
  int rows_valid; // packed rows of the tile
  int kv_head;
  RequestInfo request;
  typename V::Row rows[1][2];
  float mult[1][2];   // the exp2 multiplier (over units where in_units)
  float units[1][2];  // kStepUnitsVariant: the rows' steps where in_units, else 1
  float per_unit[1][2];  // kStepUnitsVariant: 1 / the rows' steps in log2 units (NaN: the
                         // warp's tiles evaluate the bias per element, units 1)
  float m[1][2];
  float l[1][2];
  float sink[2];  // the rows' sink logits where read_sinks reads them at item start
  bool bias_in_gemm;  // kBiasInGemm: this warp's rows take the bias in the GEMM (gemm_bias.cuh)

  __device__ __forceinline__ V functor(const typename V::Params& params) const {
    return V(params, request);
  }
};

// The units of row h's m (c of online_softmax.cuh: log2 units per unit of m).
template <int HEAD_DIM, class V>
__device__ __forceinline__ float row_units(const ConsumerItem<V>& ci, int h) {
  if constexpr (V::kScoreIsIdentity) return ci.mult[0][h];
  if constexpr (kStepUnitsVariant<V, HEAD_DIM>) return ci.units[0][h];
  return 1.f;
}

// This thread's packed row h (0 or 1) of consumer wg's 64, clamped to the item's last row.
__device__ __forceinline__ int thread_packed_row(int wg, int h, int rows_valid) {
  const int warp = (threadIdx.x / 32) % 4;
  const int g = (threadIdx.x % 32) / 4;
  return min(64 * wg + 16 * warp + g + 8 * h, rows_valid - 1);
}

// V::row of this thread's packed row h of consumer wg in item ci.
template <class V>
__device__ __forceinline__ typename V::Row thread_row(const V& var, const FastDiv& group, int wg,
                                                      int h, const ConsumerItem<V>& ci) {
  int token, head;
  group.divmod(thread_packed_row(wg, h, ci.rows_valid), token, head);
  return var.row(ci.q0 + token, ci.kv_head * group.d + head);
}

// Reads the sink logits of the rows of an unsplit item into ci.sink (split tiles get the sink
// in the merge kernel). Where kSinksReadAtStart<Shape>, start_item reads them, so that the
// loads complete under the previous item's last tile instead of stalling the item's first
// softmax (window-128 sink prefill at head_dim 128: +1%, RESULTS.md run 35). Elsewhere
// set_up_rows reads each row's sink from the row it has just set up and ci.sink holds nothing:
// the registers held through the last tile made ptxas spill there (head_dim 64 with three
// consumers, 256 with 80-key stages), and a ci.sink written on some items only is carried from
// item to item, which made the d=64 three-consumer kernel re-derive thread indices in its tile
// loop (56 S2R against 43 when set_up_rows reads the rows; RESULTS.md run 35, item 7).
template <class Shape>
constexpr bool kSinksReadAtStart = Shape::kHeadDim == 128;

template <class V>
__device__ __forceinline__ void read_sinks(const V& var, const FastDiv& group, int wg,
                                           ConsumerItem<V>& ci) {
  if (ci.part_row >= 0 || ci.rows_valid <= 0) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) ci.sink[h] = variant_sink(var, thread_row(var, group, wg, h, ci));
}

// Starts item w into `ci` (false when w >= num_work: the CTA has no more): decodes it and
// issues its Q copy (the Q tile must be free: the previous item's last S has completed). An
// item past its request's queries (rows_valid <= 0: a plan made for longer queries, such as a
// CUDA graph's) zero-fills Q and is skipped (Sm90Consumer::run). Its rows are set up later
// (set_up_rows), so that the set-up of an item started ahead does not hold registers while the
// previous item finishes; only the sink logits are read here, where kSinksReadAtStart, and
// where kBiasInGemm the rows' bias coefficients written (s_q is the shared-memory base: the Q
// tile comes first, PrefillSm90Shape).
template <class V, class T, class Shape>
__device__ __forceinline__ bool start_item(const AttncPrefillArgs& a,
                                           const typename V::Params& params, const FastDiv& group,
                                           uint32_t s_q, int wg, int w, ConsumerItem<V>& ci) {
  if (w >= a.num_work) return false;
  const PrefillSm90Item it = PrefillSm90Item::load(a, w, group.d);
  issue_q_rows<T, Shape>(a, it, group, s_q, wg);
  ci.part_row = a.items[static_cast<int64_t>(w) * ATTNC_PI_SIZE + ATTNC_PI_PART_ROW];
  ci.q_start = it.q_start;
  ci.q0 = it.q0;
  ci.rows_valid = it.rows_valid;
  ci.kv_head = it.kv_head;
  ci.request = it.request_info(a);
  if constexpr (variant_has_sink<V>::value && kSinksReadAtStart<Shape>)
    read_sinks(ci.functor(params), group, wg, ci);
  // The rows' bias coefficients are written here for the same reason, and because the item's
  // first S, issued before set_up_rows, reads them.
  if constexpr (kBiasInGemm<V, Shape>) {
    if (ci.rows_valid > 0) {
      const V var = ci.functor(params);
      typename V::Row rows[2];
      float mult[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rows[h] = thread_row(var, group, wg, h, ci);
        mult[h] = var.score_scale(rows[h]) * a.sm_scale * kLog2e;
      }
      ci.bias_in_gemm = write_bias_rows<V, T>(var, rows, mult, s_q + Shape::kBiasQOffset, wg);
    }
  }
  return true;
}

// The rows of consumer warpgroup wg in item ci: their hoisted values (V::row, the exp2
// multiplier) and the start of their online softmax (m = -inf, l = 0, or at the sink when the
// item owns it; read_sinks).
template <class V, class Shape>
__device__ __forceinline__ void set_up_rows(const V& var, float sm_scale, int wg,
                                            const FastDiv& group, ConsumerItem<V>& ci) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    ci.rows[0][h] = thread_row(var, group, wg, h, ci);
    ci.mult[0][h] = V::kAffineScore ? var.score_scale(ci.rows[0][h]) * sm_scale * kLog2e : 1.f;
    ci.m[0][h] = -CUDART_INF_F;
    ci.l[0][h] = 0.f;
  }
  if constexpr (kStepUnitsVariant<V, Shape::kHeadDim>) {
    // Units of the rows' steps where every row of the warp steps by [2^-64, 16] log2 units
    // a key (NaN fails the compares); the warp-wide choice holds for the whole item.
    float step[2];
    bool ok = true;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      step[h] = var.score_bias_step(ci.rows[0][h]) * kLog2e;
      ok = ok && step[h] >= kMinStepPerKey && step[h] <= kMaxStepPerKey;
    }
    const bool in_units = __all_sync(0xffffffffu, ok);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ci.units[0][h] = in_units ? step[h] : 1.f;
      const float per_unit = in_units ? __fdividef(1.f, step[h]) : 1.f;  // step is normal
      ci.per_unit[0][h] = in_units ? per_unit : CUDART_NAN_F;
      ci.mult[0][h] *= per_unit;
    }
  }
  if constexpr (variant_has_sink<V>::value) {
    if (ci.part_row < 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sink =
            kSinksReadAtStart<Shape> ? ci.sink[h] : variant_sink(var, ci.rows[0][h]);
        start_row_at_sink<V>(sink, row_units<Shape::kHeadDim>(ci, h), ci.m[0][h], ci.l[0][h],
                             threadIdx.x % 4 == 0);
      }
    }
  }
}

}  // namespace sm90
}  // namespace attnc
