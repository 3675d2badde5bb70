// Owns: warpgroup-level control of the Hopper kernels: register reallocation (setmaxnreg),
// named barriers (bar.sync / bar.arrive with a thread count), the generic -> async proxy
// fence for shared memory, the wgmma fence / commit / wait, and the compiler fence that pins
// accumulator and fragment registers in place around asynchronous wgmma.
#pragma once

#include <stdint.h>

namespace attnc {
namespace sm90 {

template <int kRegs>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Waits at named barrier `id` until `threads` threads (a multiple of 32) have arrived.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// named_sync that also ORs `pred` over the arriving threads (bar.red.or.pred): every thread
// returns whether any of them passed true.
__device__ __forceinline__ bool named_sync_or(int id, int threads, bool pred) {
  int any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.s32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
      " selp.s32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<int>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// Counts this warp's arrival at named barrier `id` without waiting.
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Orders this thread's view of shared memory written through the generic proxy (st.shared,
// cp.async) before its later async-proxy accesses (wgmma operands, TMA).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most N committed wgmma groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Compiler-only fences: the registers count as read and rewritten here, so no access to them
// moves across an asynchronous wgmma's issue or wait.
__device__ __forceinline__ void pin_register(float& x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void pin_register(uint32_t& x) { asm volatile("" : "+r"(x)::"memory"); }

template <class E, int R, int C>
__device__ __forceinline__ void pin(E (&x)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) pin_register(x[i][j]);
}

}  // namespace sm90
}  // namespace attnc
