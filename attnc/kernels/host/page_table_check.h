// Owns: what the two host planners (prefill_plan_check.h, decode_step.h) share about a paged
// KV batch: the KV length of a request from its page count and last-page length.
#pragma once
#include <stdint.h>

namespace attnc {
namespace page_table {

// A request's KV tokens in a paged cache: (pages - 1) * page_size + last, 0 without pages
// (pages <= 0). Computed in uint64 and wrapped to int64, so values no check let through give
// a number, never undefined behaviour (checks/limits.py paged_kv_tokens is the Python one).
inline int64_t paged_kv_len(int64_t pages, int64_t page_size, int64_t last) {
  if (pages <= 0) return 0;
  return static_cast<int64_t>(static_cast<uint64_t>(pages - 1) * static_cast<uint64_t>(page_size) +
                              static_cast<uint64_t>(last));
}

}  // namespace page_table
}  // namespace attnc
