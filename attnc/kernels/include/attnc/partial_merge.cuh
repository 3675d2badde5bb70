// Owns: combining the fp32 partial states of split-KV work into final rows: one warp merges
// the chunks of one (token, head) row in chunk order (no atomics, so results are
// bit-identical run to run), applies V::output and stores O in the output dtype; and the
// prefill merge kernel that walks the plan's merge list (prefill_args.h). The decode merge
// kernel, on the same row merge, is decode_merge.cuh's.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "mma.cuh"
#include "prefill_args.h"
#include "variant_contract.cuh"

namespace attnc {

// Merges `chunks` partial states of one row: chunk c has fp32 O at part_o + row_of(c) * D
// (normalised O, or the plain weighted sum for normalize = none) and its natural-log LSE at
// part_lse[row_of(c)]. Writes the finished row to dst (V::output applied when the row saw a
// visible key) and returns the merged LSE (-inf: no visible key; 0 for normalize = none).
// A NaN partial LSE (NaN inputs, or a chunk that met a bad page id) makes the row NaN.
// Partial states never hold the sink: a variant's sink logit joins the denominator here
// (LSE = sink and O = 0 for a row no chunk saw a key in).
template <class V, class T, int D, class RowOf>
__device__ __forceinline__ float warp_merge_row(const float* part_o, const float* part_lse,
                                                int chunks, RowOf row_of, const V& var,
                                                const typename V::Row& vrow, T* dst,
                                                int lane) {
  constexpr int C4 = D / 4;
  constexpr int PER_LANE = (C4 + 31) / 32;
  float acc[PER_LANE][4];
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  float mx = -CUDART_INF_F;
  bool nan_lse = false;  // a chunk is NaN (NaN inputs, or a bad page id): the row is NaN
  for (int c = 0; c < chunks; ++c) {
    const float x = part_lse[row_of(c)];
    nan_lse |= x != x;
    if constexpr (V::kUseSoftmax) mx = fmaxf(mx, x);
  }
  // Some chunk saw a key (a NaN chunk counts: its row is NaN, as in the reference).
  const bool seen = !V::kUseSoftmax || mx != -CUDART_INF_F || nan_lse;
  float sink = -CUDART_INF_F;
  if constexpr (variant_has_sink<V>::value) {
    sink = variant_sink(var, vrow);
    nan_lse |= sink != sink;
    mx = fmaxf(mx, sink);
  }
  float sum = 0.f;
  for (int c = 0; c < chunks; ++c) {
    const int64_t prow = row_of(c);
    float w = 1.f;
    if constexpr (V::kUseSoftmax) w = mx == -CUDART_INF_F ? 0.f : expf(part_lse[prow] - mx);
    sum += w;
    const float* src = part_o + prow * D;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
      const int c4 = lane + 32 * j;
      if (c4 < C4) {
        const float4 x = *reinterpret_cast<const float4*>(src + 4 * c4);
        acc[j][0] += w * x.x;
        acc[j][1] += w * x.y;
        acc[j][2] += w * x.z;
        acc[j][3] += w * x.w;
      }
    }
  }
  if constexpr (variant_has_sink<V>::value) {
    sum += sink == -CUDART_INF_F ? 0.f : expf(sink - mx);
  }
  float inv = 1.f;
  float lse = 0.f;
  if constexpr (V::kUseSoftmax) {
    inv = sum > 0.f ? 1.f / sum : 0.f;
    lse = sum > 0.f ? mx + logf(sum) : -CUDART_INF_F;
  }
  if (nan_lse) {
    inv = CUDART_NAN_F;
    lse = CUDART_NAN_F;
  }
  const bool visible = seen;
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    const int c4 = lane + 32 * j;
    if (c4 >= C4) continue;
    float y[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      y[e] = acc[j][e] * inv;
      if constexpr (V::kHasOutput) {
        if (visible) y[e] = var.output(vrow, y[e]);
      }
    }
    uint2 packed;
    packed.x = mma::Dtype<T>::pack(y[0], y[1]);
    packed.y = mma::Dtype<T>::pack(y[2], y[3]);
    *reinterpret_cast<uint2*>(dst + 4 * c4) = packed;
  }
  return lse;
}

// Prefill merge: a grid-stride loop over the split query tiles of args.merge_items; the
// warps of a CTA share a tile's (token, head) rows.
template <class V, class T, int HEAD_DIM>
__global__ void __launch_bounds__(128)
    prefill_merge_kernel(const AttncPrefillArgs a, const typename V::Params params) {
  constexpr int kWarps = 4;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int mi = blockIdx.x; mi < a.num_merge; mi += gridDim.x) {
    const int32_t* me = a.merge_items + static_cast<int64_t>(mi) * ATTNC_PM_SIZE;
    const int request = me[ATTNC_PM_REQUEST];
    const int q_tile = me[ATTNC_PM_Q_TILE];
    const int chunks = me[ATTNC_PM_NUM_CHUNKS];
    const int64_t base = me[ATTNC_PM_PART_ROW_BASE];
    const int q_start = a.qo_indptr[request];
    const int q_len = a.qo_indptr[request + 1] - q_start;
    const int q0 = q_tile * a.tile_q_tokens;
    const int tokens = min(a.tile_q_tokens, q_len - q0);
    const int rows = tokens * a.num_qo_heads;
    int kv_len;
    if (a.kv_layout == ATTNC_KV_RAGGED) {
      kv_len = a.kv_indptr[request + 1] - a.kv_indptr[request];
    } else {
      const int pages = a.kv_indptr[request + 1] - a.kv_indptr[request];
      kv_len = pages > 0 ? (pages - 1) * a.page_size + a.kv_last_page_len[request] : 0;
    }
    const V var(params, RequestInfo{request, q_len, kv_len, a.num_qo_heads, a.num_kv_heads,
                                    HEAD_DIM, a.sm_scale, q_start,
                                    kv_token_start_of(a.kv_token_start, request)});
    for (int r = warp; r < rows; r += kWarps) {
      const int t = r / a.num_qo_heads;
      const int head = r - t * a.num_qo_heads;
      const int64_t token = q_start + q0 + t;
      auto row_of = [&](int c) -> int64_t { return base + static_cast<int64_t>(c) * rows + r; };
      T* dst = static_cast<T*>(a.o) + token * a.o_stride_tok +
               static_cast<int64_t>(head) * a.o_stride_head;
      const float lse = warp_merge_row<V, T, HEAD_DIM>(a.part_o, a.part_lse, chunks, row_of, var,
                                                       var.row(q0 + t, head), dst, lane);
      if (a.lse != nullptr && lane == 0) a.lse[token * a.num_qo_heads + head] = lse;
    }
  }
}

}  // namespace attnc
