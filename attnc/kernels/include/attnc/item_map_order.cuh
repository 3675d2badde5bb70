// Owns: the work items of a plan that did not wait for its tile map, finished on the device
// once the classifier has run (`attnc_order_items_by_map`, exported by the tile-map builder):
// each item's KV range is cut to the span of its map row's non-EMPTY columns (the range a
// plan that waited would have given it), and the items are put in the order of their
// non-EMPTY column counts, largest first, ties in list order (the order a plan that waited
// gives; the dynamic item fetch of the Hopper kernel runs them in list order).
//
// The per-item step and the order are __host__ __device__ or plain C++ (item_map_cost,
// order_key, order_items_host), so a CPU build runs what the kernel runs and tests check it
// against brute force. The kernel is one CTA: a histogram of the keys, a scan, and a stable
// scatter of the items warp by warp.
#pragma once

#include <stdint.h>

#include "abi_codes.h"
#include "prefill_args.h"
#include "variant_contract.cuh"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

// Arguments of attnc_order_items_by_map (mirrored by attnc/runtime/planning/tile_map.py).
typedef struct AttncItemOrderArgs {
  int32_t* items;                  // [num_items, ATTNC_PI_SIZE] in and out (the workspace's)
  int32_t* scratch;                // [num_items, ATTNC_PI_SIZE]: the list copied before
  const uint8_t* tile_map;         // the classifier's map
  const int32_t* tile_map_start;   // [batch + 1]
  const int32_t* kv_token_start;   // [batch + 1]: request b has kv_token_start[b + 1] - [b] keys
  int32_t num_items;
  int32_t batch_size;
  int32_t kv_block;                // keys per map column
} AttncItemOrderArgs;

namespace attnc {

// Keys the order tells apart: items with more non-EMPTY columns than this sort as this many
// (ties then in list order).
constexpr int kItemOrderKeys = 4096;
constexpr int kItemOrderThreads = 1024;

// An item's range cut to its map row, and its cost: the non-EMPTY columns among those the
// range touches (0: none; the range is then empty, [begin, begin)).
struct ItemMapCost {
  int begin;
  int end;
  int cost;
};

// Item `it` (ATTNC_PI_SIZE ints) of request `request`, whose KV holds kv_len keys and whose
// map rows start at `row` (the item's query tile's row: cols = ceil(kv_len / kv_block)).
ATTNC_HD ItemMapCost item_map_cost(const int32_t* it, const uint8_t* row, int kv_len,
                                   int kv_block) {
  int begin = it[ATTNC_PI_KV_BEGIN] < 0 ? 0 : it[ATTNC_PI_KV_BEGIN];
  int end = it[ATTNC_PI_KV_END] < kv_len ? it[ATTNC_PI_KV_END] : kv_len;
  if (end <= begin) return ItemMapCost{begin, begin, 0};
  int first = -1, last = -1, cost = 0;
  for (int c = begin / kv_block; c <= (end - 1) / kv_block; ++c) {
    if (row[c] == 0u) continue;  // TileClass::kEmpty
    if (first < 0) first = c;
    last = c;
    ++cost;
  }
  if (cost == 0) return ItemMapCost{begin, begin, 0};
  const int b = first * kv_block > begin ? first * kv_block : begin;
  const int e = (last + 1) * kv_block < end ? (last + 1) * kv_block : end;
  return ItemMapCost{b, e, cost};
}

// The sort key of a cost (larger first).
ATTNC_HD int order_key(int cost) { return cost < kItemOrderKeys - 1 ? cost : kItemOrderKeys - 1; }

// The request of item i's map row and the row itself, from the arguments.
ATTNC_HD const uint8_t* item_map_row(const AttncItemOrderArgs& a, const int32_t* it,
                                     int* kv_len) {
  const int r = it[ATTNC_PI_REQUEST];
  *kv_len = a.kv_token_start[r + 1] - a.kv_token_start[r];
  const int cols = (*kv_len + a.kv_block - 1) / a.kv_block;
  return a.tile_map + a.tile_map_start[r] + static_cast<int64_t>(it[ATTNC_PI_Q_TILE]) * cols;
}

// Copies item `src` to `dst` with the range of `c`; the counters of item 0 (ATTNC_PI_NEXT,
// ATTNC_PI_CTAS_DONE) start at 0 wherever an item lands.
ATTNC_HD void write_item(int32_t* dst, const int32_t* src, const ItemMapCost& c) {
  for (int f = 0; f < ATTNC_PI_SIZE; ++f) dst[f] = src[f];
  dst[ATTNC_PI_KV_BEGIN] = c.begin;
  dst[ATTNC_PI_KV_END] = c.end;
  dst[ATTNC_PI_NEXT] = 0;
  dst[ATTNC_PI_CTAS_DONE] = 0;
}

// The whole step on the CPU (the reference of the kernel below): scratch holds the list,
// items receives it cut and ordered. Requests are assumed valid (the planner's own lists).
inline void order_items_host(const AttncItemOrderArgs& a) {
  const int n = a.num_items;
  int count[kItemOrderKeys] = {0};
  for (int i = 0; i < n; ++i) {
    const int32_t* it = a.scratch + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    int kv_len = 0;
    const uint8_t* row = item_map_row(a, it, &kv_len);
    ++count[order_key(item_map_cost(it, row, kv_len, a.kv_block).cost)];
  }
  int next[kItemOrderKeys];
  int at = 0;
  for (int k = kItemOrderKeys - 1; k >= 0; --k) next[k] = at, at += count[k];
  for (int i = 0; i < n; ++i) {
    const int32_t* it = a.scratch + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    int kv_len = 0;
    const uint8_t* row = item_map_row(a, it, &kv_len);
    const ItemMapCost c = item_map_cost(it, row, kv_len, a.kv_block);
    write_item(a.items + static_cast<int64_t>(next[order_key(c.cost)]++) * ATTNC_PI_SIZE, it, c);
  }
}

#ifdef __CUDACC__
// One CTA of kItemOrderThreads: (1) every thread costs its items (i = t, t + 1024, ...) and
// counts their keys in shared memory; (2) the counts become each key's first place (larger
// keys first) by a block scan; (3) chunks of 1024 items in list order, the 32 warps of a
// chunk in turn: lanes of one key take consecutive places (__match_any_sync), so the order
// is stable and the same on every run.
__global__ void __launch_bounds__(kItemOrderThreads) item_map_order_kernel(AttncItemOrderArgs a) {
  __shared__ int next[kItemOrderKeys];
  __shared__ int partial[kItemOrderThreads];
  constexpr int kPer = kItemOrderKeys / kItemOrderThreads;  // keys a thread scans
  const int t = threadIdx.x;
  for (int k = t; k < kItemOrderKeys; k += kItemOrderThreads) next[k] = 0;
  __syncthreads();
  for (int i = t; i < a.num_items; i += kItemOrderThreads) {
    const int32_t* it = a.scratch + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    int kv_len = 0;
    const uint8_t* row = item_map_row(a, it, &kv_len);
    atomicAdd(&next[order_key(item_map_cost(it, row, kv_len, a.kv_block).cost)], 1);
  }
  __syncthreads();
  // Thread t owns keys (from the largest) kItemOrderKeys - 1 - (t * kPer + j).
  int own[kPer];
  int sum = 0;
  for (int j = 0; j < kPer; ++j) {
    own[j] = next[kItemOrderKeys - 1 - (t * kPer + j)];
    sum += own[j];
  }
  partial[t] = sum;
  __syncthreads();
  for (int step = 1; step < kItemOrderThreads; step *= 2) {  // inclusive scan
    const int add = t >= step ? partial[t - step] : 0;
    __syncthreads();
    partial[t] += add;
    __syncthreads();
  }
  int at = partial[t] - sum;
  for (int j = 0; j < kPer; ++j) {
    next[kItemOrderKeys - 1 - (t * kPer + j)] = at;
    at += own[j];
  }
  __syncthreads();
  const int warp = t / 32, lane = t % 32;
  for (int base = 0; base < a.num_items; base += kItemOrderThreads) {
    const int i = base + t;
    const bool mine = i < a.num_items;
    const int32_t* it = a.scratch + static_cast<int64_t>(mine ? i : 0) * ATTNC_PI_SIZE;
    ItemMapCost c{0, 0, 0};
    int key = -1 - lane;  // a key no other lane has: lanes past the list stay alone
    if (mine) {
      int kv_len = 0;
      const uint8_t* row = item_map_row(a, it, &kv_len);
      c = item_map_cost(it, row, kv_len, a.kv_block);
      key = order_key(c.cost);
    }
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int rank = __popc(same & ((1u << lane) - 1u));
    const int leader = __ffs(same) - 1;
    for (int w = 0; w < kItemOrderThreads / 32; ++w) {
      if (w == warp && mine) {
        int first = 0;
        if (lane == leader) first = next[key];
        first = __shfl_sync(same, first, leader);
        write_item(a.items + static_cast<int64_t>(first + rank) * ATTNC_PI_SIZE, it, c);
        if (lane == leader) next[key] = first + __popc(same);
      }
      __syncthreads();
    }
  }
}

// Checks the arguments, copies the list into scratch and launches the kernel on `stream`.
inline int launch_item_map_order(const AttncItemOrderArgs& a, cudaStream_t stream) {
  if (a.num_items < 0 || a.batch_size < 0 || a.kv_block <= 0) return ATTNC_E_BAD_LAYOUT;
  if (a.num_items == 0) return 0;
  if (a.items == nullptr || a.scratch == nullptr || a.tile_map == nullptr ||
      a.tile_map_start == nullptr || a.kv_token_start == nullptr || a.batch_size == 0)
    return ATTNC_E_BAD_LAYOUT;
  const size_t bytes = static_cast<size_t>(a.num_items) * ATTNC_PI_SIZE * sizeof(int32_t);
  cudaError_t st = cudaMemcpyAsync(a.scratch, a.items, bytes, cudaMemcpyDeviceToDevice, stream);
  if (st != cudaSuccess) return static_cast<int>(st);
  item_map_order_kernel<<<1, kItemOrderThreads, 0, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}
#endif  // __CUDACC__

}  // namespace attnc
