// Owns: the device-side page-id check shared by the paged K/V gathers (decode, FA2 prefill,
// Hopper prefill): the range test of one page id against the pool size, and the report of a
// bad id into the caller's status word.
//
// The status word (AttncDecodeArgs / AttncPrefillArgs .page_status, 8 bytes of device memory
// owned by the wrapper) holds ATTNC_PAGE_STATUS_CLEAR while no bad id was seen; each report
// is an atomicMin of (request << 32 | (uint32)id), so after a launch it holds the lowest bad
// request and, of that request's bad ids, the smallest as unsigned (negative ids compare
// after every valid one). The host reads and clears it (attnc/runtime/checks/page_status.py).
#pragma once

#include <stdint.h>

#define ATTNC_PAGE_STATUS_CLEAR 0xffffffffffffffffull

namespace attnc {

// True when page id `id` is outside [0, num_pages): one unsigned compare.
__device__ __forceinline__ bool page_id_bad(int id, int num_pages) {
  return static_cast<uint32_t>(id) >= static_cast<uint32_t>(num_pages);
}

// Records bad page id `id` of request `request` (no-op for a NULL status word).
__device__ __forceinline__ void report_bad_page(uint64_t* status, int request, int id) {
  if (status == nullptr) return;
  const unsigned long long key =
      (static_cast<unsigned long long>(static_cast<uint32_t>(request)) << 32) |
      static_cast<uint32_t>(id);
  atomicMin(reinterpret_cast<unsigned long long*>(status), key);
}

}  // namespace attnc
