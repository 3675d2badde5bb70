// Owns: asynchronous global -> shared copies (sm80 cp.async): one 16-byte copy that
// zero-fills its destination when the source is out of range, commit and wait.
#pragma once

#include <stdint.h>

namespace attnc {

// Copies 16 bytes from gmem to the shared address smem; when `valid` is false nothing is read
// and the 16 destination bytes are zeroed (gmem must still be a mapped address).
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace attnc
