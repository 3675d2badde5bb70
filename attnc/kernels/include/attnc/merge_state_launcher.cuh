// Owns: the standalone merge_state module's host side: ATTNC_DEFINE_MERGE_STATE_MODULE, which
// defines its extern "C" entry point attnc_merge_state (the grid and the launch of
// merge_state_kernel for the dtype; attnc/runtime/wrappers/merge.py loads it with ctypes).
// A generated module is exactly:
//   #include "attnc/merge_state_launcher.cuh"
//   ATTNC_DEFINE_MERGE_STATE_MODULE()
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "merge_state.cuh"
#include "module_exports.h"

// dtype: 0 float32, 1 bfloat16, 2 float16. Returns 0 or a cudaError_t value.
#define ATTNC_DEFINE_MERGE_STATE_MODULE()                                                     \
  ATTNC_EXPORT int attnc_merge_state(const void* o_a, const float* lse_a,                     \
                                     const void* o_b, const float* lse_b, void* o,            \
                                     float* lse, int64_t rows, int32_t head_dim,              \
                                     int32_t dtype, void* stream) {                           \
    if (rows <= 0 || head_dim <= 0) return 0;                                                 \
    const int64_t total = rows * head_dim;                                                    \
    const int threads = 256;                                                                  \
    const int64_t want = (total + threads - 1) / threads;                                     \
    const unsigned blocks = static_cast<unsigned>(want < 65535 ? want : 65535);               \
    cudaStream_t s = static_cast<cudaStream_t>(stream);                                       \
    if (dtype == 0)                                                                           \
      attnc::merge_state_kernel<float><<<blocks, threads, 0, s>>>(                            \
          static_cast<const float*>(o_a), lse_a, static_cast<const float*>(o_b), lse_b,       \
          static_cast<float*>(o), lse, rows, head_dim);                                       \
    else if (dtype == 1)                                                                      \
      attnc::merge_state_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(                    \
          static_cast<const __nv_bfloat16*>(o_a), lse_a,                                      \
          static_cast<const __nv_bfloat16*>(o_b), lse_b, static_cast<__nv_bfloat16*>(o), lse, \
          rows, head_dim);                                                                    \
    else if (dtype == 2)                                                                      \
      attnc::merge_state_kernel<half><<<blocks, threads, 0, s>>>(                             \
          static_cast<const half*>(o_a), lse_a, static_cast<const half*>(o_b), lse_b,         \
          static_cast<half*>(o), lse, rows, head_dim);                                        \
    else                                                                                      \
      return 10003;                                                                           \
    return static_cast<int>(cudaGetLastError());                                              \
  }
