// Owns: the decode merge kernel: for each split request of the decode plan's merge list
// (decode_args.h merge_items), one warp per (token, head) row combines the request's fp32
// partial states in chunk order (partial_merge.cuh warp_merge_row), applies V::output and
// writes O (and LSE). The decode launcher runs it after the decode kernel (decode_launcher.cuh).
#pragma once

#include <stdint.h>

#include "decode_args.h"
#include "partial_merge.cuh"
#include "variant_contract.cuh"

namespace attnc {

// One warp per (split request, token, head) row: merges the request's partial states in
// chunk order, applies V::output and writes O (and LSE).
template <class V, class T, int HEAD_DIM>
__global__ void __launch_bounds__(128)
    decode_merge_kernel(const AttncDecodeArgs a, const typename V::Params params) {
  constexpr int kWarps = 4;
  const int q_len = a.header[ATTNC_DH_Q_LEN];
  const int total = a.header[ATTNC_DH_MERGE_ROWS];
  const int per_req = q_len * a.num_qo_heads;
  const int lane = threadIdx.x % 32;
  for (int row = blockIdx.x * kWarps + threadIdx.x / 32; row < total;
       row += gridDim.x * kWarps) {
    const int mi = row / per_req;
    const int rem = row - mi * per_req;
    const int token = rem / a.num_qo_heads;
    const int head = rem - token * a.num_qo_heads;
    const int32_t* me = a.merge_items + mi * ATTNC_MI_SIZE;
    const int request = me[ATTNC_MI_REQUEST];
    const int chunks = me[ATTNC_MI_NUM_CHUNKS];
    const int base = me[ATTNC_MI_PART_BASE];
    auto row_of = [&](int c) -> int64_t {
      return (static_cast<int64_t>(base + c) * q_len + token) * a.num_qo_heads + head;
    };
    const V var(params, RequestInfo{request, q_len, a.req_kv_len[request], a.num_qo_heads,
                                    a.num_kv_heads, HEAD_DIM, a.sm_scale, request * q_len,
                                    kv_token_start_of(a.kv_token_start, request)});
    const int64_t orow = static_cast<int64_t>(request) * q_len + token;
    T* dst = static_cast<T*>(a.o) + orow * a.o_stride_tok +
             static_cast<int64_t>(head) * a.o_stride_head;
    const float lse = warp_merge_row<V, T, HEAD_DIM>(a.part_o, a.part_lse, chunks, row_of, var,
                                                     var.row(token, head), dst, lane);
    if (a.lse != nullptr && lane == 0) a.lse[orow * a.num_qo_heads + head] = lse;
  }
}

}  // namespace attnc
