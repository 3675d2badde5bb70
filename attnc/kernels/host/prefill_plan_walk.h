// Owns: where each work item sits in the list for the Hopper kernel's alternating walk
// (attnc/sm90/item_order.cuh: CTA b of G runs position b, then 2G - 1 - b, then 2G + b, ...).
// The walk alone balances the CTAs well when each runs many items, but with two to four items
// a CTA the heaviest-first list leaves some CTAs a whole light item behind the rest (a
// causal 2K prefill: the busiest CTA 13% above the mean, the kernel 7% slower than with the
// items rebalanced; RESULTS.md run 39). So the items are swapped between CTAs, keeping each
// CTA's count and so the walk's positions: while some swap lowers the busiest CTA without
// raising another to its load, take the one that leaves the pair's larger load smallest
// (ties: the partner CTA of higher load, the tighter fit, then the lower position).
// Bit-identical to balance_walk in tests/codegen/prefill_schedule_oracle.py.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <vector>

namespace attnc {
namespace prefill_plan {

// KV tokens an item switch costs a Hopper CTA beyond the alpha * l_q the cost model charges
// for a 48-token tile: about two 80-key tiles of time (RESULTS.md run 39).
constexpr double kWalkItemCost = 112.0;
constexpr int64_t kWalkMaxRounds = 4;  // more items a CTA: the walk alone is within ~2%
constexpr double kWalkSlack = 0.02;  // a walk whose busiest CTA is within this of the mean stays

// The walk's CTA of list position q (of g CTAs).
inline int64_t walk_cta(int64_t q, int64_t g) {
  const int64_t r = q / g, k = q - r * g;
  return (r & 1) ? g - 1 - k : k;
}

// The positions are grouped by the cost of the item they hold (a value: equal costs, such as
// the KV heads of one chunk, are one value), each value's holders kept in order of their CTA's
// load, so that a swap's search looks at each cheaper value once (a binary search among its
// holders) rather than at every position.
struct WalkScratch {
  std::vector<double> w;     // balance cost per list index (the input, non-increasing)
  std::vector<int64_t> at;   // list index at each position (the output)
  std::vector<double> wv, lq, load;  // cost per value; per position its CTA's load; per CTA
  std::vector<int64_t> cta, pval;    // per position: its CTA, the value it holds
  std::vector<int64_t> first, holders;  // value v's holders: [first[v], first[v + 1]), by
                                        // (load, -position)
};

// Position of CTA b's item of round r (of g CTAs): alternating_walk_item of item_order.cuh.
inline int64_t walk_position(int64_t r, int64_t b, int64_t g) {
  return (r & 1) ? r * g + (g - 1 - b) : r * g + b;
}

// Whether holder p sorts before holder o: lower load, or as loaded and a later position.
inline bool holder_before(const WalkScratch& ws, int64_t p, int64_t o) {
  return ws.lq[p] < ws.lq[o] || (ws.lq[p] == ws.lq[o] && p > o);
}

// Puts holder p of value v back in order (its load or its value just changed).
inline void reorder_holder(WalkScratch& ws, int64_t v, int64_t p) {
  int64_t* h = ws.holders.data();
  int64_t i = ws.first[v];
  while (h[i] != p) ++i;
  for (; i > ws.first[v] && holder_before(ws, h[i], h[i - 1]); --i) std::swap(h[i], h[i - 1]);
  for (; i + 1 < ws.first[v + 1] && holder_before(ws, h[i + 1], h[i]); ++i)
    std::swap(h[i], h[i + 1]);
}

// A swap of position x (of the busiest CTA) with q; nm the pair's larger load.
struct WalkSwap {
  int64_t x = -1, q = -1;
  double nm = 0.0;
};

// Whether swap s beats t: lower pair's larger load, then a partner of higher load (the
// tighter fit), then the lower position.
inline bool swap_before(const WalkScratch& ws, const WalkSwap& s, const WalkSwap& t) {
  if (t.q < 0) return true;
  if (s.nm != t.nm) return s.nm < t.nm;
  if (ws.lq[s.q] != ws.lq[t.q]) return ws.lq[s.q] > ws.lq[t.q];
  return s.q < t.q;
}

// Value v's best partner for a swap that moves d out of the busiest CTA bm (load lbm), or -1:
// the last holder whose pair's larger load is lbm - d (the most loaded, lowest position),
// else the least loaded holder (lowest position), never bm's.
inline int64_t value_partner(const WalkScratch& ws, int64_t v, int64_t bm, double lbm, double d) {
  const int64_t* h = ws.holders.data();
  int64_t lo = ws.first[v], hi = ws.first[v + 1];  // first holder with lq + d > lbm - d
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ws.lq[h[mid]] + d <= lbm - d) lo = mid + 1; else hi = mid;
  }
  if (lo > ws.first[v]) return h[lo - 1];  // bm's load lbm is never within the region
  int64_t i = ws.first[v];
  if (i == ws.first[v + 1] || ws.cta[h[i]] == bm) return -1;  // bm holds the least loaded
  while (i + 1 < ws.first[v + 1] && ws.lq[h[i + 1]] == ws.lq[h[i]]) ++i;  // lowest position
  return ws.cta[h[i]] == bm ? -1 : h[i];
}

// Value v's swap for position x of the busiest CTA into best (if better; see swap_before)
// when its pair's larger load is below lbm.
inline void try_value(const WalkScratch& ws, int64_t x, int64_t v, int64_t bm, double lbm,
                      WalkSwap& best) {
  const double d = ws.wv[ws.pval[x]] - ws.wv[v];
  const int64_t q = value_partner(ws, v, bm, lbm, d);
  if (q < 0) return;
  const WalkSwap s{x, q, std::max(lbm - d, ws.lq[q] + d)};
  if (s.nm < lbm && swap_before(ws, s, best)) best = s;
}

// The best swap of position x out of the busiest CTA bm (load lbm) with a cheaper item whose
// pair's larger load is below lbm (q < 0: none); lmin is at most the lowest load of another
// CTA. A value moving d can leave no pair's larger load below max(lbm - d, lmin + d), a bound
// that falls and then rises with d (with the value index): the values are tried from the one
// nearest d = (lbm - lmin) / 2 outwards, each way until the bound, on its rising side,
// exceeds the best found (or lbm).
inline WalkSwap best_partner(const WalkScratch& ws, int64_t x, int64_t bm, double lbm,
                             double lmin) {
  WalkSwap best;
  const int64_t vx = ws.pval[x], values = static_cast<int64_t>(ws.wv.size());
  const double wx = ws.wv[vx], half = (lbm - lmin) * 0.5;
  int64_t lo = vx + 1, hi = values;  // the first value moving half or more
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (wx - ws.wv[mid] < half) lo = mid + 1; else hi = mid;
  }
  auto beyond = [&](double d, bool rising_up) {
    const double up = lmin + d, down = lbm - d;
    const bool rising = rising_up ? up >= down : down >= up;
    return rising && std::max(up, down) > (best.q < 0 ? lbm : best.nm);
  };
  for (int64_t v = lo; v < values && !beyond(wx - ws.wv[v], true); ++v)
    try_value(ws, x, v, bm, lbm, best);
  for (int64_t v = lo - 1; v > vx && !beyond(wx - ws.wv[v], false); --v)
    try_value(ws, x, v, bm, lbm, best);
  return best;
}

// Values and their holders for the initial placement (position q holds list index q).
inline void group_values(WalkScratch& ws, int64_t n) {
  ws.wv.clear(), ws.first.clear(), ws.pval.resize(n), ws.holders.resize(n);
  for (int64_t q = 0; q < n; ++q) {
    if (q == 0 || ws.w[q] != ws.w[q - 1]) ws.wv.push_back(ws.w[q]), ws.first.push_back(q);
    ws.pval[q] = static_cast<int64_t>(ws.wv.size()) - 1, ws.holders[q] = q;
  }
  ws.first.push_back(n);
  for (size_t v = 0; v + 1 < ws.first.size(); ++v)
    std::sort(ws.holders.begin() + ws.first[v], ws.holders.begin() + ws.first[v + 1],
              [&ws](int64_t p, int64_t o) { return holder_before(ws, p, o); });
}

// CTA b's load is now ws.load[b]: its positions' lq, and their places among their values'.
inline void note_load(WalkScratch& ws, int64_t b, int64_t g, int64_t rounds) {
  const int64_t n = static_cast<int64_t>(ws.lq.size());
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t x = walk_position(r, b, g);
    if (x < n) ws.lq[x] = ws.load[b], reorder_holder(ws, ws.pval[x], x);
  }
}

// Positions x and q exchange their items (values vx and vq).
inline void exchange(WalkScratch& ws, int64_t x, int64_t q) {
  const int64_t vx = ws.pval[x], vq = ws.pval[q];
  std::swap(ws.at[x], ws.at[q]);
  for (int64_t i = ws.first[vx]; i < ws.first[vx + 1]; ++i)
    if (ws.holders[i] == x) ws.holders[i] = q;
  for (int64_t i = ws.first[vq]; i < ws.first[vq + 1]; ++i)
    if (ws.holders[i] == q) ws.holders[i] = x;
  ws.pval[x] = vq, ws.pval[q] = vx;
}

// Whether list index a runs before c in a CTA: heavier, or as heavy and listed first.
inline bool heavier(const WalkScratch& ws, int64_t a, int64_t c) {
  return ws.w[a] > ws.w[c] || (ws.w[a] == ws.w[c] && a < c);
}

// Each CTA runs its items heaviest first (ties: list order).
inline void heaviest_first_per_cta(WalkScratch& ws, int64_t g, int64_t rounds) {
  const int64_t n = static_cast<int64_t>(ws.at.size());
  int64_t mine[kWalkMaxRounds];
  for (int64_t b = 0; b < g; ++b) {
    int64_t k = 0;
    for (int64_t r = 0; r < rounds; ++r)
      if (walk_position(r, b, g) < n) mine[k++] = ws.at[walk_position(r, b, g)];
    for (int64_t i = 1; i < k; ++i)  // insertion sort of at most kWalkMaxRounds
      for (int64_t j = i; j > 0 && heavier(ws, mine[j], mine[j - 1]); --j)
        std::swap(mine[j], mine[j - 1]);
    for (int64_t r = 0, i = 0; r < rounds; ++r)
      if (walk_position(r, b, g) < n) ws.at[walk_position(r, b, g)] = mine[i++];
  }
}

// ws.at: the list index (heaviest first) to place at each position, for n items whose
// balance costs are ws.w, run by the walk over g = min(n, walk_ctas) CTAs. The identity when
// walk_ctas is 0, when each CTA runs one item or more than kWalkMaxRounds, or when the walk
// alone leaves no CTA kWalkSlack above the mean. Else at most g swaps, each the best for the
// busiest CTA (the first of equals) at the time: of its positions in round order, the one
// whose best partner leaves the lowest pair's larger load (the first of equals).
inline void balance_walk(WalkScratch& ws, int64_t walk_ctas) {
  const int64_t n = static_cast<int64_t>(ws.w.size());
  ws.at.resize(n);
  for (int64_t q = 0; q < n; ++q) ws.at[q] = q;
  if (walk_ctas <= 0 || n == 0) return;
  const int64_t g = std::min(n, walk_ctas), rounds = (n + g - 1) / g;
  if (rounds < 2 || rounds > kWalkMaxRounds) return;
  ws.cta.resize(n), ws.lq.resize(n);
  ws.load.assign(g, 0.0);
  double total = 0.0;
  for (int64_t q = 0; q < n; ++q) {
    ws.cta[q] = walk_cta(q, g), ws.load[ws.cta[q]] += ws.w[q];
    total += ws.w[q];
  }
  if (!(*std::max_element(ws.load.begin(), ws.load.end()) * static_cast<double>(g) >
        total * (1.0 + kWalkSlack)))
    return;
  for (int64_t q = 0; q < n; ++q) ws.lq[q] = ws.load[ws.cta[q]];
  group_values(ws, n);
  for (int64_t step = 0; step < g; ++step) {
    int64_t bm = 0;  // the busiest CTA (the first of equals), and the lowest load of all
    double lbm = ws.load[0], lmin = ws.load[0];
    for (int64_t b = 1; b < g; ++b) {
      const double l = ws.load[b];
      if (l > lbm) lbm = l, bm = b;
      if (l < lmin) lmin = l;
    }
    WalkSwap best;
    for (int64_t r = 0; r < rounds; ++r) {  // bm's positions in round order
      const int64_t x = walk_position(r, bm, g);
      if (x >= n) continue;
      const WalkSwap s = best_partner(ws, x, bm, lbm, lmin);
      if (s.q >= 0 && (best.q < 0 || s.nm < best.nm)) best = s;
    }
    if (best.q < 0) break;
    const int64_t b = ws.cta[best.q];
    const double d = ws.wv[ws.pval[best.x]] - ws.wv[ws.pval[best.q]];
    exchange(ws, best.x, best.q);
    ws.load[bm] -= d, ws.load[b] += d;
    note_load(ws, bm, g, rounds);
    note_load(ws, b, g, rounds);
  }
  heaviest_first_per_cta(ws, g, rounds);
}

}  // namespace prefill_plan
}  // namespace attnc
