// Owns: the Hopper (sm_90a) prefill kernel for one variant functor V and CTA shape: a
// persistent CTA of 1 + Shape::kConsumers warpgroups runs item blockIdx.x, then the items
// its producer picks (ItemOrder, item_order.cuh: an alternating walk, or for masks that read
// token tensors the next untaken item of the plan's list). Warpgroup 0 picks the items, names
// each next one to the consumers on the item's last stage, and produces K/V stages
// (prefill_sm90_producer.cuh) with few registers; warpgroups 1.. (two or three) each run 64
// packed query rows of every item as one stream of stages (prefill_sm90_mainloop.cuh) with
// many registers, and store their rows (prefill_sm90_epilogue.cuh). Packed row r of an item
// is token r / group, head kv_head * group + r % group, as in the FA2 kernel.
#pragma once

#include <math_constants.h>
#include <stdint.h>

#include "../cp_async.cuh"
#include "../mma.cuh"
#include "../variant_contract.cuh"
#include "gemm_bias.cuh"
#include "mbarrier.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_item.cuh"
#include "prefill_sm90_mainloop.cuh"
#include "prefill_sm90_params.cuh"
#include "prefill_sm90_producer.cuh"
#include "smem_desc.cuh"
#include "warpgroup.cuh"

namespace attnc {
namespace sm90 {

template <class V, class T, class Shape>
__global__ void __launch_bounds__(Shape::kThreads, 1)
    prefill_sm90_kernel(const __grid_constant__ PrefillSm90Params<V> prm) {
  static_assert(VariantContract<V>::ok, "");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const PrefillSm90Smem<Shape> sm{(mma::smem_addr(smem_raw) + 1023u) & ~1023u};
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Shape::kStages; ++s) {
      mbar_init(sm.full_k(s), 1);
      mbar_init(sm.full_v(s), 1);
      mbar_init(sm.empty_k(s), Shape::kConsumerThreads);
      mbar_init(sm.empty_v(s), Shape::kConsumerThreads);
    }
    mbar_fence_init();
  }
  if constexpr (kBiasInGemm<V, Shape>) {
    write_bias_blocks<T, Shape>(sm.bias_k(), sm.bias_q());
    fence_proxy_async();  // wgmma (the async proxy) reads the blocks after the sync
  }
  __syncthreads();
  const int role = threadIdx.x / 128;
  if (role == 0) {
    regs_decrease<Shape::kProducerRegs>();
    prefill_sm90_produce<V, T, Shape>(prm, sm);
  } else {
    regs_increase<Shape::kConsumerRegs>();
    prefill_sm90_consume<V, T, Shape>(prm, sm, role - 1);
  }
}

}  // namespace sm90
}  // namespace attnc
