// Owns: the CUDA runtime calls of a decode plan step (decode_step.h): the stream-ordered
// copies and the event's creation, record, wait and release, behind one switch for tests
// without a GPU (attnc_decode_fake_cuda, decode_plan.cpp) that replaces them by synchronous
// host memcpys (the "device" memory then is host memory) and only counts the events.
#pragma once
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "decode_plan_abi.h"

namespace attnc {
namespace decode_plan {

// The CUDA runtime calls of the step; with ``fake`` set (tests without a GPU) copies are
// synchronous host memcpys and events are counted only.
struct Cuda {
  bool fake = false;
  int64_t copies = 0, records = 0, waits = 0, creates = 0;

  cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, void* stream) {
    ++copies;
    if (fake) {
      memcpy(dst, src, n);
      return cudaSuccess;
    }
    return cudaMemcpyAsync(dst, src, n, kind, static_cast<cudaStream_t>(stream));
  }
  cudaError_t record(AttncStepParams& s) {
    if (s.event == nullptr) {
      ++creates;
      if (fake) {
        s.event = this;  // any non-null handle
      } else {
        // On the workspace's device, whatever the current one is (as torch.cuda.Event does).
        int prev = 0;
        cudaError_t e = cudaGetDevice(&prev);
        if (e == cudaSuccess && prev != s.device) e = cudaSetDevice(static_cast<int>(s.device));
        cudaEvent_t ev = nullptr;
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (prev != s.device) cudaSetDevice(prev);
        if (e != cudaSuccess) return e;
        s.event = ev;
      }
    }
    ++records;
    if (fake) return cudaSuccess;
    return cudaEventRecord(static_cast<cudaEvent_t>(s.event), static_cast<cudaStream_t>(s.stream));
  }
  cudaError_t wait(const AttncStepParams& s) {
    if (s.event == nullptr) return cudaSuccess;
    ++waits;
    if (fake) return cudaSuccess;
    return cudaEventSynchronize(static_cast<cudaEvent_t>(s.event));
  }
  cudaError_t release(AttncStepParams& s) {
    if (s.event == nullptr || fake) {
      s.event = nullptr;
      return cudaSuccess;
    }
    cudaEvent_t ev = static_cast<cudaEvent_t>(s.event);
    s.event = nullptr;
    cudaEventSynchronize(ev);  // the pinned buffers are freed after this
    return cudaEventDestroy(ev);
  }
};

inline Cuda& cuda() {
  static Cuda c;
  return c;
}

}  // namespace decode_plan
}  // namespace attnc
