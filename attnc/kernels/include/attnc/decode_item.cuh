// Owns: the decode work item as the kernel sees it: reading one entry of the work list
// (request, KV head, row block, KV chunk, partial slot) into its packed-row geometry and its
// visible KV range (V::kv_range clipped to the chunk), and the walk over the item's KV tiles
// that skips the tiles V::classify finds EMPTY.
#pragma once

#include <stdint.h>

#include "decode_args.h"
#include "variant_contract.cuh"

namespace attnc {

// What a work item covers, read from the work list (begin/end: its visible chunk).
struct DecodeItem {
  int request;
  int kv_head;
  int row0;        // first packed row
  int rows_valid;  // packed rows of the item that exist
  int t0, t1;      // query tokens [t0, t1) of those rows
  int kv_len;
  int begin, end;  // visible KV range of the chunk
  int num_tiles;
  int part;
};

// The functor's view of the item's request.
template <int D>
__device__ __forceinline__ RequestInfo decode_request_info(const AttncDecodeArgs& a,
                                                           const DecodeItem& it, int q_len) {
  return RequestInfo{it.request, q_len, it.kv_len, a.num_qo_heads, a.num_kv_heads, D,
                     a.sm_scale, it.request * q_len,
                     kv_token_start_of(a.kv_token_start, it.request)};
}

// Reads work item w; ROWS packed rows per item, KVT keys per tile, head_dim D.
template <class V, int ROWS, int KVT, int D>
__device__ __forceinline__ DecodeItem decode_open_item(const AttncDecodeArgs& a,
                                                       const typename V::Params& params, int w,
                                                       int q_len, int group) {
  const int4* src =
      reinterpret_cast<const int4*>(a.items + static_cast<int64_t>(w) * ATTNC_WI_SIZE);
  const int4 lo = __ldg(src);
  const int4 hi = __ldg(src + 1);
  DecodeItem it;
  it.request = lo.x;
  it.kv_head = lo.y;
  it.row0 = lo.z * ROWS;
  it.part = hi.y;
  it.kv_len = __ldg(a.req_kv_len + it.request);
  it.rows_valid = min(ROWS, q_len * group - it.row0);
  it.t0 = it.row0 / group;
  it.t1 = (it.row0 + it.rows_valid - 1) / group + 1;
  const V var(params, decode_request_info<D>(a, it, q_len));
  KvRange range{0, 0};
  if (it.kv_len > 0) range = var.kv_range(it.t0, it.t1);
  it.begin = max(max(range.begin, lo.w), 0);
  it.end = min(min(range.end, hi.x), it.kv_len);
  it.num_tiles = it.end > it.begin ? (it.end - it.begin + KVT - 1) / KVT : 0;
  return it;
}

// First tile >= t of the item that the mask does not hide entirely.
template <class V, int KVT>
__device__ __forceinline__ int decode_next_tile(const V& var, const DecodeItem& it, int t) {
  if constexpr (V::kHasMask) {
    while (t < it.num_tiles) {
      const int kv0 = it.begin + t * KVT;
      if (var.classify(it.t0, it.t1, kv0, min(kv0 + KVT, it.end)) != TileClass::kEmpty) break;
      ++t;
    }
  }
  return t;
}

}  // namespace attnc
