// Owns: the launch-argument checks the prefill and decode launchers share (host code): the
// instantiations they accept, the variant's Params (size, copy), head_dim, the head counts,
// and the 16-byte alignment and element strides of q/k/v/o that the kernels' vector loads
// need. The runtime checks return the ATTNC_E_* codes of abi_codes.h (0 when they pass).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <cstring>
#include <type_traits>

#include "abi_codes.h"
#include "variant_contract.cuh"

namespace attnc {
namespace launch_checks {

// Compile-time checks of a launcher instantiation: T is __nv_bfloat16 or half, V meets the
// variant contract, head_dim is 64, 128 or 256. Use: static_assert(Instantiation<...>::kOk, "").
template <class V, class T, int HEAD_DIM>
struct Instantiation {
  static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, half>::value,
                "attnc: T must be __nv_bfloat16 or half");
  static_assert(check_variant_contract<V>(), "");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
                "attnc: head_dim must be 64, 128 or 256");
  static constexpr bool kOk = true;
};

// The variant's Params from the args (size checked by check_params_and_heads).
template <class V, class Args>
typename V::Params read_params(const Args& a) {
  typename V::Params params;
  if (!std::is_empty<typename V::Params>::value)
    std::memcpy(&params, a.variant_params, sizeof(params));
  return params;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Params of variant V match the args' variant_params and size; head_dim and the head counts
// (a whole number of query heads per KV head) match the instantiation.
template <class V, class Args>
int check_params_and_heads(const Args& a, int head_dim) {
  using P = typename V::Params;
  const bool size_ok = a.variant_params_size == static_cast<int64_t>(sizeof(P)) ||
                       (std::is_empty<P>::value && a.variant_params_size == 0);
  if (!size_ok) return ATTNC_E_BAD_PARAMS_SIZE;
  if (!std::is_empty<P>::value && a.variant_params == nullptr) return ATTNC_E_BAD_PARAMS_SIZE;
  if (a.head_dim != head_dim) return ATTNC_E_BAD_HEAD_DIM;
  if (a.num_kv_heads <= 0 || a.num_qo_heads <= 0 || a.num_qo_heads % a.num_kv_heads != 0)
    return ATTNC_E_BAD_LAYOUT;
  return 0;
}

// q, k, v, o start 16-byte aligned; q and KV strides are multiples of 8 elements, o strides
// multiples of o_stride_multiple.
template <class Args>
int check_qkvo_layout(const Args& a, int o_stride_multiple) {
  if (!aligned16(a.q) || !aligned16(a.k) || !aligned16(a.v) || !aligned16(a.o))
    return ATTNC_E_BAD_LAYOUT;
  if (a.q_stride_tok % 8 || a.q_stride_head % 8 || a.kv_stride_tok % 8 ||
      a.kv_stride_head % 8 || a.kv_stride_page % 8 || a.o_stride_tok % o_stride_multiple ||
      a.o_stride_head % o_stride_multiple)
    return ATTNC_E_BAD_LAYOUT;
  return 0;
}

}  // namespace launch_checks
}  // namespace attnc
