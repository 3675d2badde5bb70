// Owns: the host-side decode step planner in C++ (no torch, no Python): the algorithm
// of attnc/runtime/scheduler.py (the candidate chunk sizes, the doubling loop bounded by the
// partial capacity, splitting, heaviest-first ordering, the longest-processing-time-first
// CTA assignment and the predicted step time that picks a candidate, merge lists) writing the work
// region of scheduler.write_work_region straight into a caller's byte buffer (the pinned
// host buffer), behind a plain C ABI: one parameter struct in, one summary struct out.
//
// Results are bit-identical to the numpy code: integers are int64 with the same rounding,
// float costs and CTA loads use the same operations in the same order (compile with
// -ffp-contract=off so no multiply-add is fused), and ties break the same way. Inputs the
// numpy code treats specially (negative or >= 2^31 lengths, non-positive chunks, non-finite
// or non-positive costs, int32 overflow in the header, overlapping or out-of-range regions)
// return kAttncPlanUnsupported before anything is written to the buffer: the caller then
// runs the numpy code, so every input still gets the numpy answer (or the numpy error).
//
// The step (``step`` below, attnc_decode_step in native_plan.py) is the whole host side of
// BatchDecodeWrapper.plan() after its scalar checks: the page-table checks of
// decode.check_page_table on the raw int32 host arrays (an error code plus the offending
// index and values, formatted into the same ValueError by Python), the wait for the previous
// copies out of the pinned buffers (a CUDA event), the plan, and the two stream-ordered
// copies (pinned work region -> workspace, page ids -> workspace) followed by the event
// record, all through the CUDA runtime. The CUDA calls go through ``Cuda`` so a test switch
// can replace them by synchronous host memcpys (the "device" memory then is host memory).
#pragma once
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <vector>

extern "C" {

// Return codes of attnc_decode_plan.
enum { kAttncPlanOk = 0, kAttncPlanUnsupported = 1, kAttncPlanCapacity = 2 };

// Inputs. Mirrored by ctypes in attnc/runtime/native_plan.py (_Params): keep them in sync.
typedef struct AttncPlanParams {
  // scheduler.schedule arguments.
  int64_t batch;
  int64_t q_len;
  int64_t num_qo_heads;
  int64_t num_kv_heads;
  int64_t row_blocks;
  int64_t num_ctas;
  int64_t kv_tile;
  int64_t max_part_rows;
  int64_t min_chunk;
  int64_t max_items;  // < 0: no limit
  double alpha;
  double beta;
  const int64_t* kv_lens;         // [batch]
  const int64_t* req_page_begin;  // [batch] (written as int32, wrapping like numpy)
  // The work region: buf[0, buf_bytes) and the byte offsets of WorkspaceLayout.
  uint8_t* buf;
  int64_t buf_bytes;
  int64_t off_header;
  int64_t off_cta_indptr;
  int64_t off_req_page_begin;
  int64_t off_req_kv_len;
  int64_t off_merge_items;
  int64_t off_items;
  // Test-only copies of the Schedule arrays (each may be null): items [out_items_cap, 8]
  // int32, cost [out_items_cap] float64, cta_indptr [num_ctas + 1] int32, merge_items
  // [batch, 4] int32, num_chunks [batch] int64. Contents are undefined unless kAttncPlanOk.
  int32_t* out_items;
  double* out_cost;
  int64_t out_items_cap;
  int32_t* out_cta_indptr;
  int32_t* out_merge_items;
  int64_t* out_num_chunks;
  // The KV the chunks of each request cover (scheduler.schedule's ``visible``, as
  // scheduler.visible_spans rounds it): [kv_offset[r], kv_offset[r] + plan_lens[r]), inside
  // [0, kv_lens[r]]. Null plan_lens: whole requests. visible_count must equal batch.
  const int64_t* plan_lens;
  const int64_t* kv_offset;
  int64_t visible_count;
} AttncPlanParams;

// Outputs (kAttncPlanCapacity fills num_items only).
typedef struct AttncPlanSummary {
  int64_t num_items;       // Schedule.num_items
  int64_t num_split;       // rows of Schedule.merge_items
  int64_t merge_rows;      // Schedule.merge_rows
  int64_t chunk_size;      // Schedule.chunk_size (0 when nothing is split)
  int64_t num_part_slots;  // Schedule.num_part_slots
  int64_t total_chunks;    // KV chunks over all requests
  int64_t work_bytes;      // bytes of the work region to copy (write_work_region's result)
} AttncPlanSummary;

// Return codes of attnc_decode_step (kAttncPlanOk/Unsupported/Capacity as above, then:).
enum { kAttncStepInvalid = 3, kAttncStepCuda = 4 };

// AttncStepResult.error after kAttncStepInvalid: which check of decode.check_page_table,
// BatchDecodeWrapper.plan and _check_indices failed (index/value/value2 say where).
enum {
  kAttncStepIndptrEmpty = 1,       // no entries
  kAttncStepIndptrStart = 2,       // value = kv_indptr[0]
  kAttncStepIndptrDecreasing = 3,  // index i: value = kv_indptr[i] < value2 = kv_indptr[i-1]
  kAttncStepLastCount = 4,         // index = batch entries expected, value = entries given
  kAttncStepLastRange = 5,         // index i, value = kv_last_page_len[i]
  kAttncStepBatchCapacity = 6,     // value = batch
  kAttncStepPageCapacity = 7,      // value = kv_indptr[-1]
  kAttncStepIndicesShort = 8,      // value = kv_indices entries, value2 = kv_indptr[-1]
  kAttncStepIndexNegative = 9,     // value = the smallest page id
};

// Inputs of attnc_decode_step. Mirrored by ctypes in native_plan.py (_StepParams).
typedef struct AttncStepParams {
  // The scheduler arguments; batch, kv_lens and req_page_begin are set by the step (to
  // kv_out and page_begin_out).
  AttncPlanParams plan;
  // The page table: int32 host arrays.
  const int32_t* kv_indptr;  // [indptr_len]
  int64_t indptr_len;
  const int32_t* last_page_len;  // [last_len]
  int64_t last_len;
  int64_t page_size;
  int64_t max_batch;        // capacity of kv_out and page_begin_out
  int64_t max_pages;        // page ids the workspace holds
  int64_t* kv_out;          // [max_batch] KV length per request (decode.check_page_table)
  int64_t* page_begin_out;  // [max_batch] kv_indptr[:-1]
  const int32_t* kv_indices;  // [indices_len], on the device or the host
  int64_t indices_len;
  int64_t indices_on_device;
  // The copies, ordered on ``stream`` of CUDA device ``device``.
  uint8_t* dev_work;        // the workspace (the work region starts at its byte 0)
  uint8_t* dev_page_ids;    // the workspace's page id region
  uint8_t* page_stage;      // pinned staging buffer of host page ids
  int64_t page_stage_bytes;
  void* stream;
  int64_t device;
  // Owned by the library: recorded after the copies (null until the first one).
  void* event;
} AttncStepParams;

// Outputs of attnc_decode_step and attnc_decode_upload.
typedef struct AttncStepResult {
  int64_t error;  // kAttncStep* detail of kAttncStepInvalid
  int64_t index;
  int64_t value;
  int64_t value2;
  int64_t batch;     // after the checks pass
  int64_t nnz;       // kv_indptr[-1]
  int64_t max_page;  // largest host page id (-1: none, or ids on the device)
  int64_t cuda_error;  // cudaError_t of kAttncStepCuda
  AttncPlanSummary summary;  // kAttncPlanOk (num_items only for kAttncPlanCapacity)
} AttncStepResult;

}  // extern "C"

namespace attnc {
namespace decode_plan {

constexpr int kItemInts = 8;
constexpr int kMergeInts = 4;
constexpr int kHeaderInts = 16;
constexpr int64_t kSplitFactors[3] = {1, 2, 4};  // scheduler.SPLIT_FACTORS
constexpr double kItemOverhead = 128.0;              // scheduler.ITEM_OVERHEAD
constexpr double kMergeOverhead = 256.0;             // scheduler.MERGE_OVERHEAD
constexpr int64_t kMaxLen = INT32_MAX;             // KV lengths must lie in [0, kMaxLen]
constexpr int64_t kMaxScalar = (int64_t(1) << 30);  // heads, q_len, ... lie in [1, kMaxScalar)
constexpr int64_t kHugeChunk = int64_t(1) << 62;    // any chunk above this splits nothing

// Header fields (decode_args.h: AttncDecodeHeader).
constexpr int kHNumItems = 0, kHQLen = 1, kHBatch = 2, kHMergeRows = 3, kHNumMerge = 4;

struct Counts {
  int64_t chunk;         // Schedule.chunk_size (0 when nothing is split)
  int64_t slots;         // Schedule.num_part_slots
  int64_t total_chunks;  // KV chunks over all requests
  int64_t num_split;     // split requests (rows of merge_items)
  int64_t num_items;     // total_chunks * num_kv_heads * row_blocks
  int64_t split_any;
  int64_t longest;       // KV tokens of the longest chunk
};

// Ceil division for a >= 0, b > 0 (numpy's -(-a // b) on non-negative values).
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// scheduler._chunk_counts for one request: number of chunks and chunk length.
inline void chunk_count(int64_t kv, int64_t chunk, int64_t tile, int64_t* n_out,
                        int64_t* size_out) {
  int64_t n = std::max<int64_t>(1, ceil_div(kv, chunk));
  int64_t size = ceil_div(kv, n);
  size = std::max(tile, ceil_div(size, tile) * tile);
  *n_out = std::max<int64_t>(1, ceil_div(kv, size));
  *size_out = size;
}

// The KV lengths the planner chunks: plan_lens when given, else the requests' lengths.
inline const int64_t* planned_lens(const AttncPlanParams& p) {
  return p.plan_lens != nullptr ? p.plan_lens : p.kv_lens;
}

// plan_lens and kv_offset describe, for every request, a range inside [0, kv_lens[r]].
inline bool visible_ok(const AttncPlanParams& p) {
  if (p.plan_lens == nullptr) return true;
  if (p.kv_offset == nullptr || p.visible_count != p.batch) return false;
  for (int64_t r = 0; r < p.batch; ++r) {
    const int64_t off = p.kv_offset[r], len = p.plan_lens[r];
    if (off < 0 || len < 0 || off > p.kv_lens[r] || len > p.kv_lens[r] - off) return false;
  }
  return true;
}

inline bool params_ok(const AttncPlanParams& p) {
  auto in = [](int64_t v) { return v >= 1 && v < kMaxScalar; };
  return p.batch >= 0 && p.batch < kMaxLen && in(p.q_len) && in(p.num_qo_heads) &&
         in(p.num_kv_heads) && in(p.row_blocks) && in(p.num_ctas) && in(p.kv_tile) &&
         std::isfinite(p.alpha) && std::isfinite(p.beta) && p.alpha > 0.0 && p.beta > 0.0 &&
         (p.batch == 0 || (p.kv_lens != nullptr && p.req_page_begin != nullptr));
}

// First pass for one candidate (scheduler._split of choose_chunk(..., split_factor); 0: no
// split): chunk size, chunks per request (``num_chunks`` [batch]) and the sizes of every
// output. kAttncPlanUnsupported leaves the outputs undefined.
inline int plan_counts(const AttncPlanParams& p, int64_t split_factor, int64_t* num_chunks,
                       Counts* c) {
  if (!params_ok(p)) return kAttncPlanUnsupported;
  const int64_t* kv = planned_lens(p);
  const int64_t batch = p.batch;
  int64_t sum = 0, kv_max = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t v = kv[r];
    if (v < 0 || v > kMaxLen) return kAttncPlanUnsupported;
    sum += v;
    kv_max = std::max(kv_max, v);
  }
  const int64_t units = p.num_kv_heads * p.row_blocks;
  const int64_t slot_rows = p.q_len * p.num_qo_heads;

  // choose_chunk, operation for operation.
  const double item_q = p.alpha * static_cast<double>(p.q_len);
  const double total = static_cast<double>(units) *
                       (item_q * static_cast<double>(batch) + p.beta * static_cast<double>(sum));
  const double per_cta = total / static_cast<double>(p.num_ctas);
  const double x =
      (per_cta - item_q) / p.beta / static_cast<double>(split_factor > 0 ? split_factor : 1);
  if (!std::isfinite(x)) return kAttncPlanUnsupported;  // int(x) raises in Python
  bool huge = split_factor <= 0;
  int64_t chunk0 = 0;
  if (huge) {
    // "no split": scheduler._split(kv, 0, ...)
  } else if (x >= 9.2e18) {
    huge = true;  // a Python int beyond int64: no request is longer
    chunk0 = 0;
  } else if (x <= -9.2e18) {
    chunk0 = p.min_chunk;
  } else {
    chunk0 = std::max(p.min_chunk, static_cast<int64_t>(x));
  }
  if (!huge && chunk0 > kHugeChunk) huge = true;
  if (!huge && chunk0 <= 0) return kAttncPlanUnsupported;  // the numpy code divides by chunk
  int64_t chunk = huge ? 0 : ceil_div(chunk0, p.kv_tile) * p.kv_tile;

  bool split_any = batch > 0 && !huge && kv_max > chunk;
  int64_t slots = 0;
  while (split_any) {
    slots = 0;
    c->longest = 0;
    for (int64_t r = 0; r < batch; ++r) {
      int64_t n, size;
      chunk_count(kv[r], chunk, p.kv_tile, &n, &size);
      num_chunks[r] = n;
      if (n > 1) slots += n;
      c->longest = std::max(c->longest, std::min(kv[r], size));
    }
    int64_t need;
    const bool fits = !__builtin_mul_overflow(slots, slot_rows, &need) && need <= p.max_part_rows;
    if (fits || slots == 0) {
      split_any = slots > 0;
      break;
    }
    chunk *= 2;
    split_any = kv_max > chunk;
  }
  int64_t total_chunks = batch, num_split = 0;
  if (split_any) {
    total_chunks = 0;
    for (int64_t r = 0; r < batch; ++r) {
      total_chunks += num_chunks[r];
      num_split += num_chunks[r] > 1;
    }
  } else {
    for (int64_t r = 0; r < batch; ++r) num_chunks[r] = 1;
    chunk = 0;
    slots = 0;
  }
  int64_t num_items;
  if (total_chunks >= kMaxLen || __builtin_mul_overflow(total_chunks, units, &num_items) ||
      num_items >= kMaxLen)
    return kAttncPlanUnsupported;  // int32 item indices would wrap
  // Every cost is positive and their sum finite (the CTA split divides by it): checked here,
  // before anything is written, so plan_fill cannot fail after writing.
  const double bound = static_cast<double>(units) * (item_q * static_cast<double>(total_chunks) +
                                                     p.beta * static_cast<double>(sum));
  if (!(bound < 1e300) || !(item_q > 0.0)) return kAttncPlanUnsupported;
  c->chunk = chunk;
  c->slots = slots;
  c->total_chunks = total_chunks;
  c->num_split = num_split;
  c->num_items = num_items;
  c->split_any = split_any;
  if (!split_any) c->longest = kv_max;
  return kAttncPlanOk;
}

// Stable sort of ``idx`` by ``key`` ascending (LSD radix on 32-bit keys, insertion sort when
// short). Stability makes the result that of numpy's argsort(kind="stable").
inline void stable_sort_by_key(std::vector<uint32_t>& key, std::vector<uint32_t>& idx,
                               std::vector<uint32_t>& key_tmp, std::vector<uint32_t>& idx_tmp) {
  const size_t n = key.size();
  if (n <= 48) {
    for (size_t i = 1; i < n; ++i) {
      const uint32_t k = key[i], v = idx[i];
      size_t j = i;
      while (j > 0 && key[j - 1] > k) {
        key[j] = key[j - 1];
        idx[j] = idx[j - 1];
        --j;
      }
      key[j] = k;
      idx[j] = v;
    }
    return;
  }
  key_tmp.resize(n);
  idx_tmp.resize(n);
  uint32_t all_or = 0, all_and = ~0u;
  for (size_t i = 0; i < n; ++i) {
    all_or |= key[i];
    all_and &= key[i];
  }
  for (int shift = 0; shift < 32; shift += 8) {
    if ((((all_or ^ all_and) >> shift) & 0xffu) == 0) continue;  // one digit value: no-op
    size_t count[257] = {0};
    for (size_t i = 0; i < n; ++i) ++count[((key[i] >> shift) & 0xffu) + 1];
    for (int d = 0; d < 256; ++d) count[d + 1] += count[d];
    for (size_t i = 0; i < n; ++i) {
      const size_t pos = count[(key[i] >> shift) & 0xffu]++;
      key_tmp[pos] = key[i];
      idx_tmp[pos] = idx[i];
    }
    key.swap(key_tmp);
    idx.swap(idx_tmp);
  }
}

struct Scratch {
  std::vector<int64_t> num_chunks, best_chunks, size, first, part_base, cta, best_cta, count;
  std::vector<double> cost, load;
  std::vector<uint32_t> key, idx, key_tmp, idx_tmp, chunk_req;
  std::vector<int32_t> heap_ids;
};

// Chunks of every request in heaviest-first order (scheduler.schedule's ``order``): fills
// s.size, s.first, s.part_base, s.chunk_req and s.idx (chunk ids, sorted).
inline void order_chunks(const AttncPlanParams& p, const int64_t* num_chunks, const Counts& c,
                         Scratch& s) {
  const int64_t* kv = planned_lens(p);
  const int64_t batch = p.batch;
  const int64_t nc = c.total_chunks;
  const bool split_any = c.split_any != 0;
  s.size.resize(batch);
  s.first.resize(batch);
  s.part_base.resize(batch);
  s.key.resize(nc);
  s.idx.resize(nc);
  s.chunk_req.resize(nc);
  int64_t pos = 0, part = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t n = num_chunks[r];
    int64_t size = kv[r];
    if (split_any) {
      int64_t n2;
      chunk_count(kv[r], c.chunk, p.kv_tile, &n2, &size);
    }
    s.size[r] = size;
    s.first[r] = pos;
    s.part_base[r] = part;
    if (n > 1) part += n;
    for (int64_t j = 0; j < n; ++j, ++pos) {
      const int64_t begin = j * size;
      const int64_t end = std::min(begin + size, kv[r]);
      // Descending length == ascending (kMaxLen - length); ties keep chunk order.
      s.key[pos] = static_cast<uint32_t>(kMaxLen - (end - begin));
      s.idx[pos] = static_cast<uint32_t>(pos);
      s.chunk_req[pos] = static_cast<uint32_t>(r);
    }
  }
  stable_sort_by_key(s.key, s.idx, s.key_tmp, s.idx_tmp);
}

// KV tokens of sorted chunk q.
inline int64_t chunk_length(const AttncPlanParams& p, const Scratch& s, int64_t q) {
  const uint32_t ch = s.idx[q];
  const int64_t r = s.chunk_req[ch];
  const int64_t j = static_cast<int64_t>(ch) - s.first[r];
  const int64_t begin = j * s.size[r];
  return std::min(begin + s.size[r], planned_lens(p)[r]) - begin;
}

// scheduler.assign_lpt over the items of the ordered chunks (each chunk expands to its KV
// heads x row blocks at the same cost) into s.cta; returns scheduler._makespan.
// Stops early, returning +inf, once the busiest CTA plus the merge exceeds ``bound``: the
// candidate then cannot win (loads only grow).
inline double assign_lpt(const AttncPlanParams& p, const Counts& c, Scratch& s,
                         double bound = HUGE_VAL) {
  const double merge = c.chunk > 0 ? kMergeOverhead : 0.0;
  const int64_t units = p.num_kv_heads * p.row_blocks;
  const double item_q = p.alpha * static_cast<double>(p.q_len);
  const double base = item_q + kItemOverhead;
  s.cta.resize(c.num_items);
  // A binary min-heap of CTA ids ordered like Python's (load, cta) tuples: the lowest load,
  // then the lowest index, on top; each item replaces the top and sifts it down
  // (heapq.heapreplace). s.load holds each CTA's load.
  const int64_t m = p.num_ctas;
  s.load.assign(m, 0.0);
  s.heap_ids.resize(m);
  int32_t* h = s.heap_ids.data();
  double* load = s.load.data();
  for (int64_t b = 0; b < m; ++b) h[b] = static_cast<int32_t>(b);
  auto less = [load](int32_t a, int32_t b) {
    return load[a] < load[b] || (load[a] == load[b] && a < b);
  };
  // Equal costs (every chunk as long as the first, which is the longest): the heap hands the
  // items out round robin, CTA 0 first.
  if (c.total_chunks > 0 &&
      chunk_length(p, s, 0) == chunk_length(p, s, c.total_chunks - 1)) {
    const double cost = base + p.beta * static_cast<double>(chunk_length(p, s, 0));
    for (int64_t i = 0; i < c.num_items; ++i) {
      const int64_t b = i % m;
      s.cta[i] = b;
      load[b] = load[b] + cost;
    }
    double mx = 0.0;
    for (int64_t b = 0; b < m; ++b) mx = std::max(mx, load[b]);
    return mx + (c.chunk > 0 ? kMergeOverhead : 0.0);
  }
  int64_t i = 0;
  for (int64_t q = 0; q < c.total_chunks; ++q) {
    const double cost = base + p.beta * static_cast<double>(chunk_length(p, s, q));
    for (int64_t u = 0; u < units; ++u, ++i) {
      if (i < m) {  // all loads start at 0: the first m items go to CTAs 0, 1, ... in order
        s.cta[i] = i;
        load[i] = load[i] + cost;
        if (load[i] + merge > bound) return HUGE_VAL;
        if (i + 1 == m) std::sort(h, h + m, less);  // a sorted array is a valid heap
        continue;
      }
      const int32_t top = h[0];
      s.cta[i] = top;
      load[top] = load[top] + cost;
      if (load[top] + merge > bound) return HUGE_VAL;
      int64_t k = 0;
      for (;;) {
        int64_t child = 2 * k + 1;
        if (child >= m) break;
        if (child + 1 < m && less(h[child + 1], h[child])) ++child;
        if (!less(h[child], top)) break;
        h[k] = h[child];
        k = child;
      }
      h[k] = top;
    }
  }
  double mx = 0.0;
  for (int64_t b = 0; b < p.num_ctas; ++b) mx = std::max(mx, s.load[b]);
  return mx + (c.chunk > 0 ? kMergeOverhead : 0.0);
}


// Second pass: items [num_items, kItemInts] grouped by CTA (each CTA's items heaviest
// first), cost [num_items] in the same order, cta_indptr [num_ctas + 1], merge [num_split,
// kMergeInts] (all 4-byte aligned), from plan_counts', order_chunks' and assign_lpt's results.
inline void plan_fill(const AttncPlanParams& p, const int64_t* num_chunks, const Counts& c,
                      int32_t* items, double* cost, int32_t* cta_indptr, int32_t* merge,
                      Scratch& s) {
  const int64_t batch = p.batch;
  const int64_t nc = c.total_chunks;
  const bool split_any = c.split_any != 0;
  // Slots of a stable counting sort by CTA.
  s.count.assign(p.num_ctas + 1, 0);
  for (int64_t i = 0; i < c.num_items; ++i) ++s.count[s.cta[i] + 1];
  for (int64_t b = 0; b < p.num_ctas; ++b) s.count[b + 1] += s.count[b];
  for (int64_t b = 0; b <= p.num_ctas; ++b) cta_indptr[b] = static_cast<int32_t>(s.count[b]);

  const double item_q = p.alpha * static_cast<double>(p.q_len);
  const int64_t* lens = planned_lens(p);
  int64_t i = 0;
  for (int64_t q = 0; q < nc; ++q) {
    const uint32_t ch = s.idx[q];
    const int64_t r = s.chunk_req[ch];
    const int64_t j = static_cast<int64_t>(ch) - s.first[r];
    const int64_t begin = j * s.size[r];
    const int64_t end = std::min(begin + s.size[r], lens[r]);
    const int64_t off = p.kv_offset != nullptr && p.plan_lens != nullptr ? p.kv_offset[r] : 0;
    const int32_t slot = num_chunks[r] > 1 ? static_cast<int32_t>(s.part_base[r] + j) : -1;
    const double item_cost = item_q + p.beta * static_cast<double>(end - begin);
    const int32_t r32 = static_cast<int32_t>(r), begin32 = static_cast<int32_t>(off + begin);
    const int32_t end32 = static_cast<int32_t>(off + end);
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      for (int64_t b = 0; b < p.row_blocks; ++b, ++i) {
        const int64_t dst = s.count[s.cta[i]]++;
        int32_t* it = items + dst * kItemInts;
        it[0] = r32;
        it[1] = static_cast<int32_t>(h);
        it[2] = static_cast<int32_t>(b);
        it[3] = begin32;
        it[4] = end32;
        it[5] = slot;
        it[6] = 0;
        it[7] = 0;
        cost[dst] = item_cost;
      }
    }
  }

  int32_t* m = merge;
  if (split_any) {
    for (int64_t r = 0; r < batch; ++r) {
      if (num_chunks[r] <= 1) continue;
      m[0] = static_cast<int32_t>(r);
      m[1] = static_cast<int32_t>(num_chunks[r]);
      m[2] = static_cast<int32_t>(s.part_base[r]);
      m[3] = 0;
      m += kMergeInts;
    }
  }
}

// int64 -> int32 as numpy's unsafe cast (keeps the low 32 bits).
inline void put_int32(uint8_t* dst, const int64_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(src[i])));
    memcpy(dst + 4 * i, &v, 4);
  }
}

// The regions scheduler.write_work_region writes: each inside the buffer, 4-byte aligned and
// disjoint from the others (then the order of the writes does not matter).
inline bool regions_ok(const AttncPlanParams& p, const Counts& c) {
  if (p.buf == nullptr || p.buf_bytes < 0) return false;
  const int64_t start[6] = {p.off_header,     p.off_cta_indptr,  p.off_req_page_begin,
                            p.off_req_kv_len, p.off_merge_items, p.off_items};
  const int64_t len[6] = {kHeaderInts * 4,
                          (p.num_ctas + 1) * 4,
                          p.batch * 4,
                          p.batch * 4,
                          c.num_split * kMergeInts * 4,
                          c.num_items * kItemInts * 4};
  for (int i = 0; i < 6; ++i) {
    if (start[i] < 0 || start[i] > p.buf_bytes || len[i] > p.buf_bytes - start[i]) return false;
    if ((reinterpret_cast<uintptr_t>(p.buf) + static_cast<uint64_t>(start[i])) % 4 != 0)
      return false;
  }
  for (int i = 0; i < 6; ++i)
    for (int j = i + 1; j < 6; ++j)
      if (len[i] > 0 && len[j] > 0 && start[i] < start[j] + len[j] && start[j] < start[i] + len[i])
        return false;
  return true;
}

// scheduler.schedule + scheduler.write_work_region. kAttncPlanOk: the work region is written
// and ``out`` filled; kAttncPlanCapacity: more than max_items items (out->num_items says how
// many), nothing written; kAttncPlanUnsupported: nothing written to ``buf``.
// scheduler._lower_bound: no assignment of a candidate's items beats its average CTA load
// or its longest item, plus the merge.
inline double lower_bound(const AttncPlanParams& p, const Counts& c) {
  const int64_t units = p.num_kv_heads * p.row_blocks;
  const double base = p.alpha * static_cast<double>(p.q_len) + kItemOverhead;
  int64_t tokens = 0;
  const int64_t* lens = planned_lens(p);
  for (int64_t r = 0; r < p.batch; ++r) tokens += lens[r];
  const double total = static_cast<double>(c.num_items) * base +
                       static_cast<double>(units) * p.beta * static_cast<double>(tokens);
  const double longest = base + p.beta * static_cast<double>(c.longest);
  return std::max(total / static_cast<double>(p.num_ctas), longest) +
         (c.chunk > 0 ? kMergeOverhead : 0.0);
}

inline int plan(const AttncPlanParams& p, AttncPlanSummary* out, Scratch& s) {
  if (p.batch < 0 || p.batch >= kMaxLen) return kAttncPlanUnsupported;
  if (p.batch > 0 && p.kv_lens == nullptr) return kAttncPlanUnsupported;
  if (!visible_ok(p)) return kAttncPlanUnsupported;
  s.num_chunks.resize(static_cast<size_t>(p.batch));
  s.best_chunks.resize(static_cast<size_t>(p.batch));
  Counts c{};
  // Every candidate must be one the numpy code handles (it computes all chunk sizes first).
  constexpr int kCandidates = 1 + sizeof(kSplitFactors) / sizeof(kSplitFactors[0]);
  for (int k = 0; k < kCandidates; ++k) {
    const int rc = plan_counts(p, k == 0 ? 0 : kSplitFactors[k - 1], s.num_chunks.data(), &c);
    if (rc != kAttncPlanOk) return rc;
  }
  // The candidates of scheduler.schedule: no split, then each split factor; one whose chunk
  // (after the capacity doubling) an earlier one has is the same plan and is dropped. The
  // winner has the smallest predicted time, the earliest candidate on ties. They are tried in
  // order of their lower bounds, so most lose early (a bound above the best so far, or an
  // assignment whose busiest CTA passes it).
  struct Cand {
    int64_t factor, index;
    double lb;
  };
  Cand cands[kCandidates];
  int64_t n_cands = 0, fewest = -1, tried_n = 0;
  int64_t tried[kCandidates];
  for (int k = 0; k < kCandidates; ++k) {
    const int64_t factor = k == 0 ? 0 : kSplitFactors[k - 1];
    plan_counts(p, factor, s.num_chunks.data(), &c);
    bool seen = false;
    for (int64_t t = 0; t < tried_n; ++t) seen |= tried[t] == c.chunk;
    if (seen) continue;
    tried[tried_n++] = c.chunk;
    fewest = fewest < 0 ? c.num_items : std::min(fewest, c.num_items);
    if (p.max_items >= 0 && c.num_items > p.max_items) continue;
    cands[n_cands++] = {factor, k, lower_bound(p, c)};
  }
  std::sort(cands, cands + n_cands, [](const Cand& a, const Cand& b) {
    return a.lb < b.lb || (a.lb == b.lb && a.index < b.index);
  });
  bool have_best = false;
  double best_time = 0.0;
  int64_t best_factor = 0, best_index = 0;
  for (int64_t k = 0; k < n_cands; ++k) {
    if (have_best && cands[k].lb > best_time * (1.0 + 1e-9)) break;  // nor can the rest
    plan_counts(p, cands[k].factor, s.num_chunks.data(), &c);
    order_chunks(p, s.num_chunks.data(), c, s);
    const double time = assign_lpt(p, c, s, have_best ? best_time : HUGE_VAL);
    if (!have_best || time < best_time || (time == best_time && cands[k].index < best_index)) {
      have_best = true;
      best_time = time;
      best_factor = cands[k].factor;
      best_index = cands[k].index;
      s.best_cta.swap(s.cta);  // the winner's assignment, reused below
    }
  }
  if (!have_best) {
    out->num_items = fewest;
    return kAttncPlanCapacity;
  }
  int64_t* num_chunks = p.out_num_chunks != nullptr ? p.out_num_chunks : s.best_chunks.data();
  plan_counts(p, best_factor, num_chunks, &c);
  int64_t merge_rows;  // an int32 in the header (numpy raises beyond it)
  if (__builtin_mul_overflow(c.num_split, p.q_len * p.num_qo_heads, &merge_rows) ||
      merge_rows > INT32_MAX)
    return kAttncPlanUnsupported;
  if (!regions_ok(p, c)) return kAttncPlanUnsupported;
  if ((p.out_items != nullptr || p.out_cost != nullptr) && p.out_items_cap < c.num_items)
    return kAttncPlanUnsupported;

  // Nothing can fail from here on.
  double* cost = p.out_cost;
  if (cost == nullptr) {
    s.cost.resize(static_cast<size_t>(c.num_items));
    cost = s.cost.data();
  }
  int32_t* items = reinterpret_cast<int32_t*>(p.buf + p.off_items);
  int32_t* cta = reinterpret_cast<int32_t*>(p.buf + p.off_cta_indptr);
  int32_t* merge = reinterpret_cast<int32_t*>(p.buf + p.off_merge_items);
  order_chunks(p, num_chunks, c, s);
  s.cta.swap(s.best_cta);
  plan_fill(p, num_chunks, c, items, cost, cta, merge, s);

  int32_t header[kHeaderInts] = {0};
  header[kHNumItems] = static_cast<int32_t>(c.num_items);
  header[kHQLen] = static_cast<int32_t>(p.q_len);
  header[kHBatch] = static_cast<int32_t>(p.batch);
  header[kHMergeRows] = static_cast<int32_t>(merge_rows);
  header[kHNumMerge] = static_cast<int32_t>(c.num_split);
  memcpy(p.buf + p.off_header, header, sizeof header);
  put_int32(p.buf + p.off_req_page_begin, p.req_page_begin, p.batch);
  put_int32(p.buf + p.off_req_kv_len, p.kv_lens, p.batch);

  if (p.out_items != nullptr)
    memcpy(p.out_items, items, static_cast<size_t>(c.num_items) * kItemInts * 4);
  if (p.out_cta_indptr != nullptr)
    memcpy(p.out_cta_indptr, cta, static_cast<size_t>(p.num_ctas + 1) * 4);
  if (p.out_merge_items != nullptr)
    memcpy(p.out_merge_items, merge, static_cast<size_t>(c.num_split) * kMergeInts * 4);

  out->num_items = c.num_items;
  out->num_split = c.num_split;
  out->merge_rows = merge_rows;
  out->chunk_size = c.chunk;
  out->num_part_slots = c.slots;
  out->total_chunks = c.total_chunks;
  out->work_bytes = p.off_items + c.num_items * kItemInts * 4;
  return kAttncPlanOk;
}

// ---- the step: page-table checks, copies and the event -----------------------------------

// The CUDA runtime calls of the step; with ``fake`` set (tests without a GPU) copies are
// synchronous host memcpys and events are counted only.
struct Cuda {
  bool fake = false;
  int64_t copies = 0, records = 0, waits = 0, creates = 0;

  cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, void* stream) {
    ++copies;
    if (fake) {
      memcpy(dst, src, n);
      return cudaSuccess;
    }
    return cudaMemcpyAsync(dst, src, n, kind, static_cast<cudaStream_t>(stream));
  }
  cudaError_t record(AttncStepParams& s) {
    if (s.event == nullptr) {
      ++creates;
      if (fake) {
        s.event = this;  // any non-null handle
      } else {
        // On the workspace's device, whatever the current one is (as torch.cuda.Event does).
        int prev = 0;
        cudaError_t e = cudaGetDevice(&prev);
        if (e == cudaSuccess && prev != s.device) e = cudaSetDevice(static_cast<int>(s.device));
        cudaEvent_t ev = nullptr;
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (prev != s.device) cudaSetDevice(prev);
        if (e != cudaSuccess) return e;
        s.event = ev;
      }
    }
    ++records;
    if (fake) return cudaSuccess;
    return cudaEventRecord(static_cast<cudaEvent_t>(s.event), static_cast<cudaStream_t>(s.stream));
  }
  cudaError_t wait(const AttncStepParams& s) {
    if (s.event == nullptr) return cudaSuccess;
    ++waits;
    if (fake) return cudaSuccess;
    return cudaEventSynchronize(static_cast<cudaEvent_t>(s.event));
  }
  cudaError_t release(AttncStepParams& s) {
    if (s.event == nullptr || fake) {
      s.event = nullptr;
      return cudaSuccess;
    }
    cudaEvent_t ev = static_cast<cudaEvent_t>(s.event);
    s.event = nullptr;
    cudaEventSynchronize(ev);  // the pinned buffers are freed after this
    return cudaEventDestroy(ev);
  }
};

inline Cuda& cuda() {
  static Cuda c;
  return c;
}

inline int invalid(AttncStepResult* r, int64_t error, int64_t index, int64_t value,
                   int64_t value2) {
  r->error = error;
  r->index = index;
  r->value = value;
  r->value2 = value2;
  return kAttncStepInvalid;
}

// The checks of decode.check_page_table, BatchDecodeWrapper.plan (batch and page capacity)
// and _check_indices (entries, non-negative host ids), in that order, on the int32 arrays;
// then kv_out / page_begin_out and the result's batch, nnz and max_page. Writes nothing else.
inline int check_page_table(const AttncStepParams& s, AttncStepResult* r) {
  const int32_t* ip = s.kv_indptr;
  const int64_t n = s.indptr_len;
  if (n <= 0 || ip == nullptr) return invalid(r, kAttncStepIndptrEmpty, 0, 0, 0);
  if (ip[0] != 0) return invalid(r, kAttncStepIndptrStart, 0, ip[0], 0);
  for (int64_t i = 1; i < n; ++i)
    if (ip[i] < ip[i - 1]) return invalid(r, kAttncStepIndptrDecreasing, i, ip[i], ip[i - 1]);
  const int64_t batch = n - 1;
  if (s.last_len != batch) return invalid(r, kAttncStepLastCount, batch, s.last_len, 0);
  const int32_t* last = s.last_page_len;
  for (int64_t i = 0; i < batch; ++i)
    if (ip[i + 1] > ip[i] && (last[i] < 1 || last[i] > s.page_size))
      return invalid(r, kAttncStepLastRange, i, last[i], 0);
  if (batch > s.max_batch) return invalid(r, kAttncStepBatchCapacity, 0, batch, 0);
  const int64_t nnz = ip[batch];
  if (nnz > s.max_pages) return invalid(r, kAttncStepPageCapacity, 0, nnz, 0);
  if (s.indices_len < nnz) return invalid(r, kAttncStepIndicesShort, 0, s.indices_len, nnz);
  int64_t max_page = -1;
  if (!s.indices_on_device && nnz > 0) {
    const int32_t* ids = s.kv_indices;
    int32_t lo = ids[0], hi = ids[0];
    for (int64_t i = 1; i < nnz; ++i) {
      lo = std::min(lo, ids[i]);
      hi = std::max(hi, ids[i]);
    }
    if (lo < 0) return invalid(r, kAttncStepIndexNegative, 0, lo, 0);
    max_page = hi;
  }
  // numpy: where(pages > 0, (pages - 1) * page_size + last, 0) in int64 (wrapping).
  const uint64_t ps = static_cast<uint64_t>(s.page_size);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t pages = int64_t(ip[i + 1]) - ip[i];
    s.page_begin_out[i] = ip[i];
    s.kv_out[i] = pages > 0 ? static_cast<int64_t>(static_cast<uint64_t>(pages - 1) * ps +
                                                   static_cast<uint64_t>(int64_t(last[i])))
                            : 0;
  }
  r->batch = batch;
  r->nnz = nnz;
  r->max_page = max_page;
  return kAttncPlanOk;
}

inline int cuda_failed(AttncStepResult* r, cudaError_t e) {
  r->cuda_error = static_cast<int64_t>(e);
  return kAttncStepCuda;
}

// The copies of the work region (``work_bytes`` bytes, already in plan.buf) and of the
// ``nnz`` page ids (host ids through page_stage), then the event record. The caller has
// waited for the previous copies.
inline int upload(const AttncStepParams& s, int64_t work_bytes, int64_t nnz,
                  AttncStepResult* r) {
  Cuda& c = cuda();
  cudaError_t e = cudaSuccess;
  if (work_bytes > 0)
    e = c.copy(s.dev_work, s.plan.buf, static_cast<size_t>(work_bytes), cudaMemcpyHostToDevice,
               s.stream);
  if (e != cudaSuccess) return cuda_failed(r, e);
  if (nnz > 0) {
    const size_t bytes = static_cast<size_t>(nnz) * 4;
    if (s.indices_on_device) {
      e = c.copy(s.dev_page_ids, s.kv_indices, bytes, cudaMemcpyDeviceToDevice, s.stream);
    } else {
      if (s.page_stage == nullptr || s.page_stage_bytes < static_cast<int64_t>(bytes))
        return cuda_failed(r, cudaErrorInvalidValue);  // the caller sizes the stage
      memcpy(s.page_stage, s.kv_indices, bytes);
      e = c.copy(s.dev_page_ids, s.page_stage, bytes, cudaMemcpyHostToDevice, s.stream);
    }
    if (e != cudaSuccess) return cuda_failed(r, e);
  }
  e = c.record(const_cast<AttncStepParams&>(s));
  return e == cudaSuccess ? kAttncPlanOk : cuda_failed(r, e);
}

// BatchDecodeWrapper.plan after its scalar checks. kAttncPlanOk: planned, copies queued and
// the event recorded. kAttncStepInvalid: a check failed (r->error), nothing written or
// waited for. kAttncPlanCapacity (r->summary.num_items) / kAttncPlanUnsupported: the checks
// passed (batch, nnz, max_page, kv_out, page_begin_out set) and the previous copies are
// done, nothing written: the caller raises, or writes the buffer itself and calls upload.
// kAttncStepCuda: a CUDA call failed (r->cuda_error).
inline int step(AttncStepParams& s, AttncStepResult* r, Scratch& scratch) {
  int rc = check_page_table(s, r);
  if (rc != kAttncPlanOk) return rc;
  cudaError_t e = cuda().wait(s);
  if (e != cudaSuccess) return cuda_failed(r, e);
  AttncPlanParams p = s.plan;
  p.batch = r->batch;
  p.kv_lens = s.kv_out;
  p.req_page_begin = s.page_begin_out;
  rc = plan(p, &r->summary, scratch);
  if (rc != kAttncPlanOk) return rc;
  return upload(s, r->summary.work_bytes, r->nnz, r);
}

}  // namespace decode_plan
}  // namespace attnc
