// Owns: the Hopper (sm_90a) prefill kernel for one variant functor V: a persistent CTA of
// three warpgroups walks its work items (ItemWalk: round r of gridDim.x items, heaviest first
// as the plan lists them). Warpgroup 0 produces K/V stages (prefill_sm90_producer.cuh) with
// few registers; warpgroups 1 and 2 each load 64 packed query rows of the item's Q tile, run
// the KV loop (prefill_sm90_mainloop.cuh) with many registers and store their rows
// (prefill_sm90_epilogue.cuh). Packed row r of an item is token r / group, head
// kv_head * group + r % group, as in the FA2 kernel.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "../cp_async.cuh"
#include "../mma.cuh"
#include "../variant_contract.cuh"
#include "mbarrier.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_epilogue.cuh"
#include "prefill_sm90_item.cuh"
#include "prefill_sm90_mainloop.cuh"
#include "prefill_sm90_params.cuh"
#include "prefill_sm90_producer.cuh"
#include "smem_desc.cuh"
#include "warpgroup.cuh"

namespace attnc {
namespace sm90 {

// Consumer wg starts copying its 64 rows of the item's Q tile into the swizzled Q tile (rows
// past the item zero-filled), once every warp of the warpgroup is done with the previous
// item's rows; wait_q_rows() completes the copy. The row set-up runs in between, so its loads
// (row values, a sink) overlap the copy.
template <class T, class Shape>
__device__ __forceinline__ void issue_q_rows(const AttncPrefillArgs& a, const PrefillSm90Item& it,
                                             uint32_t s_q, int wg) {
  constexpr int CH = Shape::kHeadDim / 8;
  constexpr int kRowStep = 128 / CH;
  const int tid = threadIdx.x % 128;
  const int c = tid % CH;
  const T* q = static_cast<const T*>(a.q);
  // The previous item's wgmma of every warp of this warpgroup have read their Q rows.
  named_sync(kQBarrier + wg, 128);
#pragma unroll
  for (int i = 0; i < 64 / kRowStep; ++i) {
    const int r = 64 * wg + tid / CH + i * kRowStep;
    const bool ok = r < it.rows_valid;
    const int rr = ok ? r : 0;
    const int64_t off =
        static_cast<int64_t>(it.q_start + it.q0 + rr / it.group) * a.q_stride_tok +
        static_cast<int64_t>(it.kv_head * it.group + rr % it.group) * a.q_stride_head;
    cp_async_16(s_q + swizzled_offset(Shape::kRows, r, c), q + off + c * 8, ok);
  }
  cp_async_commit();
}

// Waits for this thread's Q copies and makes the warpgroup's rows visible to its wgmma.
__device__ __forceinline__ void wait_q_rows(int wg) {
  cp_async_wait<0>();
  fence_proxy_async();
  named_sync(kQBarrier + wg, 128);
}

// Consumer warpgroup wg (0 or 1): every item of this CTA, from its Q rows to its stores.
template <class V, class T, class Shape>
__device__ __forceinline__ void prefill_sm90_consume(const PrefillSm90Params<V>& prm,
                                                     const PrefillSm90Smem<Shape>& sm, int wg) {
  constexpr int D = Shape::kHeadDim;
  using Row = typename V::Row;
  const AttncPrefillArgs& a = prm.args;
  const int warp = (threadIdx.x / 32) % 4;
  const int g = (threadIdx.x % 32) / 4;
  StageCursor cur;
  // Consumer 0 issues first.
  if (wg == 1) named_arrive(kSchedBarrier + 0, 256);
  const ItemWalk walk = ItemWalk::make(a.num_work);
  for (int r = 0; r < walk.rounds; ++r) {
    const int w = walk.item(r);
    if (w >= a.num_work) continue;
    const PrefillSm90Item it = PrefillSm90Item::load(a, w);
    if (!it.valid()) continue;
    const V var(prm.params, it.request_info(a));
    issue_q_rows<T, Shape>(a, it, sm.q(), wg);

    Row rows[1][2];
    float mult[1][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(64 * wg + 16 * warp + g + 8 * h, it.rows_valid - 1);
      rows[0][h] = var.row(it.q0 + r / it.group, it.kv_head * it.group + r % it.group);
      mult[0][h] = V::kAffineScore ? var.score_scale(rows[0][h]) * a.sm_scale * kLog2e : 1.f;
    }
    float o[1][D / 8][4];
    float m[1][2];
    float l[1][2];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][n][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[0][h] = -CUDART_INF_F;
      l[0][h] = 0.f;
    }
    if constexpr (variant_has_sink<V>::value) {
      // An unsplit item owns the sink (split tiles get it in the merge kernel).
      if (a.items[static_cast<int64_t>(w) * ATTNC_PI_SIZE + ATTNC_PI_PART_ROW] < 0)
        start_rows_at_sink(var, rows, mult, m, l, threadIdx.x % 4 == 0);
    }
    wait_q_rows(wg);
    prefill_sm90_kv_loop<V, T, Shape>(prm, var, sm, wg, cur, rows, mult, o, m, l);
    prefill_sm90_store<V, T, D>(a, var, it, w, wg, rows, mult, o, m, l);
  }
  // Balance consumer 1's first arrival.
  if (wg == 0) named_sync(kSchedBarrier + 0, 256);
}

template <class V, class T, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    prefill_sm90_kernel(const __grid_constant__ PrefillSm90Params<V> prm) {
  static_assert(VariantContract<V>::ok, "");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const PrefillSm90Smem<Shape> sm{(mma::smem_addr(smem_raw) + 1023u) & ~1023u};
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar_init(sm.full_k(s), 1);
      mbar_init(sm.full_v(s), 1);
      mbar_init(sm.empty_k(s), 256);
      mbar_init(sm.empty_v(s), 256);
    }
    mbar_fence_init();
  }
  __syncthreads();
  const int role = threadIdx.x / 128;
  if (role == 0) {
    regs_decrease<Shape::kProducerRegs>();
    prefill_sm90_produce<V, T, Shape>(prm, sm);
  } else {
    regs_increase<Shape::kConsumerRegs>();
    prefill_sm90_consume<V, T, Shape>(prm, sm, role - 1);
  }
}

}  // namespace sm90
}  // namespace attnc
