// Owns: the kernel parameter block of the Hopper prefill: the ABI arguments, the variant's
// Params, and the TMA tensor maps of K and V (ragged layout), passed as one
// `const __grid_constant__` struct so the maps stay in parameter space where TMA reads them.
#pragma once

#include <cuda.h>

#include "../prefill_args.h"

namespace attnc {
namespace sm90 {

template <class V>
struct PrefillSm90Params {
  CUtensorMap tmap_k;  // 3-D (head_dim, H_kv, tokens), box (64, 1, kKvTile); ragged only
  CUtensorMap tmap_v;
  AttncPrefillArgs args;
  typename V::Params params;
  int use_tma;         // 1: full ragged KV tiles load through the maps; 0: all by cp.async
};

}  // namespace sm90
}  // namespace attnc
