// Standalone GPU check of the FA2 prefill modules built from the fixture functors.
// Loads each module (a shared library exporting the extern "C" functions of prefill_args.h)
// with dlopen, runs it on random inputs in ragged and paged (NHD/HND) layouts, and compares
// O and LSE with a float64 CPU reference written here from the variant definitions.
//   prefill_harness MODULE_DIR          correctness table, then PASS or FAIL
//   prefill_harness MODULE_DIR --bench  TFLOP/s at 8K (counting only visible pairs)
//   prefill_harness MODULE_DIR --bench-causal128   the causal d=128 line only
// Module files are named MODULE_DIR/<Fixture>_<bf16|fp16>_<head_dim>.so.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnc/prefill_args.h"

#define CUDA_OK(x)                                                              \
  do {                                                                          \
    cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                             \
    }                                                                           \
  } while (0)

namespace {

enum Fixture { kCausal, kSoftCap, kAlibi, kWindow, kSigmoid, kVanilla };
const char* kFixtureNames[] = {"Causal", "SoftCap", "Alibi", "SlidingWindow", "Sigmoid",
                               "Vanilla"};

struct Module {
  int (*prefill)(const AttncPrefillArgs*, void*) = nullptr;
  int (*tile_q_tokens)(int32_t, int32_t, int32_t) = nullptr;
};

Module load_module(const std::string& dir, Fixture f, bool bf16, int d) {
  const std::string path = dir + "/" + kFixtureNames[f] + (bf16 ? "_bf16_" : "_fp16_") +
                           std::to_string(d) + ".so";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), dlerror());
    std::exit(2);
  }
  Module m;
  m.prefill = reinterpret_cast<int (*)(const AttncPrefillArgs*, void*)>(dlsym(h, "attnc_prefill"));
  m.tile_q_tokens = reinterpret_cast<int (*)(int32_t, int32_t, int32_t)>(
      dlsym(h, "attnc_prefill_tile_q_tokens"));
  if (!m.prefill || !m.tile_q_tokens) {
    std::fprintf(stderr, "missing symbols in %s\n", path.c_str());
    std::exit(2);
  }
  return m;
}

// Variant parameters (mirrors of the fixtures' Params structs).
struct SoftCapParams { float cap; };
struct AlibiParams { const float* slopes; };
struct WindowParams { int window; };
struct SigmoidParams { float bias; };

struct VariantSetup {
  Fixture f;
  float cap = 30.f;
  int window = 1024;
  float bias = -1.f;
  std::vector<float> slopes;  // host copy
  float* d_slopes = nullptr;
  SoftCapParams sc{};
  AlibiParams al{};
  WindowParams wi{};
  SigmoidParams sg{};

  void prepare(int num_qo_heads) {
    slopes.resize(num_qo_heads);
    for (int h = 0; h < num_qo_heads; ++h)
      slopes[h] = std::pow(2.f, -8.f * (h + 1) / num_qo_heads);
    if (d_slopes) cudaFree(d_slopes);
    CUDA_OK(cudaMalloc(&d_slopes, num_qo_heads * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_slopes, slopes.data(), num_qo_heads * sizeof(float),
                       cudaMemcpyHostToDevice));
    sc.cap = cap;
    al.slopes = d_slopes;
    wi.window = window;
    sg.bias = bias;
  }
  void fill(AttncPrefillArgs& a) const {
    switch (f) {
      case kSoftCap: a.variant_params = &sc; a.variant_params_size = sizeof(sc); break;
      case kAlibi: a.variant_params = &al; a.variant_params_size = sizeof(al); break;
      case kWindow: a.variant_params = &wi; a.variant_params_size = sizeof(wi); break;
      case kSigmoid: a.variant_params = &sg; a.variant_params_size = sizeof(sg); break;
      default: a.variant_params = nullptr; a.variant_params_size = 0; break;
    }
  }
  bool visible(int q_pos, int kv) const {
    switch (f) {
      case kCausal: case kSoftCap: case kAlibi: return kv <= q_pos;
      case kWindow: return kv <= q_pos && q_pos - kv < window;
      default: return true;
    }
  }
  double score(double s, int q_pos, int kv, int head) const {
    switch (f) {
      case kSoftCap: return cap * std::tanh(s / cap);
      case kAlibi: return s + slopes[head] * double(kv - q_pos);
      case kSigmoid: return 1.0 / (1.0 + std::exp(-(s + bias)));
      default: return s;
    }
  }
  bool softmax() const { return f != kSigmoid; }
};

uint16_t to_bits(float x, bool bf16) {
  if (bf16) {
    __nv_bfloat16 v = __float2bfloat16(x);
    uint16_t b;
    std::memcpy(&b, &v, 2);
    return b;
  }
  __half v = __float2half(x);
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

float from_bits(uint16_t b, bool bf16) {
  if (bf16) {
    __nv_bfloat16 v;
    std::memcpy(&v, &b, 2);
    return __bfloat162float(v);
  }
  __half v;
  std::memcpy(&v, &b, 2);
  return __half2float(v);
}

enum Layout { kRagged, kPagedNhd, kPagedHnd };

struct Case {
  Fixture f;
  bool bf16;
  int d;
  int group;
  int num_kv_heads;
  Layout layout;
  int page_size;
  std::vector<std::pair<int, int>> lens;  // (q_len, kv_len), q_len <= kv_len
  int window = 37;                        // SlidingWindow only; 0 masks every key
};

// Device buffers of one problem.
struct Problem {
  int total_q = 0, num_qo = 0, num_kv = 0, d = 0;
  bool bf16 = true;
  std::vector<float> q, k, v;  // host values (rounded to dtype); k/v: [req][kv][head][d]
  std::vector<int> qo_indptr, kv_tok_indptr;
  void* d_q = nullptr;
  void* d_cache = nullptr;  // ragged: k then v; paged: the cache
  void* d_o = nullptr;
  float* d_lse = nullptr;
  int32_t *d_qo_indptr = nullptr, *d_kv_indptr = nullptr, *d_indices = nullptr,
          *d_last = nullptr, *d_items = nullptr;
  AttncPrefillArgs args{};
  int num_work = 0;

  void release() {
    for (void* p : {d_q, d_cache, d_o, static_cast<void*>(d_lse), static_cast<void*>(d_qo_indptr),
                    static_cast<void*>(d_kv_indptr), static_cast<void*>(d_indices),
                    static_cast<void*>(d_last), static_cast<void*>(d_items)})
      if (p) cudaFree(p);
  }
};

template <class X>
X* upload(const std::vector<X>& h) {
  X* p = nullptr;
  CUDA_OK(cudaMalloc(&p, std::max<size_t>(1, h.size()) * sizeof(X)));
  if (!h.empty()) CUDA_OK(cudaMemcpy(p, h.data(), h.size() * sizeof(X), cudaMemcpyHostToDevice));
  return p;
}

void build_problem(Problem& p, const Case& c, const Module& mod, std::mt19937& rng,
                   float q_amp) {
  p.bf16 = c.bf16;
  p.d = c.d;
  p.num_kv = c.num_kv_heads;
  p.num_qo = c.num_kv_heads * c.group;
  const int B = static_cast<int>(c.lens.size());
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  p.qo_indptr.assign(1, 0);
  p.kv_tok_indptr.assign(1, 0);
  int max_q = 0;
  for (auto& lv : c.lens) {
    p.qo_indptr.push_back(p.qo_indptr.back() + lv.first);
    p.kv_tok_indptr.push_back(p.kv_tok_indptr.back() + lv.second);
    max_q = std::max(max_q, lv.first);
  }
  p.total_q = p.qo_indptr.back();
  const int total_kv = p.kv_tok_indptr.back();
  const int D = c.d;
  auto rnd = [&](float amp) { return from_bits(to_bits(amp * U(rng), c.bf16), c.bf16); };
  p.q.resize(size_t(p.total_q) * p.num_qo * D);
  for (auto& x : p.q) x = rnd(q_amp);
  p.k.resize(size_t(total_kv) * p.num_kv * D);
  p.v.resize(p.k.size());
  for (auto& x : p.k) x = rnd(1.f);
  for (auto& x : p.v) x = rnd(1.f);

  std::vector<uint16_t> hq(p.q.size());
  for (size_t i = 0; i < p.q.size(); ++i) hq[i] = to_bits(p.q[i], c.bf16);
  p.d_q = upload(hq);
  CUDA_OK(cudaMalloc(&p.d_o, p.q.size() * 2));
  CUDA_OK(cudaMalloc(&p.d_lse, size_t(p.total_q) * p.num_qo * sizeof(float)));
  p.d_qo_indptr = upload(std::vector<int32_t>(p.qo_indptr.begin(), p.qo_indptr.end()));

  AttncPrefillArgs& a = p.args;
  a = AttncPrefillArgs{};
  a.q_stride_tok = int64_t(p.num_qo) * D;
  a.q_stride_head = D;
  a.o_stride_tok = a.q_stride_tok;
  a.o_stride_head = D;
  const uint16_t nan_bits = 0xFFFF;
  const size_t row = size_t(p.num_kv) * D;  // one token of one tensor
  if (c.layout == kRagged) {
    std::vector<uint16_t> cache(2 * p.k.size());
    for (size_t i = 0; i < p.k.size(); ++i) {
      cache[i] = to_bits(p.k[i], c.bf16);
      cache[p.k.size() + i] = to_bits(p.v[i], c.bf16);
    }
    p.d_cache = upload(cache);
    a.k = p.d_cache;
    a.v = static_cast<uint16_t*>(p.d_cache) + p.k.size();
    a.kv_stride_page = 0;
    a.kv_stride_tok = row;
    a.kv_stride_head = D;
    a.page_size = 1;
    a.kv_layout = ATTNC_KV_RAGGED;
    p.d_kv_indptr = upload(std::vector<int32_t>(p.kv_tok_indptr.begin(), p.kv_tok_indptr.end()));
  } else {
    const int ps = c.page_size;
    std::vector<int> pages_of(B), page_indptr(1, 0), last(B);
    int total_pages = 0;
    for (int b = 0; b < B; ++b) {
      const int kvl = c.lens[b].second;
      pages_of[b] = (kvl + ps - 1) / ps;
      last[b] = kvl - (pages_of[b] - 1) * ps;
      total_pages += pages_of[b];
      page_indptr.push_back(total_pages);
    }
    const int pool = total_pages + 3;  // a few pages nobody uses
    std::vector<int> perm(pool);
    for (int i = 0; i < pool; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> indices(perm.begin(), perm.begin() + total_pages);
    const size_t page_elems = size_t(2) * ps * row;
    std::vector<uint16_t> cache(size_t(pool) * page_elems, nan_bits);
    const bool nhd = c.layout == kPagedNhd;
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < c.lens[b].second; ++t) {
        const int page = indices[page_indptr[b] + t / ps];
        const int in = t % ps;
        for (int h = 0; h < p.num_kv; ++h) {
          const size_t src = (size_t(p.kv_tok_indptr[b] + t) * p.num_kv + h) * D;
          const size_t tok_off = nhd ? (size_t(in) * p.num_kv + h) * D
                                     : (size_t(h) * ps + in) * D;
          const size_t kdst = size_t(page) * page_elems + tok_off;
          const size_t vdst = kdst + size_t(ps) * row;
          for (int i = 0; i < D; ++i) {
            cache[kdst + i] = to_bits(p.k[src + i], c.bf16);
            cache[vdst + i] = to_bits(p.v[src + i], c.bf16);
          }
        }
      }
    }
    p.d_cache = upload(cache);
    a.k = p.d_cache;
    a.v = static_cast<uint16_t*>(p.d_cache) + size_t(ps) * row;
    a.kv_stride_page = int64_t(page_elems);
    a.kv_stride_tok = nhd ? int64_t(row) : D;
    a.kv_stride_head = nhd ? D : int64_t(ps) * D;
    a.page_size = ps;
    a.num_pages = pool;  // page ids are checked against it on the device
    a.kv_layout = nhd ? ATTNC_KV_PAGED_NHD : ATTNC_KV_PAGED_HND;
    p.d_kv_indptr = upload(std::vector<int32_t>(page_indptr.begin(), page_indptr.end()));
    p.d_indices = upload(indices);
    p.d_last = upload(std::vector<int32_t>(last.begin(), last.end()));
  }

  const int tile = mod.tile_q_tokens(D, c.group, max_q);
  std::vector<int32_t> work;  // AttncPrefillItem rows: whole KV range, never split
  std::vector<std::pair<long, std::pair<int, int>>> items;  // (cost, (req, tile)), longest first
  for (int b = 0; b < B; ++b) {
    const int ntiles = tile > 0 ? (c.lens[b].first + tile - 1) / tile : 0;
    for (int t = 0; t < ntiles; ++t)
      items.push_back({-(long(c.lens[b].second) - c.lens[b].first + (t + 1) * tile), {b, t}});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& it : items) {
    for (int h = 0; h < p.num_kv; ++h) {
      const int32_t row[ATTNC_PI_SIZE] = {it.second.first, it.second.second, h, 0, INT32_MAX, -1,
                                          0, 0};
      work.insert(work.end(), row, row + ATTNC_PI_SIZE);
    }
  }
  p.num_work = static_cast<int>(work.size() / ATTNC_PI_SIZE);
  p.d_items = upload(work);

  a.q = p.d_q;
  a.o = p.d_o;
  a.lse = p.d_lse;
  a.qo_indptr = p.d_qo_indptr;
  a.kv_indptr = p.d_kv_indptr;
  a.kv_indices = p.d_indices;
  a.kv_last_page_len = p.d_last;
  a.items = p.d_items;
  a.batch_size = B;
  a.num_work = p.num_work;
  a.num_qo_heads = p.num_qo;
  a.num_kv_heads = p.num_kv;
  a.head_dim = D;
  a.tile_q_tokens = tile;
  a.sm_scale = 1.f / std::sqrt(float(D));
}

struct Errors {
  double rel_o = 0, max_lse = 0;
  bool nan = false, lse_inf_mismatch = false;
};

Errors check(const Problem& p, const Case& c, const VariantSetup& vs) {
  const int D = p.d;
  std::vector<uint16_t> ho(p.q.size());
  std::vector<float> hl(size_t(p.total_q) * p.num_qo);
  CUDA_OK(cudaMemcpy(ho.data(), p.d_o, ho.size() * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hl.data(), p.d_lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  const double sm_scale = 1.0 / std::sqrt(double(D));
  const int B = static_cast<int>(c.lens.size());
  // Work units (request, qo head) spread over threads.
  std::vector<std::pair<int, int>> units;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < p.num_qo; ++h) units.push_back({b, h});
  const int nthreads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<double> num(nthreads, 0), den(nthreads, 0), lse_err(nthreads, 0);
  std::vector<char> nan(nthreads, 0), infmis(nthreads, 0);
  auto worker = [&](int tid) {
    std::vector<double> w, acc(D);
    for (size_t u = tid; u < units.size(); u += nthreads) {
      const int b = units[u].first, h = units[u].second, kvh = h / c.group;
      const int q_len = c.lens[b].first, kv_len = c.lens[b].second;
      w.resize(kv_len);
      for (int qi = 0; qi < q_len; ++qi) {
        const int q_pos = qi + kv_len - q_len;
        const float* qrow = &p.q[(size_t(p.qo_indptr[b] + qi) * p.num_qo + h) * D];
        double mx = -INFINITY;
        for (int j = 0; j < kv_len; ++j) {
          if (!vs.visible(q_pos, j)) {
            w[j] = -INFINITY;
            continue;
          }
          const float* krow = &p.k[(size_t(p.kv_tok_indptr[b] + j) * p.num_kv + kvh) * D];
          double s = 0;
          for (int i = 0; i < D; ++i) s += double(qrow[i]) * krow[i];
          w[j] = vs.score(s * sm_scale, q_pos, j, h);
          mx = std::max(mx, w[j]);
        }
        double sum = 0, lse = 0;
        if (vs.softmax()) {
          for (int j = 0; j < kv_len; ++j) {
            w[j] = w[j] == -INFINITY ? 0.0 : std::exp(w[j] - mx);
            sum += w[j];
          }
          lse = sum > 0 ? mx + std::log(sum) : -INFINITY;
        } else {
          for (int j = 0; j < kv_len; ++j) w[j] = w[j] == -INFINITY ? 0.0 : w[j];
          sum = 1;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j < kv_len; ++j) {
          if (w[j] == 0) continue;
          const float* vrow = &p.v[(size_t(p.kv_tok_indptr[b] + j) * p.num_kv + kvh) * D];
          for (int i = 0; i < D; ++i) acc[i] += w[j] * vrow[i];
        }
        const size_t orow = (size_t(p.qo_indptr[b] + qi) * p.num_qo + h);
        for (int i = 0; i < D; ++i) {
          const double ref = sum > 0 ? acc[i] / sum : 0.0;
          const double got = from_bits(ho[orow * D + i], p.bf16);
          if (std::isnan(got)) nan[tid] = 1;
          num[tid] += (got - ref) * (got - ref);
          den[tid] += ref * ref;
        }
        const double gl = hl[orow];
        if (std::isnan(gl)) nan[tid] = 1;
        if (std::isinf(lse) || std::isinf(gl)) {
          if (!(std::isinf(lse) && std::isinf(gl) && lse < 0 && gl < 0)) infmis[tid] = 1;
        } else {
          lse_err[tid] = std::max(lse_err[tid], std::fabs(gl - lse));
        }
      }
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  Errors e;
  double n = 0, dd = 0;
  for (int t = 0; t < nthreads; ++t) {
    n += num[t];
    dd += den[t];
    e.max_lse = std::max(e.max_lse, lse_err[t]);
    e.nan |= nan[t] != 0;
    e.lse_inf_mismatch |= infmis[t] != 0;
  }
  e.rel_o = dd > 0 ? std::sqrt(n / dd) : std::sqrt(n);
  return e;
}

const char* layout_name(const Case& c) {
  static char buf[32];
  if (c.layout == kRagged) return "ragged";
  std::snprintf(buf, sizeof(buf), "%s/p%d", c.layout == kPagedNhd ? "NHD" : "HND", c.page_size);
  return buf;
}

std::vector<Case> make_cases() {
  // Pairwise-style cover: every fixture meets every head_dim, layout and group; dtype and
  // lengths rotate so each meets the others in some case.
  const int dims[3] = {64, 128, 256};
  const int groups[3] = {1, 4, 8};
  const Layout layouts[7] = {kRagged, kPagedNhd, kPagedHnd, kPagedNhd,
                             kPagedHnd, kPagedNhd, kPagedHnd};
  const int pages[7] = {1, 1, 1, 5, 5, 16, 16};
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{1, 1}},
      {{17, 17}, {1, 577}},
      {{127, 127}},
      {{577, 577}, {17, 127}},
      {{1, 2049}, {127, 577}, {17, 17}},
      {{577, 2049}},
      {{2049, 2049}},
      {{127, 2049}, {1, 17}},
  };
  std::vector<Case> cases;
  int i = 0;
  for (int f = 0; f < 6; ++f) {
    for (int di = 0; di < 3; ++di) {
      for (int rep = 0; rep < 2; ++rep, ++i) {
        Case c;
        c.f = static_cast<Fixture>(f);
        c.d = dims[di];
        c.bf16 = (f == kCausal) ? (rep == 0) : (di == 1);
        if (f != kCausal && di != 1) c.bf16 = false;
        const int li = (i * 3 + rep) % 7;
        c.layout = layouts[li];
        c.page_size = pages[li];
        c.group = groups[(f + di + rep) % 3];
        c.num_kv_heads = (c.group == 1) ? 2 : 1;
        c.lens = batches[(i * 5 + f) % batches.size()];
        cases.push_back(c);
      }
    }
  }
  // Shapes the rotation above does not reach: every key masked (O 0, LSE -inf), a group that
  // does not divide the tile rows, and decode-like batches that take the 16-row tile.
  Case all_masked{kWindow, true, 128, 4, 2, kPagedNhd, 5, {{17, 17}, {127, 577}}, 0};
  Case group3{kCausal, true, 128, 3, 2, kRagged, 1, {{127, 127}, {1, 17}}};
  Case short_q{kAlibi, true, 128, 4, 2, kPagedHnd, 16, {{1, 577}, {3, 2049}}};
  Case short_q256{kCausal, false, 256, 8, 1, kPagedNhd, 1, {{2, 127}, {1, 1}}};
  Case short_q64{kSigmoid, false, 64, 1, 2, kRagged, 1, {{5, 17}, {16, 577}}};
  for (const Case& c : {all_masked, group3, short_q, short_q256, short_q64}) cases.push_back(c);
  return cases;
}

bool module_exists(const std::string& dir, Fixture f, bool bf16, int d) {
  const std::string path = dir + "/" + kFixtureNames[f] + (bf16 ? "_bf16_" : "_fp16_") +
                           std::to_string(d) + ".so";
  return access(path.c_str(), R_OK) == 0;
}

int run_checks(const std::string& dir) {
  std::mt19937 rng(1234);
  bool all_ok = true;
  std::printf("%-14s %-5s %4s %3s %-8s %-34s %10s %10s %s\n", "variant", "dtype", "d", "grp",
              "layout", "lens (q,kv)", "rel_err_O", "lse_err", "result");
  for (const Case& c : make_cases()) {
    if (!module_exists(dir, c.f, c.bf16, c.d)) {
      std::printf("missing module %s %s %d\n", kFixtureNames[c.f], c.bf16 ? "bf16" : "fp16", c.d);
      all_ok = false;
      continue;
    }
    const Module mod = load_module(dir, c.f, c.bf16, c.d);
    VariantSetup vs;
    vs.f = c.f;
    vs.cap = 2.f;     // small cap so that tanh bends the scores
    vs.window = c.window;
    vs.bias = -1.f;
    Problem p;
    build_problem(p, c, mod, rng, 3.f);
    vs.prepare(p.num_qo);
    vs.fill(p.args);
    CUDA_OK(cudaMemset(p.d_o, 0xFF, p.q.size() * 2));  // NaN poison
    CUDA_OK(cudaMemset(p.d_lse, 0xFF, size_t(p.total_q) * p.num_qo * 4));
    const int rc = mod.prefill(&p.args, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    std::string lens;
    for (auto& lv : c.lens)
      lens += "(" + std::to_string(lv.first) + "," + std::to_string(lv.second) + ")";
    bool ok = rc == 0;
    Errors e;
    if (ok) {
      e = check(p, c, vs);
      const double tol = c.bf16 ? 2e-2 : 1e-2;
      ok = !e.nan && !e.lse_inf_mismatch && e.rel_o < tol && e.max_lse < 2e-2;
    }
    all_ok &= ok;
    std::printf("%-14s %-5s %4d %3d %-8s %-34s %10.2e %10.2e %s%s%s\n", kFixtureNames[c.f],
                c.bf16 ? "bf16" : "fp16", c.d, c.group, layout_name(c), lens.c_str(), e.rel_o,
                e.max_lse, ok ? "ok" : "FAIL", e.nan ? " NaN" : "",
                e.lse_inf_mismatch ? " inf-mismatch" : "");
    if (rc != 0) std::printf("  launcher returned %d\n", rc);
    p.release();
    cudaFree(vs.d_slopes);
  }
  std::printf("%s\n", all_ok ? "PASS" : "FAIL");
  return all_ok ? 0 : 1;
}

// ---- timing
double visible_pairs(const VariantSetup& vs, int L) {
  double n = 0;
  for (int q = 0; q < L; ++q) {
    if (vs.f == kWindow) n += std::min(vs.window, q + 1);
    else if (vs.f == kSigmoid || vs.f == kVanilla) n += L;
    else n += q + 1;
  }
  return n;
}

void bench_one(const std::string& dir, Fixture f, int d, const char* label) {
  const int L = 8192, hq = 32, hk = 8;
  const Module mod = load_module(dir, f, true, d);
  std::mt19937 rng(99);
  Case c{f, true, d, hq / hk, hk, kRagged, 1, {{L, L}}};
  const int sets = 3;
  Problem ps[sets];
  VariantSetup vs;
  vs.f = f;
  vs.cap = 30.f;
  vs.window = 1024;
  vs.bias = -1.f;
  for (int s = 0; s < sets; ++s) build_problem(ps[s], c, mod, rng, 1.f);
  vs.prepare(hq);
  for (int s = 0; s < sets; ++s) vs.fill(ps[s].args);
  for (int i = 0; i < 3; ++i)
    for (int s = 0; s < sets; ++s) {
      const int rc = mod.prefill(&ps[s].args, nullptr);
      if (rc != 0) { std::printf("%s: launcher returned %d\n", label, rc); return; }
    }
  CUDA_OK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    CUDA_OK(cudaEventRecord(e0));
    mod.prefill(&ps[i % sets].args, nullptr);
    CUDA_OK(cudaEventRecord(e1));
    CUDA_OK(cudaEventSynchronize(e1));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CUDA_OK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double med = 0.5 * (ms[9] + ms[10]);
  const double flops = 4.0 * visible_pairs(vs, L) * d * hq;
  std::printf("%-28s d=%-3d  %8.3f ms  %7.1f TFLOP/s\n", label, d, med,
              flops / (med * 1e-3) / 1e12);
  for (auto& p : ps) p.release();
  cudaFree(vs.d_slopes);
}

int run_bench(const std::string& dir, bool causal128_only) {
  std::printf("8K prefill, bf16, 32 qo / 8 kv heads, single request, ragged, median of 20\n");
  bench_one(dir, kCausal, 128, "causal");
  if (causal128_only) return 0;
  bench_one(dir, kSoftCap, 128, "soft-cap 30, causal");
  bench_one(dir, kAlibi, 128, "ALiBi, causal");
  bench_one(dir, kWindow, 128, "sliding window 1024");
  bench_one(dir, kSigmoid, 128, "sigmoid (no softmax)");
  bench_one(dir, kCausal, 64, "causal");
  bench_one(dir, kCausal, 256, "causal");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODULE_DIR [--bench]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  if (argc > 2 && std::strcmp(argv[2], "--bench") == 0) return run_bench(dir, false);
  if (argc > 2 && std::strcmp(argv[2], "--bench-causal128") == 0) return run_bench(dir, true);
  return run_checks(dir);
}
