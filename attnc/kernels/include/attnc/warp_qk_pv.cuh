// Owns: the two tensor-core products of one attention tile on a warp's mma fragments
// (lane = threadIdx.x % 32 owns rows lane/4 and lane/4 + 8 of each m16 tile): S = Q K^T from
// swizzled shared memory (Q optionally held in registers), and O += P V with the fp32 weights P
// reused from registers as the A operand. Shared by the prefill and decode kernels.
#pragma once

#include <stdint.h>

#include "mma.cuh"

namespace attnc {

// acc[mi][2n] and acc[mi][2n + 1] += a[mi] x the two n8 halves of the 16x16 B tile at b_addr,
// for every m16 row tile mi (kTrans: B read transposed, as V is).
template <class T, bool kTrans, int MQ, int N>
__device__ __forceinline__ void mma_row_tiles(float (&acc)[MQ][N][4], const uint32_t (&a)[MQ][4],
                                              int n, uint32_t b_addr) {
  uint32_t b[4];
  if constexpr (kTrans) {
    mma::ldmatrix_x4_trans(b, b_addr);
  } else {
    mma::ldmatrix_x4(b, b_addr);
  }
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi) {
    mma::mma_16816<T>(acc[mi][2 * n], a[mi], b[0], b[1]);
    mma::mma_16816<T>(acc[mi][2 * n + 1], a[mi], b[2], b[3]);
  }
}

// S = Q K^T for MQ m16 row tiles x NS n8 key blocks. Q fragments come from q_frag when
// kQInRegs (dimensions [MQ][D/16][4]) or from the swizzled Q tile at q_base; K from k_base.
template <class T, class Layout, bool kQInRegs, int MQ, int NS, int QM, int QK>
__device__ __forceinline__ void warp_qk(float (&s)[MQ][NS][4], const uint32_t (&q_frag)[QM][QK][4],
                                        uint32_t q_base, uint32_t k_base) {
  constexpr int KD = Layout::kChunks / 2;  // k-steps of 16 over the head dim
#pragma unroll
  for (int mi = 0; mi < MQ; ++mi)
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    uint32_t a[MQ][4];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[mi][e] = q_frag[mi][kk][e];
      } else {
        mma::ldmatrix_x4(a[mi], Layout::walk(q_base, 2 * mi, 2 * kk));
      }
    }
#pragma unroll
    for (int nn = 0; nn < NS / 2; ++nn)
      mma_row_tiles<T, false>(s, a, nn, Layout::walk(k_base, 2 * nn, 2 * kk));
  }
}

// O += P V: the fp32 weights of two neighbouring n8 blocks, packed to 16-bit pairs, are the
// A fragment of one k16 step; V comes transposed from the swizzled tile at v_base.
template <class T, class Layout, int MQ, int NS, int NO>
__device__ __forceinline__ void warp_pv(float (&o)[MQ][NO][4], const float (&p)[MQ][NS][4],
                                        uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < NS / 2; ++kk) {
    uint32_t a[MQ][4];
#pragma unroll
    for (int mi = 0; mi < MQ; ++mi) {
      a[mi][0] = mma::Dtype<T>::pack(p[mi][2 * kk][0], p[mi][2 * kk][1]);
      a[mi][1] = mma::Dtype<T>::pack(p[mi][2 * kk][2], p[mi][2 * kk][3]);
      a[mi][2] = mma::Dtype<T>::pack(p[mi][2 * kk + 1][0], p[mi][2 * kk + 1][1]);
      a[mi][3] = mma::Dtype<T>::pack(p[mi][2 * kk + 1][2], p[mi][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < NO / 2; ++dn)
      mma_row_tiles<T, true>(o, a, dn, Layout::walk(v_base, 2 * kk, 2 * dn));
  }
}

}  // namespace attnc
