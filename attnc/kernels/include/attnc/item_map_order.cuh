// Owns: the work items of a plan that did not wait for its tile map, finished on the device
// once the classifier has run (`attnc_queue_tile_map`, exported by the tile-map builder):
// each item's KV range is cut to the span of its map row's non-EMPTY columns (the range a
// plan that waited would have given it), and the items are put in the order of their
// non-EMPTY column counts, largest first, ties in list order (the order a plan that waited
// gives; the dynamic item fetch of the Hopper kernel runs them in list order).
//
// The per-item arithmetic and the order are __host__ __device__ or plain C++ (item_columns,
// cut_item, order_key, order_items_host), so a CPU build runs what the kernels run and tests
// check it against brute force. Two kernels: a warp per item scans its map row (the whole
// grid) and writes the cut item into scratch, then one CTA orders the items back into the
// list (a histogram of the keys, a scan, a stable scatter of the items warp by warp).
#pragma once

#include <stdint.h>

#include "abi_codes.h"
#include "prefill_args.h"
#include "variant_contract.cuh"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

// The item step's arguments to attnc_queue_tile_map (mirrored by
// attnc/runtime/planning/tile_map.py).
typedef struct AttncItemOrderArgs {
  int32_t* items;                  // [num_items, ATTNC_PI_SIZE] in and out (the workspace's)
  int32_t* scratch;                // [num_items, ATTNC_PI_SIZE]: the cut items, before ordering
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

// The item's range clamped to its request's keys, and the map columns [c0, c1) it touches.
struct ItemColumns {
  int begin, end, c0, c1;
};
ATTNC_HD ItemColumns item_columns(const int32_t* it, int kv_len, int kv_block) {
  const int begin = it[ATTNC_PI_KV_BEGIN] < 0 ? 0 : it[ATTNC_PI_KV_BEGIN];
  const int end = it[ATTNC_PI_KV_END] < kv_len ? it[ATTNC_PI_KV_END] : kv_len;
  if (end <= begin) return ItemColumns{begin, begin, 0, 0};
  return ItemColumns{begin, end, begin / kv_block, (end - 1) / kv_block + 1};
}

// The cut range from the first and last non-EMPTY columns and their count (count 0: none).
ATTNC_HD ItemMapCost cut_item(const ItemColumns& c, int first, int last, int count,
                              int kv_block) {
  if (count == 0) return ItemMapCost{c.begin, c.begin, 0};
  const int b = first * kv_block > c.begin ? first * kv_block : c.begin;
  const int e = (last + 1) * kv_block < c.end ? (last + 1) * kv_block : c.end;
  return ItemMapCost{b, e, count};
}

// Item `it` (ATTNC_PI_SIZE ints) of a request whose KV holds kv_len keys, its query tile's map
// row at `row` (cols = ceil(kv_len / kv_block)): the scan one lane does (the CPU reference;
// the kernel scans a row with a warp).
ATTNC_HD ItemMapCost item_map_cost(const int32_t* it, const uint8_t* row, int kv_len,
                                   int kv_block) {
  const ItemColumns cols = item_columns(it, kv_len, kv_block);
  int first = -1, last = -1, count = 0;
  for (int c = cols.c0; c < cols.c1; ++c) {
    if (row[c] == 0u) continue;  // TileClass::kEmpty
    if (first < 0) first = c;
    last = c;
    ++count;
  }
  return cut_item(cols, first, last, count, kv_block);
}

// The sort key of a cost (larger first).
ATTNC_HD int order_key(int cost) { return cost < kItemOrderKeys - 1 ? cost : kItemOrderKeys - 1; }

// The map row of item `it` and its request's keys, from the arguments.
ATTNC_HD const uint8_t* item_map_row(const AttncItemOrderArgs& a, const int32_t* it,
                                     int* kv_len) {
  const int r = it[ATTNC_PI_REQUEST];
  *kv_len = a.kv_token_start[r + 1] - a.kv_token_start[r];
  const int cols = (*kv_len + a.kv_block - 1) / a.kv_block;
  return a.tile_map + a.tile_map_start[r] + static_cast<int64_t>(it[ATTNC_PI_Q_TILE]) * cols;
}

// Copies item `src` to `dst`; the counters of item 0 (ATTNC_PI_NEXT, ATTNC_PI_CTAS_DONE)
// start at 0 wherever an item lands.
ATTNC_HD void write_item(int32_t* dst, const int32_t* src) {
  for (int f = 0; f < ATTNC_PI_SIZE; ++f) dst[f] = src[f];
  dst[ATTNC_PI_NEXT] = 0;
  dst[ATTNC_PI_CTAS_DONE] = 0;
}

// The whole step on the CPU (the reference of the kernels below): items holds the list, cut
// into scratch, then written back cut and ordered. Requests are assumed valid (the planner's
// own lists).
inline void order_items_host(const AttncItemOrderArgs& a) {
  const int n = a.num_items;
  int count[kItemOrderKeys] = {0};
  for (int i = 0; i < n; ++i) {  // cut, the cost parked in the item's ATTNC_PI_NEXT word
    int32_t* it = a.scratch + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    const int32_t* listed = a.items + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    for (int f = 0; f < ATTNC_PI_SIZE; ++f) it[f] = listed[f];
    int kv_len = 0;
    const uint8_t* row = item_map_row(a, it, &kv_len);
    const ItemMapCost c = item_map_cost(it, row, kv_len, a.kv_block);
    it[ATTNC_PI_KV_BEGIN] = c.begin;
    it[ATTNC_PI_KV_END] = c.end;
    it[ATTNC_PI_NEXT] = c.cost;
    ++count[order_key(c.cost)];
  }
  int next[kItemOrderKeys];
  int at = 0;
  for (int k = kItemOrderKeys - 1; k >= 0; --k) next[k] = at, at += count[k];
  for (int i = 0; i < n; ++i) {
    const int32_t* it = a.scratch + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    const int place = next[order_key(it[ATTNC_PI_NEXT])]++;
    write_item(a.items + static_cast<int64_t>(place) * ATTNC_PI_SIZE, it);
  }
}

#ifdef __CUDACC__
constexpr int kItemCostThreads = 256;  // a warp per item

// Step 1, a warp per item over the whole grid: the lanes read 32 consecutive columns of the
// item's map row at a time, a ballot gives the first and last non-EMPTY ones and their count;
// the lanes write the item into scratch, with the cut range and the cost parked in
// ATTNC_PI_NEXT (items is only read here: step 2 writes it).
__global__ void __launch_bounds__(kItemCostThreads) item_map_cost_kernel(AttncItemOrderArgs a) {
  static_assert(ATTNC_PI_SIZE <= 32, "a lane per item field");
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kItemCostThreads / 32);
  for (int i = blockIdx.x * (kItemCostThreads / 32) + threadIdx.x / 32; i < a.num_items;
       i += warps) {
    const int32_t* it = a.items + static_cast<int64_t>(i) * ATTNC_PI_SIZE;
    int kv_len = 0;
    const uint8_t* row = item_map_row(a, it, &kv_len);
    const ItemColumns cols = item_columns(it, kv_len, a.kv_block);
    int first = -1, last = -1, count = 0;
    for (int c0 = cols.c0; c0 < cols.c1; c0 += 32) {
      const int c = c0 + lane;
      const unsigned votes = __ballot_sync(0xffffffffu, c < cols.c1 && row[c] != 0u);
      if (votes != 0u) {
        if (first < 0) first = c0 + __ffs(votes) - 1;
        last = c0 + 31 - __clz(votes);
        count += __popc(votes);
      }
    }
    const ItemMapCost m = cut_item(cols, first, last, count, a.kv_block);
    if (lane < ATTNC_PI_SIZE) {
      const int value = lane == ATTNC_PI_KV_BEGIN ? m.begin
                        : lane == ATTNC_PI_KV_END ? m.end
                        : lane == ATTNC_PI_NEXT   ? m.cost
                                                  : it[lane];
      a.scratch[static_cast<int64_t>(i) * ATTNC_PI_SIZE + lane] = value;
    }
  }
}

// Step 2, one CTA of kItemOrderThreads: the keys of the parked costs counted in shared
// memory, the counts turned into each key's first place (larger keys first) by a block scan,
// then chunks of 1024 items in list order, the 32 warps of a chunk in turn: lanes of one key
// take consecutive places (__match_any_sync), so the order is stable and the same every run.
__global__ void __launch_bounds__(kItemOrderThreads) item_map_order_kernel(AttncItemOrderArgs a) {
  __shared__ int next[kItemOrderKeys];
  __shared__ int partial[kItemOrderThreads];
  constexpr int kPer = kItemOrderKeys / kItemOrderThreads;  // keys a thread scans
  const int t = threadIdx.x;
  for (int k = t; k < kItemOrderKeys; k += kItemOrderThreads) next[k] = 0;
  __syncthreads();
  for (int i = t; i < a.num_items; i += kItemOrderThreads)
    atomicAdd(&next[order_key(a.scratch[static_cast<int64_t>(i) * ATTNC_PI_SIZE + ATTNC_PI_NEXT])],
              1);
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
    // A key no other lane has for lanes past the list: they stay alone and write nothing.
    const int key = mine ? order_key(it[ATTNC_PI_NEXT]) : -1 - lane;
    const unsigned same = __match_any_sync(0xffffffffu, key);
    const int rank = __popc(same & ((1u << lane) - 1u));
    const int leader = __ffs(same) - 1;
    for (int w = 0; w < kItemOrderThreads / 32; ++w) {
      if (w == warp && mine) {
        int first = 0;
        if (lane == leader) first = next[key];
        first = __shfl_sync(same, first, leader);
        write_item(a.items + static_cast<int64_t>(first + rank) * ATTNC_PI_SIZE, it);
        if (lane == leader) next[key] = first + __popc(same);
      }
      __syncthreads();
    }
  }
}

// 0 when the step's arguments are usable (an empty list is), else ATTNC_E_BAD_LAYOUT.
inline int check_item_map_order(const AttncItemOrderArgs& a) {
  if (a.num_items < 0 || a.batch_size < 0 || a.kv_block <= 0) return ATTNC_E_BAD_LAYOUT;
  if (a.num_items == 0) return 0;
  if (a.items == nullptr || a.scratch == nullptr || a.tile_map == nullptr ||
      a.tile_map_start == nullptr || a.kv_token_start == nullptr || a.batch_size == 0)
    return ATTNC_E_BAD_LAYOUT;
  return 0;
}

// Checks the arguments and launches both steps on `stream`.
inline int launch_item_map_order(const AttncItemOrderArgs& a, cudaStream_t stream) {
  const int bad = check_item_map_order(a);
  if (bad != 0 || a.num_items == 0) return bad;
  constexpr int kWarps = kItemCostThreads / 32;
  const int needed = (a.num_items + kWarps - 1) / kWarps;
  item_map_cost_kernel<<<needed < 1024 ? needed : 1024, kItemCostThreads, 0, stream>>>(a);
  const cudaError_t st = cudaGetLastError();
  if (st != cudaSuccess) return static_cast<int>(st);
  item_map_order_kernel<<<1, kItemOrderThreads, 0, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}
#endif  // __CUDACC__

}  // namespace attnc
