// Owns: the epilogue of a decode work item, run by the warp that holds the combined state:
// normalise each packed row, then either write the fp32 partial state (O, LSE) of a split
// item for the merge kernel, or apply V::output and write the final O (and LSE). A row without
// any visible key gets O 0 and LSE -inf (LSE = sink when the variant has one; normalize = none:
// the plain weighted sum, LSE 0); a row whose sum is NaN (a NaN score) gets NaN O and LSE.
// A poisoned item (a page id outside the cache, decode_loader.cuh) writes NaN O and LSE.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "decode_args.h"
#include "decode_warp_state.cuh"
#include "mma.cuh"
#include "online_softmax.cuh"
#include "row_store.cuh"

namespace attnc {

// Writes the rows of work item w from the combined state st (T: the output dtype); NaN rows
// when `poisoned`.
template <class V, class T, class Tile>
__device__ __forceinline__ void decode_store_item(const AttncDecodeArgs& a, const V& var,
                                                  const DecodeWarpState<V, Tile>& st, int w,
                                                  int q_len, int group, bool poisoned) {
  constexpr int D = Tile::kHeadDim;
  constexpr int MQ = Tile::kMmaQ;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int tq = lane % 4;
  // The item's row geometry again (L1 hits): fewer registers live through the main loop.
  const int4* src =
      reinterpret_cast<const int4*>(a.items + static_cast<int64_t>(w) * ATTNC_WI_SIZE);
  const int4 lo = __ldg(src);
  const int part = __ldg(reinterpret_cast<const int*>(src) + ATTNC_WI_PART);
  const int kv_head = lo.y;
  const int row0 = lo.z * Tile::kRows;
  const int rows_valid = min(Tile::kRows, q_len * group - row0);
  const int64_t tok_base = static_cast<int64_t>(lo.x) * q_len;
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const SoftmaxRowEnd end = output_row_end(var, st.rows[mi][h], st.m[mi][h], st.l[mi][h],
                                               st.m_scale(mi, h), part < 0, poisoned);
      const int r = mi * 16 + g + 8 * h;
      if (r >= rows_valid) continue;
      const int rr = row0 + r;
      const int token = rr / group;
      const int head = kv_head * group + rr % group;
      if (part >= 0) {
        const int64_t prow = (static_cast<int64_t>(part) * q_len + token) * a.num_qo_heads + head;
        store_partial_row(a.part_o + prow * D + 2 * tq, st.o[mi], h, end.inv);
        if (tq == 0) a.part_lse[prow] = end.lse;
        continue;
      }
      T* dst = static_cast<T*>(a.o) + (tok_base + token) * a.o_stride_tok +
               static_cast<int64_t>(head) * a.o_stride_head + 2 * tq;
      store_output_row<V, T>(dst, var, st.rows[mi][h], st.o[mi], h, end.inv, end.seen);
      if (a.lse != nullptr && tq == 0) a.lse[(tok_base + token) * a.num_qo_heads + head] = end.lse;
    }
  }
}

}  // namespace attnc
