// Owns: the epilogue stores of one finished row of an mma O tile as a lane holds it (row half
// h of an m16 tile: columns 8n + 2t and 8n + 2t + 1 of every n8 block n, t = lane % 4): the
// fp32 partial state of a split item, or the final output in the kernel's 16-bit dtype after
// V::output. Shared by the prefill and decode epilogues.
#pragma once

#include <stdint.h>

#include "mma.cuh"

namespace attnc {

// dst: this lane's first column of the row in the fp32 partial-state buffer.
template <int NO>
__device__ __forceinline__ void store_partial_row(float* dst, const float (&o)[NO][4], int h,
                                                  float inv) {
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    *reinterpret_cast<float2*>(dst + n * 8) =
        make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
}

// dst: this lane's first column of the row in the output; visible: the row saw a visible key
// (V::output is applied only then: a row without one stays 0).
template <class V, class T, int NO>
__device__ __forceinline__ void store_output_row(T* dst, const V& var,
                                                 const typename V::Row& row,
                                                 const float (&o)[NO][4], int h, float inv,
                                                 bool visible) {
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    float y0 = o[n][2 * h] * inv;
    float y1 = o[n][2 * h + 1] * inv;
    if constexpr (V::kHasOutput) {
      if (visible) {
        y0 = var.output(row, y0);
        y1 = var.output(row, y1);
      }
    }
    *reinterpret_cast<uint32_t*>(dst + n * 8) = mma::Dtype<T>::pack(y0, y1);
  }
}

}  // namespace attnc
