// Owns: the consumer warpgroups of the Hopper prefill: each runs its 64 packed query rows of
// every item of the CTA as one stream of K/V stages. Per stage: wait for K and the
// producer's StageInfo (keys, class, last), S = Q K^T by wgmma from the swizzled Q tile and K
// stage, score hooks and mask (PARTIAL tiles and the ragged end only), online softmax, and
// O += P V with P in registers as the A operand and V read MN-major. Schedule: S_{j+1} is
// issued together with P_j V_j, so the softmax of S_{j+1} runs under P_j V_j; the two
// consumers take turns issuing their GEMMs (named barriers), so one's softmax runs under the
// other's GEMMs; and items follow each other without draining (prefill_sm90_consume). Stages
// are handed back (empty barriers) as soon as read: K after S, or after the scores where the
// stage carries key values (staged_keys.cuh), V after P V.
#pragma once

#include <stdint.h>

#include "../mma.cuh"
#if __has_include("../score_hooks.cuh")
#include "../score_hooks.cuh"  // transform_scores
#else
#include "../prefill_warp_math.cuh"
#endif
#include "consumer_softmax.cuh"
#include "mbarrier.cuh"
#include "prefill_sm90_config.cuh"
#include "prefill_sm90_consumer_item.cuh"
#include "prefill_sm90_epilogue.cuh"
#include "prefill_sm90_item.cuh"
#include "prefill_sm90_producer.cuh"
#include "smem_desc.cuh"
#include "staged_keys.cuh"
#include "warpgroup.cuh"
#include "wgmma_ops.cuh"

namespace attnc {
namespace sm90 {

// Pipeline position shared by a consumer's items: stage and phase parity of the next tile.
struct StageCursor {
  int stage = 0;
  int phase = 0;
  template <int kStages>
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// Waits for a stage's barrier; stages filled by cp.async (generic proxy) also need the proxy
// fence before wgmma reads them.
__device__ __forceinline__ void wait_stage(uint32_t bar, int phase, bool tma) {
  mbar_wait(bar, phase);
  if (!tma) fence_proxy_async();
}

// The weights of an S tile as 16-bit A fragments of the P V wgmma: k-step kk takes the n8
// blocks 2kk and 2kk + 1 (the mma.sync m16n8k16 A layout of each warp's 16 rows).
template <class T, int NS>
__device__ __forceinline__ void pack_p(uint32_t (&p)[NS / 2][4], const float (&s)[1][NS][4]) {
#pragma unroll
  for (int kk = 0; kk < NS / 2; ++kk) {
    p[kk][0] = mma::Dtype<T>::pack(s[0][2 * kk][0], s[0][2 * kk][1]);
    p[kk][1] = mma::Dtype<T>::pack(s[0][2 * kk][2], s[0][2 * kk][3]);
    p[kk][2] = mma::Dtype<T>::pack(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
    p[kk][3] = mma::Dtype<T>::pack(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
  }
}

// A tile with a bad page id (zero-filled rows) makes every row of the item NaN in O and LSE,
// as the FA2 and decode kernels write them: a NaN reference max stays NaN and turns every later
// weight (and so l and O) into NaN; without softmax the weights themselves, and l (unused
// there) marks the LSE for the epilogue.
template <class V, int NS>
__device__ __forceinline__ void poison_item_rows(float (&s)[1][NS][4], float (&m)[1][2],
                                                 float (&l)[1][2]) {
  if constexpr (V::kUseSoftmax) {
    m[0][0] = CUDART_NAN_F;
    m[0][1] = CUDART_NAN_F;
  } else {
    l[0][0] = CUDART_NAN_F;
    l[0][1] = CUDART_NAN_F;
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][n][e] = CUDART_NAN_F;
  }
}

// Consumer warpgroup wg (0 .. Shape::kConsumers - 1): every item of this CTA, from its Q rows
// to its stores, as one stream of stages. Within an item, S_{j+1} is issued with P_j V_j.
// Across items the stream does not drain: when an item's last S has completed, the warpgroup
// starts the next item (its Q copy and row set-up), and that item's first S is issued
// together with the last P V of the one before, whose rows are stored while the new S is in
// softmax. An item without tiles
// (kNoTile), or the CTA's last item, ends the stream's run: the last P V is waited for and the
// rows stored, and the next item starts afresh. The member functions are the steps of run();
// all are inlined into it, so the state below lives in registers.
template <class V, class T, class Shape>
struct Sm90Consumer {
  static constexpr int D = Shape::kHeadDim;
  static constexpr int KVT = Shape::kKvTile;
  static constexpr int NS = KVT / 8;
  static constexpr int KD = D / 16;
  static constexpr int KK = KVT / 16;

  const PrefillSm90Params<V>& prm;
  const PrefillSm90Smem<Shape>& sm;
  const int wg;
  const int tq = (threadIdx.x % 32) % 4;
  const SmemDesc q_desc;  // this warpgroup's rows of each Q block
  const FastDiv group;    // num_qo_heads / num_kv_heads: splits packed rows into token, head
  float o[1][D / 8][4];
  float s[1][NS][4];
  uint32_t p[KK][4];      // the weights of the tile whose P V is next
  float alpha[2];
  StageCursor cur;        // the next stage to read
  StageCursor pv;         // the stage of the P V held in p
  bool pv_fence = false;  // that stage was filled by cp.async
  int pv_steps = 0;       // its k-steps that hold keys of the tile
  StageInfo info{};       // what the producer said about the stage last read
  bool masked = false;    // that stage's tile evaluates V::mask (PARTIAL, or short)
  bool keys_held = false;  // that stage carries key values (staged_keys.cuh)
  bool last = false;      // info is the running item's last tile
  bool have_next = false;  // nx holds the item after it (started once the last S completed)
  ConsumerItem<V> ci;  // the item running
  ConsumerItem<V> nx;  // the item after it, once started

  __device__ __forceinline__ Sm90Consumer(const PrefillSm90Params<V>& prm_,
                                          const PrefillSm90Smem<Shape>& sm_, int wg_)
      : prm(prm_),
        sm(sm_),
        wg(wg_),
        q_desc(desc_k_major(sm_.q() + wg_ * 64 * 128)),
        group(FastDiv::make(prm_.args.num_qo_heads / prm_.args.num_kv_heads)) {}

  // S = Q K^T of a stage, with the stepped bias as one more k-step where kBiasInGemm.
  __device__ __forceinline__ void issue_s(int stage) {
    const SmemDesc qd = q_desc.warp_uniform();
    const SmemDesc kd = desc_k_major(sm.k(stage));
#pragma unroll
    for (int kk = 0; kk < KD; ++kk)
      Wgmma<T, KVT>::ss(s[0], qd.at(k_major_step(Shape::kRows, kk)),
                        kd.at(k_major_step(KVT, kk)), kk > 0 ? 1 : 0);
    if constexpr (kBiasInGemm<V, Shape>)
      Wgmma<T, KVT>::ss(s[0], desc_k_major_interleaved(sm.bias_q() + wg * 2048).at(0),
                        desc_k_major_interleaved(sm.bias_k()).at(0), 1);
    wgmma_commit();
  }
  // O += P V. A k-step of 16 keys at or past `pv_steps` holds only keys past a tail tile's end,
  // whose V rows may hold anything (tile_uses_tma): it multiplies its zero weights with the
  // tile's first 16 V rows instead (a select, not a branch, which would make ptxas fence
  // every wgmma), so O gets nothing from rows the tile does not own.
  __device__ __forceinline__ void issue_pv() {
    const SmemDesc vd = desc_mn_major(sm.v(pv.stage), KVT);
#pragma unroll
    for (int kk = 0; kk < KK; ++kk)
      Wgmma<T, D>::template rs<1>(o[0], p[kk], vd.at(kk < pv_steps ? mn_major_step(kk) : 0u),
                                  1);
    wgmma_commit();
  }
  __device__ __forceinline__ void zero_o() {
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][n][e] = 0.f;
  }
  // Score hooks and softmax of the S tile of `info` for item c; returns whether O must be
  // rescaled.
  __device__ __forceinline__ bool scores(const V& var, ConsumerItem<V>& c) {
    const float sm_scale = prm.args.sm_scale;
    const auto keys = StageKeySource<V, Shape>::at(sm.keys(cur.stage));
    if constexpr (kStepUnitsVariant<V, D>) {
      float r0[1][2];
      if (masked) {
        transform_scores_in_units<true>(var, c.rows, c.mult, c.units, c.per_unit, s, info.kv0,
                                        info.kv1, tq, sm_scale, r0, keys);
      } else {
        transform_scores_in_units<false>(var, c.rows, c.mult, c.units, c.per_unit, s, info.kv0,
                                         info.kv1, tq, sm_scale, r0, keys);
      }
      if (info.flags & StageInfo::kBadPage) poison_item_rows<V>(s, c.m, c.l);
      return softmax_step_in_units(s, c.m, c.l, c.units, r0, alpha);
    }
    if constexpr (kBiasInGemm<V, Shape>) {
      // The GEMM added the bias's steps from the tile's first key (gemm_bias.cuh); the bias
      // there joins the softmax once per row. A warp without the fragment evaluates the bias
      // per element, in log2 units (c = 1, r0 = 0).
      float cm[1][2], r0[1][2];
      if (c.bias_in_gemm) {
        if (masked)
          transform_scores<true, true, true>(var, c.rows, c.mult, s, info.kv0, info.kv1, tq,
                                             sm_scale, keys);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          cm[0][h] = c.mult[0][h];
          r0[0][h] = var.score_bias(c.rows[0][h], info.kv0) * kLog2e;
        }
      } else {
        if (masked) {
          transform_scores<true>(var, c.rows, c.mult, s, info.kv0, info.kv1, tq, sm_scale, keys);
        } else {
          transform_scores<false>(var, c.rows, c.mult, s, info.kv0, info.kv1, tq, sm_scale, keys);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          cm[0][h] = 1.f;
          r0[0][h] = 0.f;
        }
      }
      if (info.flags & StageInfo::kBadPage) poison_item_rows<V>(s, c.m, c.l);
      return softmax_step_scaled(s, c.m, c.l, cm, r0, alpha);
    }
    if (masked) {
      transform_scores<true, true>(var, c.rows, c.mult, s, info.kv0, info.kv1, tq, sm_scale,
                                   keys);
    } else {
      transform_scores<false, true>(var, c.rows, c.mult, s, info.kv0, info.kv1, tq, sm_scale,
                                    keys);
    }
    if (info.flags & StageInfo::kBadPage) poison_item_rows<V>(s, c.m, c.l);
    if constexpr (V::kUseSoftmax)
      return softmax_step<V, kConsumerExp2PolyEvery<V, Shape>>(s, c.m, c.l, c.mult, alpha);
    return false;
  }
  // Turns go round-robin: wg waits for wg - 1 and hands over to wg + 1 (each barrier joins
  // the two warpgroups of one hand-over).
  static constexpr int NC = Shape::kConsumers;
  __device__ __forceinline__ void take_turn() { named_sync(kSchedBarrier + wg, 256); }
  __device__ __forceinline__ void pass_turn() {
    named_arrive(kSchedBarrier + (wg + 1 == NC ? 0 : wg + 1), 256);
  }
  // The next stage's K and what the producer says about it.
  __device__ __forceinline__ void wait_k() {
    mbar_wait(sm.full_k(cur.stage), cur.phase);
    info = StageInfo::load(sm.info(cur.stage));
    masked = tile_is_masked<V, Shape>(info);
    keys_held = stage_holds_keys<V, Shape>(info);
    if (info.flags & StageInfo::kCpAsync) fence_proxy_async();
  }
  // Starts item w (the CTA's first, or the one the producer named with the last stage).
  __device__ __forceinline__ bool start(ConsumerItem<V>& into, int w) {
    return start_item<V, T, Shape>(prm.args, prm.params, group, sm.q(), wg, w, into);
  }
  // The item after the running one, named by the stage just read. Read while that stage's S
  // is in flight, so that the tile's bookkeeping after the S wait does not start with a
  // shared-memory load (read on every stage: a read only on the last made ptxas spill the
  // sigmoid kernel); the stage is handed back only after S, so the producer has not
  // overwritten it.
  __device__ __forceinline__ int next_named() const {
    return StageInfo::read_next(sm.info(cur.stage));
  }
  // After S of the stage just read has completed: notes whether the stage is the running
  // item's last and hands K back (a stage with key values only after the scores: hold_p).
  __device__ __forceinline__ void took_s() {
    pin(s[0]);
    last = info.flags & StageInfo::kLast;
    if (!keys_held) mbar_arrive(sm.empty_k(cur.stage));
  }
  // When the stage just read was the running item's last tile, start the next item.
  __device__ __forceinline__ void start_next(int next) { have_next = last && start(nx, next); }
  // The weights of the stage just read become the next P V's.
  __device__ __forceinline__ void hold_p() {
    if (keys_held) mbar_arrive(sm.empty_k(cur.stage));  // its key values are read
    pack_p<T>(p, s);
    pv = cur;
    pv_fence = info.flags & StageInfo::kCpAsync;
    pv_steps = (info.kv1 - info.kv0 + 15) / 16;
    cur.advance<Shape::kStages>();
  }
  __device__ __forceinline__ void took_pv() {
    wgmma_wait<0>();
    pin(o[0]);
    pin(p);
    mbar_arrive(sm.empty_v(pv.stage));
  }

  // Hands back the stage just read (a kNoTile stage: nothing was loaded) and returns the item
  // it names.
  __device__ __forceinline__ int release_no_tile_stage() {
    const int next = StageInfo::read_next(sm.info(cur.stage));
    mbar_arrive(sm.empty_k(cur.stage));
    mbar_wait(sm.full_v(cur.stage), cur.phase);
    mbar_arrive(sm.empty_v(cur.stage));
    cur.advance<Shape::kStages>();
    return next;
  }
  // The first tile of a fresh run (no wgmma in flight).
  __device__ __forceinline__ void first_tile(const V& var) {
    take_turn();
    wgmma_fence();
    issue_s(cur.stage);
    pass_turn();
    const int next = next_named();
    wgmma_wait<0>();
    took_s();
    start_next(next);
    scores(var, ci);  // O is still 0: no rescale
    hold_p();
  }
  // In the GEMM turn: S of the stage just read, then the P V held in p (once its V is in;
  // v_in: its barrier was seen complete already).
  __device__ __forceinline__ void issue_s_and_pv(bool v_in = false) {
    if (!v_in) mbar_wait(sm.full_v(pv.stage), pv.phase);
    if (pv_fence) fence_proxy_async();
    take_turn();
    wgmma_fence();
    issue_s(cur.stage);
    issue_pv();
    pass_turn();
  }
  // A tile after the first of the same item: its S goes out with the P V before it.
  __device__ __forceinline__ void next_tile(const V& var) {
    const bool v_in = mbar_test(sm.full_v(pv.stage), pv.phase);  // overlaps the K wait
    wait_k();
    issue_s_and_pv(v_in);
    const int next = next_named();
    wgmma_wait<1>();
    took_s();
    start_next(next);
    const bool rescale = scores(var, ci);
    took_pv();
    if (rescale) rescale_o(o, alpha);
    hold_p();
  }
  // The run ends: the last P V alone, then the rows.
  __device__ __forceinline__ void drain(const V& var) {
    wait_stage(sm.full_v(pv.stage), pv.phase, !pv_fence);
    wgmma_fence();
    issue_pv();
    took_pv();
    prefill_sm90_store<V, T, D>(prm.args, var, group, ci, wg, o);
  }
  // The next item's first S goes out with ci's last P V; its rows are set up meanwhile, and
  // ci's rows are stored while the new S is in softmax.
  __device__ __forceinline__ void switch_item(V& var) {
    wait_q_rows(wg);
    issue_s_and_pv();
    const V next_var = nx.functor(prm.params);
    set_up_rows<V, Shape>(next_var, prm.args.sm_scale, wg, group, nx);
    const int next = next_named();
    wgmma_wait<1>();
    took_s();
    scores(next_var, nx);  // the next item's O starts at 0: no rescale
    took_pv();
    prefill_sm90_store<V, T, D>(prm.args, var, group, ci, wg, o);
    zero_o();
    ci = nx;
    var = next_var;
    start_next(next);
    hold_p();
  }
  // One run of items that follow each other without draining, from ci's first tile (already
  // read into `info`); returns whether another item follows, and then whether its first
  // stage was read already (`pending`).
  __device__ __forceinline__ bool run_stream(bool& pending) {
    V var = ci.functor(prm.params);
    first_tile(var);
    for (;;) {
      if (!last) {
        next_tile(var);
        continue;
      }
      // p holds ci's last tile; its P V is not issued yet.
      if (have_next) wait_k();
      if (!have_next || (info.flags & StageInfo::kNoTile)) {
        drain(var);
        pending = have_next;
        if (have_next) ci = nx;
        return have_next;
      }
      switch_item(var);
    }
  }
  __device__ __forceinline__ void run() {
    if (wg == NC - 1) named_arrive(kSchedBarrier + 0, 256);  // consumer 0 issues first
    bool have = start(ci, static_cast<int>(blockIdx.x));
    bool pending = false;  // the first stage of ci was already read (into `info`)
    while (have) {
      if (ci.rows_valid <= 0) {  // no query rows: the producer published one kNoTile stage
        wait_q_rows(wg);
        if (!pending) wait_k();
        pending = false;
        have = start(ci, release_no_tile_stage());
        continue;
      }
      // A fresh run: ci's Q copy is issued, no wgmma is in flight.
      zero_o();
      set_up_rows<V, Shape>(ci.functor(prm.params), prm.args.sm_scale, wg, group, ci);
      wait_q_rows(wg);
      if (!pending) wait_k();
      pending = false;
      if (info.flags & StageInfo::kNoTile) {  // no tile: store its rows (empty or sink-only)
        const int next = release_no_tile_stage();
        prefill_sm90_store<V, T, D>(prm.args, ci.functor(prm.params), group, ci, wg, o);
        have = start(ci, next);
        continue;
      }
      have = run_stream(pending);
    }
    if (wg == 0) named_sync(kSchedBarrier + 0, 256);  // balance the last one's first arrival
  }
};

template <class V, class T, class Shape>
__device__ __forceinline__ void prefill_sm90_consume(const PrefillSm90Params<V>& prm,
                                                     const PrefillSm90Smem<Shape>& sm, int wg) {
  Sm90Consumer<V, T, Shape> consumer(prm, sm, wg);
  consumer.run();
}

}  // namespace sm90
}  // namespace attnc
