// Owns: the C boundary of the host planner libraries (decode_plan.cpp, prefill_plan.cpp): no
// C++ exception leaves an extern "C" entry (one would terminate the process). The planners
// throw only when their scratch cannot be allocated (std::bad_alloc, std::length_error from a
// vector's resize); any exception becomes ATTNC_PLAN_NO_MEMORY.
#pragma once

#include "attnc/abi_codes.h"

namespace attnc {

// f(), an ATTNC_PLAN_* code; ATTNC_PLAN_NO_MEMORY when it throws.
template <class F>
inline int no_throw(F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return ATTNC_PLAN_NO_MEMORY;
  }
}

}  // namespace attnc
