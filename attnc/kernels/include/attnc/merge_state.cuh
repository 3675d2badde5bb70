// Owns: merging attention states (O, LSE) of disjoint KV ranges: the -inf safe arithmetic
// (o = sum_i e^{lse_i - lse} o_i, lse = log sum_i e^{lse_i}) and the kernel of the public
// two-state merge (its module's launcher: merge_state_launcher.cuh).
// Sums always run in a fixed order, so results are bit-identical run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

namespace attnc {

template <class T>
struct Scalar;
template <>
struct Scalar<float> {
  __device__ __forceinline__ static float load(const float* p) { return *p; }
  __device__ __forceinline__ static void store(float* p, float x) { *p = x; }
};
template <>
struct Scalar<__nv_bfloat16> {
  __device__ __forceinline__ static float load(const __nv_bfloat16* p) {
    return __bfloat162float(*p);
  }
  __device__ __forceinline__ static void store(__nv_bfloat16* p, float x) {
    *p = __float2bfloat16_rn(x);
  }
};
template <>
struct Scalar<half> {
  __device__ __forceinline__ static float load(const half* p) { return __half2float(*p); }
  __device__ __forceinline__ static void store(half* p, float x) { *p = __float2half_rn(x); }
};

// Weights of two states: o = wa * o_a + wb * o_b; lse as defined above; both weights 0 and
// lse -inf when neither state saw a visible key.
struct MergeWeights {
  float wa, wb, lse;
  __device__ __forceinline__ static MergeWeights make(float lse_a, float lse_b) {
    const float m = fmaxf(lse_a, lse_b);
    MergeWeights w;
    if (m == -CUDART_INF_F) {
      w.wa = 0.f;
      w.wb = 0.f;
      w.lse = -CUDART_INF_F;
      return w;
    }
    const float ea = expf(lse_a - m);
    const float eb = expf(lse_b - m);
    const float s = ea + eb;
    w.wa = ea / s;
    w.wb = eb / s;
    w.lse = m + logf(s);
    return w;
  }
};

// One thread per element of [rows, head_dim]; lse has one value per row.
template <class T>
__global__ void merge_state_kernel(const T* o_a, const float* lse_a, const T* o_b,
                                   const float* lse_b, T* o, float* lse, int64_t rows,
                                   int head_dim) {
  const int64_t total = rows * head_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / head_dim;
    const MergeWeights w = MergeWeights::make(lse_a[row], lse_b[row]);
    const float x = w.wa * Scalar<T>::load(o_a + i) + w.wb * Scalar<T>::load(o_b + i);
    Scalar<T>::store(o + i, x);
    if (i - row * head_dim == 0) lse[row] = w.lse;
  }
}

}  // namespace attnc
