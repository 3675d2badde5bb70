// Owns: how a generated module exports its C entry points: the visibility attribute that keeps
// them, and only them, outside the library (the toolchain hides every other symbol), and the
// pair every launcher module defines: the launch entry, which answers ATTNC_E_BAD_LAYOUT for a
// null argument struct, and the ABI version query.
#pragma once

#include "abi_codes.h"

#define ATTNC_EXPORT extern "C" __attribute__((visibility("default")))

// Defines `int NAME(const ARGS* args, void* cuda_stream)`, which returns
// LAUNCH(*args, stream), and `int NAME##_abi_version(void)`, which returns VERSION. A LAUNCH
// with commas goes in parentheses: (::attnc::launch_decode<V, T, HEAD_DIM>).
#define ATTNC_DEFINE_LAUNCH_ENTRY(NAME, ARGS, LAUNCH, VERSION)    \
  ATTNC_EXPORT int NAME(const ARGS* args, void* cuda_stream) {    \
    if (args == nullptr) return ATTNC_E_BAD_LAYOUT;               \
    return LAUNCH(*args, static_cast<cudaStream_t>(cuda_stream)); \
  }                                                               \
  ATTNC_EXPORT int NAME##_abi_version(void) { return VERSION; }
