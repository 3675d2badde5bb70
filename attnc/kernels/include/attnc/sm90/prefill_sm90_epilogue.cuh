// Owns: the end of a work item for one Hopper consumer warpgroup: row normalisation, the
// variant's output hook, and the stores of O (4-byte pairs in the output dtype) and the
// natural-log LSE, or of the fp32 partial state (O, LSE) of a split tile, which
// partial_merge.cuh combines. Semantics are those of the FA2 epilogue (prefill_launcher.cuh).
#pragma once

#include <stdint.h>

#include "../fast_divmod.cuh"
#include "../mma.cuh"
#include "../online_softmax.cuh"
#include "../prefill_args.h"
#include "prefill_sm90_consumer_item.cuh"

namespace attnc {
namespace sm90 {

// Row r = 64 * wg + 16 * warp + lane / 4 + 8 * h of item ci's packed rows.
template <class V, class T, int D>
__device__ __forceinline__ void prefill_sm90_store(const AttncPrefillArgs& a, const V& var,
                                                   const FastDiv& group,
                                                   const ConsumerItem<V>& ci, int wg,
                                                   const float (&o)[1][D / 8][4]) {
  constexpr int NO = D / 8;
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const int g = lane / 4;
  const int tq = lane % 4;
  const int part_row = ci.part_row;
  T* o_ptr = static_cast<T*>(a.o);
  // Both rows' ends first: their quad sums and reciprocals overlap instead of each waiting
  // behind the other row's stores.
  SoftmaxRowEnd ends[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float c = row_units<D>(ci, h);
    ends[h] = output_row_end(var, ci.rows[0][h], ci.m[0][h], ci.l[0][h], c, part_row < 0,
                             /*poisoned=*/false);
    if constexpr (!V::kUseSoftmax) {
      ends[h].lse = ci.l[0][h] == 0.f ? 0.f : CUDART_NAN_F;  // NaN: the item met a bad page id
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 64 * wg + 16 * warp + g + 8 * h;
    const SoftmaxRowEnd& end = ends[h];
    if (r >= ci.rows_valid) continue;
    int token_in_tile, head_in_group;
    group.divmod(r, token_in_tile, head_in_group);
    const int head = ci.kv_head * group.d + head_in_group;
    if (part_row >= 0) {
      const int64_t prow =
          part_row + static_cast<int64_t>(token_in_tile) * a.num_qo_heads + head;
      float* pdst = a.part_o + prow * D + 2 * tq;
#pragma unroll
      for (int n = 0; n < NO; ++n)
        *reinterpret_cast<float2*>(pdst + n * 8) =
            make_float2(o[0][n][2 * h] * end.inv, o[0][n][2 * h + 1] * end.inv);
      if (tq == 0) a.part_lse[prow] = end.lse;
      continue;
    }
    const int token = ci.q_start + ci.q0 + token_in_tile;
    T* dst = o_ptr + static_cast<int64_t>(token) * a.o_stride_tok +
             static_cast<int64_t>(head) * a.o_stride_head + 2 * tq;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      float v0 = o[0][n][2 * h] * end.inv;
      float v1 = o[0][n][2 * h + 1] * end.inv;
      if constexpr (V::kHasOutput) {
        if (end.seen) {
          v0 = var.output(ci.rows[0][h], v0);
          v1 = var.output(ci.rows[0][h], v1);
        }
      }
      *reinterpret_cast<uint32_t*>(dst + n * 8) = mma::Dtype<T>::pack(v0, v1);
    }
    if (a.lse != nullptr && tq == 0)
      a.lse[static_cast<int64_t>(token) * a.num_qo_heads + head] = end.lse;
  }
}

}  // namespace sm90
}  // namespace attnc
