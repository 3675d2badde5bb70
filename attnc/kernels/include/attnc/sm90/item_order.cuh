// Owns: which work items a persistent Hopper prefill CTA runs, in which order. CTA b runs item
// b first (the plan lists items heaviest first, or placed for the walk by the host planner's
// prefill_plan_walk.h). The producer then picks each next item as the
// running one starts and names it to the consumers on the item's last stage:
// - the alternating walk (variants whose masks do not read token tensors): round r of
//   gridDim.x items, CTA b taking item r * gridDim.x + b in even rounds and
//   r * gridDim.x + gridDim.x - 1 - b in odd ones, so a CTA that got a heavy item in one
//   round gets a light one in the next;
// - the dynamic fetch (masks that read token tensors, such as documents, whose tiles the
//   plan costs from the data map): the next untaken item of the list, counted in item 0's
//   spare words, so the CTA that finishes first runs the next heaviest item.
// On the H200 (RESULTS.md run 30) the fetch ran the document mask 11% faster than the walk,
// and the walk ran the 1024-token window 2.5% and causal 2K 2% faster than the fetch.
#pragma once

#include <stdint.h>

#include "../prefill_args.h"
#include "prefill_sm90_config.cuh"

namespace attnc {
namespace sm90 {

// Item of round r of the alternating walk for CTA b of g (>= num_work: none is left).
__host__ __device__ __forceinline__ int alternating_walk_item(int r, int b, int g) {
  return (r & 1) ? r * g + (g - 1 - b) : r * g + b;
}

// The producer's side. pick() chooses the item after the one starting; its result may be
// an atomic's that has not returned yet, so it is turned into the item index (index()) only
// where it is first used, at the item's last stage: the latency does not hold up the item's
// first loads, which thread 0 issues. Thread 0 hands the index to the producer's other
// threads through two alternating shared words: it writes word k & 1 again only two items
// later, after a barrier every thread passes once it has read the word.
template <class Shape, bool kDynamic>
struct ItemOrder {
  int32_t* counters;  // item 0's ATTNC_PI_NEXT and ATTNC_PI_CTAS_DONE (dynamic fetch only)
  int round = 0;      // rounds of the walk started
  int k = 0;          // items handed over

  __device__ __forceinline__ explicit ItemOrder(const AttncPrefillArgs& a)
      : counters(const_cast<int32_t*>(a.items) + ATTNC_PI_NEXT) {}

  __device__ __forceinline__ int pick() {
    ++round;
    if constexpr (kDynamic) {
      int taken_before = 0;
      if (threadIdx.x == 0) taken_before = atomicAdd(counters, 1);
      return taken_before;
    } else {
      return alternating_walk_item(round, static_cast<int>(blockIdx.x),
                                   static_cast<int>(gridDim.x));
    }
  }
  __device__ __forceinline__ static int index(int picked) {
    return kDynamic ? static_cast<int>(gridDim.x) + picked : picked;
  }
  // Thread 0, at the item's last stage: the index for the other producer threads.
  __device__ __forceinline__ void hand_over(const PrefillSm90Smem<Shape>& sm, int w) const {
    st_shared(sm.fetched(k & 1), w);
  }
  // The index handed over, after the producer barrier that follows the item's last stage.
  __device__ __forceinline__ int handed(const PrefillSm90Smem<Shape>& sm) {
    const int w = ld_shared(sm.fetched(k & 1));
    ++k;
    return w;
  }
  // After the CTA's last item: the launch's last CTA to get here resets the counters.
  __device__ __forceinline__ void finish() const {
    if constexpr (kDynamic) {
      if (threadIdx.x != 0) return;
      __threadfence();
      if (atomicAdd(counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
        atomicExch(counters, 0);
        atomicExch(counters + 1, 0);
      }
    }
  }
};

}  // namespace sm90
}  // namespace attnc
