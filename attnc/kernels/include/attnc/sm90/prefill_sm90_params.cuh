// Owns: the kernel parameter block of the Hopper prefill: the ABI arguments, the variant's
// Params, and the TMA tensor maps of K and V (ragged or paged layout), passed as one
// `const __grid_constant__` struct so the maps stay in parameter space where TMA reads them.
#pragma once

#include <cuda.h>

#include "../prefill_args.h"

namespace attnc {
namespace sm90 {

template <class V>
struct PrefillSm90Params {
  // Ragged: 3-D (head_dim, H_kv, tokens), box (64, 1, kKvTile). Paged: 4-D (head_dim, H_kv,
  // page_size, pages), box (64, 1, page_rows, 1), boxes of page_rows keys (paged_box_rows).
  CUtensorMap tmap_k;
  CUtensorMap tmap_v;
  AttncPrefillArgs args;
  typename V::Params params;
  int use_tma;    // 1: whole KV tiles load through the maps; 0: all by cp.async
  int page_rows;  // paged with use_tma: rows per box (paged_box_rows); else 0
  int ragged_tails;  // ragged with use_tma and the exact token extent: tail tiles of a
                     // multiple of 16 keys load by TMA too (rows past the tail are never read)
};

}  // namespace sm90
}  // namespace attnc
