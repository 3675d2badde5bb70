// Owns: where each work item sits in the list for the Hopper kernel's alternating walk
// (attnc/sm90/item_order.cuh: CTA b of G runs position b, then 2G - 1 - b, then 2G + b, ...).
// The walk alone balances the CTAs well when each runs many items, but with two to five items
// a CTA the heaviest-first list can leave some CTAs a whole light item behind the rest (a
// causal 2K prefill: the busiest CTA 13% above the mean, the kernel 7% slower than with the
// items rebalanced; RESULTS.md run 39). So the items are swapped between CTAs, keeping each
// CTA's count and so the walk's positions: while some swap lowers the busiest CTA without
// raising another to its load, take the one that leaves the pair's larger load smallest
// (ties: the partner CTA of higher load, the tighter fit, then the lower position).
// Bit-identical to balance_walk in tests/codegen/prefill_schedule_oracle.py. A swap costs a
// few values' holders (kept in load order) and two paths of a tournament tree over the loads,
// rather than scans of every position and CTA.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace attnc {
namespace prefill_plan {

// KV tokens an item switch costs a Hopper CTA beyond the alpha * l_q the cost model charges
// for a 48-token tile: about two 80-key tiles of time (RESULTS.md run 39).
constexpr double kWalkItemCost = 112.0;
constexpr int64_t kWalkMaxRounds = 5;  // more items a CTA: as listed (host time, RESULTS run 40)
constexpr double kWalkSlack = 0.02;  // a walk whose busiest CTA is within this of the mean stays

// Position of CTA b's item of round r (of g CTAs): alternating_walk_item of item_order.cuh.
inline int64_t walk_position(int64_t r, int64_t b, int64_t g) {
  return (r & 1) ? r * g + (g - 1 - b) : r * g + b;
}

// A node of the tournament tree over the CTAs' loads: the highest load below it and the first
// CTA of that load.
struct LoadNode {
  double hi;
  int64_t arg;
};

// The tournament tree: the busiest CTA (the first of equals) at the root, and a swap, which
// changes two loads, two paths to it rather than a scan. Node k's children are 2k and 2k + 1;
// CTA b is leaf leaves + b, the leaves past g empty (no load).
struct LoadTree {
  int64_t leaves = 0;
  std::vector<LoadNode> node;
};

// The tree over the g loads: each node the left child's unless the right one's is higher.
inline void tree_build(LoadTree& t, const std::vector<double>& load) {
  const int64_t g = static_cast<int64_t>(load.size());
  int64_t leaves = 1;
  while (leaves < g) leaves *= 2;
  t.leaves = leaves;
  t.node.resize(2 * leaves);
  for (int64_t b = 0; b < leaves; ++b)
    t.node[leaves + b] = {b < g ? load[b] : -std::numeric_limits<double>::infinity(), b};
  for (int64_t k = leaves - 1; k > 0; --k) {
    const LoadNode &l = t.node[2 * k], &r = t.node[2 * k + 1];
    const int64_t right = r.hi > l.hi;  // no branch to guess
    t.node[k] = {std::max(l.hi, r.hi), l.arg + right * (r.arg - l.arg)};
  }
}

// Node k's parent, from node k (n, carried along) and its sibling, as tree_build makes it (a
// left sibling wins ties).
inline LoadNode tree_parent(const LoadTree& t, int64_t k, const LoadNode& n) {
  const LoadNode& o = t.node[k ^ 1];
  const bool sibling = (o.hi > n.hi) | ((o.hi >= n.hi) & ((k & 1) == 1));
  return {std::max(n.hi, o.hi), sibling ? o.arg : n.arg};
}

// The loads of CTAs a and b (a != b) are now la and lb: the nodes of their paths to the root,
// each from the one below and its sibling; the paths climb side by side (each level's nodes
// stored before their siblings are read), so that where they meet both carry the same.
inline void tree_set(LoadTree& t, int64_t a, double la, int64_t b, double lb) {
  int64_t i = t.leaves + a, j = t.leaves + b;
  LoadNode ni{la, a}, nj{lb, b};
  for (;; i >>= 1, j >>= 1) {
    t.node[i] = ni, t.node[j] = nj;
    if (i == 1) break;
    ni = tree_parent(t, i, ni), nj = tree_parent(t, j, nj);
  }
}

// The positions are grouped by the cost of the item they hold (a value: equal costs, such as
// the KV heads of one chunk, are one value), each value's holders kept in order of their CTA's
// load (from the first time a search or a swap needs them), so that a swap's search looks at
// each cheaper value once (a count or a binary search among its holders, skipped when even its
// least loaded holder could not win) rather than at every position.
struct WalkScratch {
  std::vector<double> w;     // balance cost per list index (the input, non-increasing)
  std::vector<int64_t> at;   // list index at each position (the output)
  std::vector<double> wv, load;  // cost per value; load per CTA
  std::vector<int64_t> cta, pval, slot;  // per position: its CTA, the value it holds, its
                                         // index in holders
  std::vector<int64_t> first, holders;  // value v's holders: [first[v], first[v + 1]), by
                                        // (load, -position)
  std::vector<double> hload;  // per index in holders: the load its holder is ordered by (its
                              // CTA's, once that CTA's change is noted)
  std::vector<char> in_order;  // per value: whether its holders are in order yet
  std::vector<double> least;   // per value: its holders' lowest load
  std::vector<int64_t> near;   // per value: the value its last search started from
  std::vector<char> moved;     // per CTA: whether a swap changed its items
  LoadTree tree;               // the busiest CTA
};

// Moves value v's holder p (of load l), at index i, towards the lower loads while it is
// before its neighbour there (a lower load, or as loaded and a later position): its index.
inline int64_t holder_down(WalkScratch& ws, int64_t v, int64_t i, int64_t p, double l) {
  int64_t *h = ws.holders.data(), *slot = ws.slot.data();
  double* hl = ws.hload.data();
  for (const int64_t begin = ws.first[v];
       i > begin && (l < hl[i - 1] || (l == hl[i - 1] && p > h[i - 1])); --i)
    h[i] = h[i - 1], hl[i] = hl[i - 1], slot[h[i]] = i;
  return i;
}

// Moves value v's holder p (of load l), at index i, towards the higher loads while its
// neighbour there is before it: its index.
inline int64_t holder_up(WalkScratch& ws, int64_t v, int64_t i, int64_t p, double l) {
  int64_t *h = ws.holders.data(), *slot = ws.slot.data();
  double* hl = ws.hload.data();
  for (const int64_t end = ws.first[v + 1];
       i + 1 < end && (hl[i + 1] < l || (hl[i + 1] == l && h[i + 1] > p)); ++i)
    h[i] = h[i + 1], hl[i] = hl[i + 1], slot[h[i]] = i;
  return i;
}

// Puts holder p (of load l) at index i of the holders.
inline void place_holder(WalkScratch& ws, int64_t i, int64_t p, double l) {
  ws.holders[i] = p, ws.hload[i] = l, ws.slot[p] = i;
}

// Puts value v's holders in order (of their CTAs' loads now), each in turn among those before
// it (as grouped, in the reverse of position order: ties need no move).
inline void order_holders(WalkScratch& ws, int64_t v) {
  for (int64_t i = ws.first[v]; i < ws.first[v + 1]; ++i) {
    const int64_t p = ws.holders[i];
    const double l = ws.load[ws.cta[p]];
    place_holder(ws, holder_down(ws, v, i, p, l), p, l);
  }
  ws.in_order[v] = 1, ws.least[v] = ws.hload[ws.first[v]];
}

// Puts holder p of value v back in order, its load now l (its load or its value just
// changed); holders not yet in order are put in order.
inline void reorder_holder(WalkScratch& ws, int64_t v, int64_t p, double l) {
  if (!ws.in_order[v]) return order_holders(ws, v);
  const int64_t i0 = ws.slot[p], i = holder_down(ws, v, i0, p, l);
  place_holder(ws, i == i0 ? holder_up(ws, v, i0, p, l) : i, p, l);
  ws.least[v] = ws.hload[ws.first[v]];
}

// A swap of position x (of the busiest CTA) with q (its CTA's load lq); nm the pair's larger
// load.
struct WalkSwap {
  int64_t x = -1, q = -1;
  double nm = 0.0, lq = 0.0;
};

// Whether swap s beats t: lower pair's larger load, then a partner of higher load (the
// tighter fit), then the lower position.
inline bool swap_before(const WalkSwap& s, const WalkSwap& t) {
  if (t.q < 0) return true;
  if (s.nm != t.nm) return s.nm < t.nm;
  if (s.lq != t.lq) return s.lq > t.lq;
  return s.q < t.q;
}

// How many of a[0..n) lead with fits true (fits holds and then fails along a), by a binary
// search whose branches depend on n alone.
template <class Fits>
inline int64_t leading(const double* a, int64_t n, Fits fits) {
  if (n == 0) return 0;
  const double* base = a;
  for (; n > 1; n -= n / 2) base = fits(base[n / 2]) ? base + n / 2 : base;
  return (base - a) + fits(*base);
}

// Value v's best partner (its index in holders) for a swap that moves d out of the busiest
// CTA bm (load lbm), or -1: the last holder whose pair's larger load is lbm - d (the most
// loaded, lowest position), else the least loaded holder (lowest position), never bm's.
// A few holders are counted rather than searched (a search's branches would be guesses).
inline int64_t value_partner(WalkScratch& ws, int64_t v, int64_t bm, double lbm, double d) {
  if (!ws.in_order[v]) order_holders(ws, v);
  const double* hl = ws.hload.data() + ws.first[v];
  const int64_t k = ws.first[v + 1] - ws.first[v];
  const double down = lbm - d, least = hl[0];
  int64_t fit = 0, low = 0;  // holders with load + d <= lbm - d; holders of the least load
  if (k <= 16) {
    for (int64_t i = 0; i < k; ++i) fit += hl[i] + d <= down, low += hl[i] <= least;
  } else {
    fit = leading(hl, k, [&](double l) { return l + d <= down; });
    low = leading(hl, k, [&](double l) { return l <= least; });
  }
  // bm's load lbm is never among the fitting; bm may hold the least loaded
  const int64_t i = ws.first[v] + (fit > 0 ? fit : low) - 1;
  const int64_t* h = ws.holders.data();
  const bool bms = ws.cta[h[ws.first[v]]] == bm || ws.cta[h[i]] == bm;
  return fit > 0 || !bms ? i : -1;
}

// Value v's swap (moving d) for position x of the busiest CTA into best (if better; see
// swap_before) when its pair's larger load is below cap. Skipped when even the value's least
// loaded holder (the lowest pair's larger load it can give) could not win.
inline void try_value(WalkScratch& ws, int64_t x, int64_t v, double d, int64_t bm,
                      double lbm, double cap, WalkSwap& best) {
  const double bound = std::max(lbm - d, ws.least[v] + d);
  if (best.q < 0 ? bound >= cap : bound > best.nm) return;
  const int64_t i = value_partner(ws, v, bm, lbm, d);
  if (i < 0) return;
  const double lq = ws.hload[i];
  const WalkSwap s{x, ws.holders[i], std::max(lbm - d, lq + d), lq};
  if (s.nm < cap && swap_before(s, best)) best = s;
}

// The first value after vx moving half or more (its cost that much below vx's), walked to
// from where the last search for vx started: the loads change little a swap.
inline int64_t first_value_moving(WalkScratch& ws, int64_t vx, double half) {
  const int64_t values = static_cast<int64_t>(ws.wv.size());
  const double wx = ws.wv[vx];
  int64_t v = std::max(ws.near[vx], vx + 1);
  while (v < values && wx - ws.wv[v] < half) ++v;
  while (v > vx + 1 && !(wx - ws.wv[v - 1] < half)) --v;
  return ws.near[vx] = v;
}

// The best swap of position x out of the busiest CTA bm (load lbm) with a cheaper item whose
// pair's larger load is below cap, at most lbm (q < 0: none); lmin is at most the lowest load
// of another CTA. A value moving d can leave no pair's larger load below
// max(lbm - d, lmin + d), a bound that falls and then rises with d (with the value index):
// the values are tried from the one nearest d = (lbm - lmin) / 2 outwards, each way until the
// bound, on its rising side, exceeds the best found (or cap).
inline WalkSwap best_partner(WalkScratch& ws, int64_t x, int64_t bm, double lbm, double lmin,
                             double cap) {
  WalkSwap best;
  const int64_t vx = ws.pval[x], values = static_cast<int64_t>(ws.wv.size());
  const double wx = ws.wv[vx];
  const int64_t lo = first_value_moving(ws, vx, (lbm - lmin) * 0.5);
  auto beyond = [&](double d, bool rising_up) {
    const double up = lmin + d, down = lbm - d;
    const bool rising = rising_up ? up >= down : down >= up;
    return rising && std::max(up, down) > (best.q < 0 ? cap : best.nm);
  };
  for (int64_t v = lo; v < values && !beyond(wx - ws.wv[v], true); ++v)
    try_value(ws, x, v, wx - ws.wv[v], bm, lbm, cap, best);
  for (int64_t v = lo - 1; v > vx && !beyond(wx - ws.wv[v], false); --v)
    try_value(ws, x, v, wx - ws.wv[v], bm, lbm, cap, best);
  return best;
}

// The walk's CTA of each position and the CTAs' loads (added in position order), and whether
// the busiest is kWalkSlack above the mean.
inline bool walk_loads(WalkScratch& ws, int64_t g, int64_t rounds) {
  const int64_t n = static_cast<int64_t>(ws.w.size());
  ws.cta.resize(n);
  ws.load.assign(g, 0.0);
  double total = 0.0;
  for (int64_t r = 0; r < rounds; ++r)
    for (int64_t k = 0, q = r * g; k < g && q < n; ++k, ++q) {
      const int64_t b = (r & 1) ? g - 1 - k : k;
      ws.cta[q] = b, ws.load[b] += ws.w[q];
      total += ws.w[q];
    }
  return *std::max_element(ws.load.begin(), ws.load.end()) * static_cast<double>(g) >
         total * (1.0 + kWalkSlack);
}

// Values and their holders for the initial placement (position q holds list index q), not
// yet in order (each value's in the reverse of position order), and each value's lowest load.
inline void group_values(WalkScratch& ws, int64_t n) {
  ws.wv.clear(), ws.first.clear();
  ws.pval.resize(n), ws.holders.resize(n), ws.slot.resize(n), ws.hload.resize(n);
  for (int64_t q = 0; q < n; ++q) {
    if (q == 0 || ws.w[q] != ws.w[q - 1]) ws.wv.push_back(ws.w[q]), ws.first.push_back(q);
    ws.pval[q] = static_cast<int64_t>(ws.wv.size()) - 1;
  }
  ws.first.push_back(n);
  const int64_t values = static_cast<int64_t>(ws.wv.size());
  ws.least.resize(values), ws.in_order.assign(values, 0);
  for (int64_t v = 0; v < values; ++v) {
    double least = std::numeric_limits<double>::infinity();
    for (int64_t q = ws.first[v], i = ws.first[v + 1] - 1; i >= ws.first[v]; ++q, --i)
      ws.holders[i] = q, ws.slot[q] = i, least = std::min(least, ws.load[ws.cta[q]]);
    ws.least[v] = least;
  }
}

// CTA b's load is now ws.load[b]: its positions' places among their values' holders.
inline void note_load(WalkScratch& ws, int64_t b, int64_t g, int64_t rounds) {
  const int64_t n = static_cast<int64_t>(ws.pval.size());
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t x = walk_position(r, b, g);
    if (x < n) reorder_holder(ws, ws.pval[x], x, ws.load[b]);
  }
}

// Positions x and q exchange their items, each taking the other's place among the holders
// (with the other's load, until its CTA's change is noted).
inline void exchange(WalkScratch& ws, int64_t x, int64_t q) {
  const int64_t ix = ws.slot[x], iq = ws.slot[q];
  std::swap(ws.at[x], ws.at[q]);
  std::swap(ws.pval[x], ws.pval[q]);
  std::swap(ws.hload[ix], ws.hload[iq]);
  ws.holders[ix] = q, ws.holders[iq] = x, ws.slot[q] = ix, ws.slot[x] = iq;
}

// Each CTA runs its items heaviest first (ties: list order), which is list order, the list
// being heaviest first: sorted (an insertion sort of at most kWalkMaxRounds) for the CTAs a
// swap changed, the others' already so.
inline void heaviest_first_per_cta(WalkScratch& ws, int64_t g, int64_t rounds) {
  const int64_t n = static_cast<int64_t>(ws.at.size());
  int64_t m[kWalkMaxRounds], pos[kWalkMaxRounds];
  for (int64_t b = 0; b < g; ++b) {
    if (!ws.moved[b]) continue;
    int64_t k = 0;
    for (int64_t r = 0; r < rounds && walk_position(r, b, g) < n; ++r)
      pos[k] = walk_position(r, b, g), m[k] = ws.at[pos[k]], ++k;
    for (int64_t i = 1; i < k; ++i)
      for (int64_t j = i; j > 0 && m[j] < m[j - 1]; --j) std::swap(m[j], m[j - 1]);
    for (int64_t i = 0; i < k; ++i) ws.at[pos[i]] = m[i];
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
  if (rounds < 2 || rounds > kWalkMaxRounds || !walk_loads(ws, g, rounds)) return;
  group_values(ws, n);
  tree_build(ws.tree, ws.load);
  ws.near.assign(ws.wv.size(), 0);
  ws.moved.assign(g, 0);
  // at most the lowest load: a swap raises its partner's and lowers the busiest CTA's
  double lmin = *std::min_element(ws.load.begin(), ws.load.end());
  for (int64_t step = 0; step < g; ++step) {
    const int64_t bm = ws.tree.node[1].arg;  // the busiest CTA (the first of equals)
    const double lbm = ws.load[bm];
    WalkSwap best;
    for (int64_t r = 0; r < rounds; ++r) {  // bm's positions in round order
      const int64_t x = walk_position(r, bm, g);
      if (x >= n) continue;
      const WalkSwap s = best_partner(ws, x, bm, lbm, lmin, best.q < 0 ? lbm : best.nm);
      if (s.q >= 0) best = s;  // below the best of bm's earlier positions
    }
    if (best.q < 0) break;
    const int64_t b = ws.cta[best.q];
    const double d = ws.wv[ws.pval[best.x]] - ws.wv[ws.pval[best.q]];
    exchange(ws, best.x, best.q);
    ws.load[bm] -= d, ws.load[b] += d;
    tree_set(ws.tree, bm, ws.load[bm], b, ws.load[b]);
    lmin = std::min(lmin, ws.load[bm]);
    ws.moved[bm] = ws.moved[b] = 1;
    note_load(ws, bm, g, rounds);
    note_load(ws, b, g, rounds);
  }
  heaviest_first_per_cta(ws, g, rounds);
}

}  // namespace prefill_plan
}  // namespace attnc
