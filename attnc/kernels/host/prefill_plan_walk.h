// Owns: where each work item sits in the list for the Hopper kernel's alternating walk
// (attnc/sm90/item_order.cuh: CTA b of G runs position b, then 2G - 1 - b, then 2G + b, ...).
// The walk alone balances the CTAs well when each runs many items, but with two to five items
// a CTA the heaviest-first list can leave some CTAs a whole light item behind the rest (a
// causal 2K prefill: the busiest CTA 11% above the mean, the kernel 7% slower than with the
// items rebalanced; RESULTS.md run 39). So items are exchanged between CTAs, one or two for as
// many, keeping each CTA's count and so the walk's positions: the busiest CTA gives items to
// the least loaded CTA that can take some without reaching its load, in the exchange that
// leaves the pair's loads closest (RESULTS.md runs 40-41).
// Bit-identical to balance_walk in tests/codegen/prefill_schedule_oracle.py. The search skips
// the CTAs known to take nothing from a busiest CTA like the current one (the KV heads of a
// chunk are CTAs of equal items: each of them is searched once, not once a step).
#pragma once
#include <stdint.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace attnc {
namespace prefill_plan {

// KV tokens an item switch costs a Hopper CTA beyond the alpha * l_q the cost model charges
// for a 48-token tile: about two 80-key tiles of time (RESULTS.md run 39).
constexpr double kWalkItemCost = 112.0;
constexpr int64_t kWalkMaxRounds = 5;  // more items a CTA: as listed (host time, RESULTS run 40)
constexpr double kWalkSlack = 0.02;  // a walk whose busiest CTA is within this of the mean stays
constexpr int64_t kWalkStepsPerCta = 4;  // at most this many exchanges per CTA
constexpr int64_t kWalkPairs = kWalkMaxRounds * (kWalkMaxRounds - 1) / 2;

// The walk's CTA of list position q (of g CTAs).
inline int64_t walk_cta(int64_t q, int64_t g) {
  const int64_t r = q / g, k = q - r * g;
  return (r & 1) ? g - 1 - k : k;
}

// Position of CTA b's item of round r (of g CTAs): alternating_walk_item of item_order.cuh.
inline int64_t walk_position(int64_t r, int64_t b, int64_t g) {
  return (r & 1) ? r * g + (g - 1 - b) : r * g + b;
}

// One CTA's items for the exchange search: the cost of its item of each round, their pairs'
// sums in the order of Python's itertools.combinations (the oracle's first of equals), and
// the costs sorted (two CTAs of equal load and equal sorted costs take the same exchanges).
struct WalkCta {
  int64_t count = 0;  // its positions: rounds or rounds - 1
  double cost[kWalkMaxRounds];
  double pair[kWalkPairs];
  double sorted[kWalkMaxRounds];
  int64_t fail_epoch = -1;  // the busiest CTA's epoch in which it could take nothing

  // Pairs and sorted costs from cost.
  void refresh() {
    int64_t k = 0;
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = i + 1; j < count; ++j) pair[k++] = cost[i] + cost[j];
    for (int64_t i = 0; i < count; ++i) {  // an insertion sort of at most kWalkMaxRounds
      int64_t j = i;
      for (; j > 0 && sorted[j - 1] > cost[i]; --j) sorted[j] = sorted[j - 1];
      sorted[j] = cost[i];
    }
  }
  int64_t pairs() const { return count * (count - 1) / 2; }
};

// Whether two CTAs of equal load hold items of the same costs.
inline bool same_costs(const WalkCta& x, const WalkCta& y) {
  if (x.count != y.count) return false;
  for (int64_t i = 0; i < x.count; ++i)
    if (x.sorted[i] != y.sorted[i]) return false;
  return true;
}

struct WalkScratch {
  std::vector<double> w;          // balance cost per list index (the input, non-increasing)
  std::vector<int64_t> at;        // list index at each position (the output)
  std::vector<double> load;       // per CTA: the costs of the items at its positions
  std::vector<int64_t> by_load;   // the CTAs in order of (load, index)
  std::vector<WalkCta> cta;       // per CTA: its items
  WalkCta last_top;               // the busiest CTA of the last step, before its exchange
  double last_load = -1.0;        // and its load then
  int64_t epoch = 0;              // changes when the busiest CTA's load or costs do
};

// An exchange of the busiest CTA's choice ia for choice ib of CTA b (of k items, k = 1 or
// 2; a choice of 2 is an index of WalkCta::pair): d the cost it moves out of the busiest CTA.
struct WalkExchange {
  int64_t k = 0, ia = 0, ib = 0;
  double d = 0.0;
};

// The best exchange of sums sa[0..na) against sb[0..nb) (gap: the CTAs' loads' difference)
// into e: it must move 0 < d < gap, and the lowest |gap - 2d| wins (the first of equals in
// (i, j) order). Returns whether one was found.
inline bool best_exchange(const double* sa, int64_t na, const double* sb, int64_t nb,
                          int64_t k, double gap, WalkExchange& e) {
  bool found = false;
  double best = 0.0;
  for (int64_t i = 0; i < na; ++i)
    for (int64_t j = 0; j < nb; ++j) {
      const double d = sa[i] - sb[j];
      if (!(d > 0.0 && d < gap)) continue;
      const double score = std::abs(gap - 2.0 * d);
      if (found && !(score < best)) continue;
      found = true, best = score;
      e.k = k, e.ia = i, e.ib = j, e.d = d;
    }
  return found;
}

// Whether CTA b sorts before c in by_load: lower load, or as loaded and a lower index.
inline bool lighter(const WalkScratch& ws, int64_t b, int64_t c) {
  return ws.load[b] < ws.load[c] || (ws.load[b] == ws.load[c] && b < c);
}

// The CTAs at places i < top of by_load changed loads: both taken out, then each put back at
// its place (a binary search among the others, which stay in order).
inline void resort_ctas(WalkScratch& ws, int64_t i, int64_t top) {
  int64_t* v = ws.by_load.data();
  const int64_t g = static_cast<int64_t>(ws.by_load.size()), a = v[top], b = v[i];
  std::memmove(v + top, v + top + 1, sizeof(int64_t) * (g - 1 - top));
  std::memmove(v + i, v + i + 1, sizeof(int64_t) * (g - 2 - i));
  const auto before = [&ws](int64_t x, int64_t y) { return lighter(ws, x, y); };
  for (int64_t m = g - 2; m < g; ++m) {
    const int64_t c = m == g - 2 ? a : b;
    int64_t* at = std::lower_bound(v, v + m, c, before);
    std::memmove(at + 1, at, sizeof(int64_t) * (v + m - at));
    *at = c;
  }
}

// The round of item j of a choice of k items (choice i of WalkCta::pair when k is 2).
inline int64_t choice_round(int64_t count, int64_t k, int64_t i, int64_t j) {
  if (k == 1) return i;
  for (int64_t r0 = 0;; ++r0) {
    const int64_t later = count - 1 - r0;  // pairs that start at round r0
    if (i < later) return j == 0 ? r0 : r0 + 1 + i;
    i -= later;
  }
}

// Exchange e between the busiest CTA a (place top of by_load) and CTA b (place i) of g CTAs.
inline void apply_exchange(WalkScratch& ws, int64_t top, int64_t i, int64_t g,
                           const WalkExchange& e) {
  const int64_t a = ws.by_load[top], b = ws.by_load[i];
  WalkCta &ca = ws.cta[a], &cb = ws.cta[b];
  for (int64_t j = 0; j < e.k; ++j) {
    const int64_t ra = choice_round(ca.count, e.k, e.ia, j);
    const int64_t rb = choice_round(cb.count, e.k, e.ib, j);
    std::swap(ws.at[walk_position(ra, a, g)], ws.at[walk_position(rb, b, g)]);
    std::swap(ca.cost[ra], cb.cost[rb]);
  }
  ca.refresh(), cb.refresh();
  ca.fail_epoch = cb.fail_epoch = -1;
  ws.load[a] -= e.d, ws.load[b] += e.d;
  resort_ctas(ws, i, top);
}

// One exchange out of the busiest CTA (the lowest index of the highest load): with the least
// loaded CTA below its load for which one exists, one item for one, else two for two.
// Returns false when no CTA can take any. CTAs that could take nothing from a busiest CTA of
// the same load and costs (epoch) are not searched again, nor a CTA the same as the last one
// searched.
inline bool exchange_step(WalkScratch& ws, int64_t g) {
  int64_t top = g - 1;
  const double la = ws.load[ws.by_load[top]];
  while (top > 0 && ws.load[ws.by_load[top - 1]] == la) --top;
  const int64_t a = ws.by_load[top];
  const WalkCta& ca = ws.cta[a];
  if (ws.last_load != la || !same_costs(ws.last_top, ca)) ++ws.epoch;
  ws.last_top = ca, ws.last_load = la;
  const int64_t epoch = ws.epoch;
  int64_t failed = -1;  // the last CTA searched (and found unable to take any)
  for (int64_t i = 0; i < g && ws.load[ws.by_load[i]] < la; ++i) {
    const int64_t b = ws.by_load[i];
    WalkCta& cb = ws.cta[b];
    if (cb.fail_epoch == epoch) continue;
    if (failed >= 0 && ws.load[b] == ws.load[failed] && same_costs(cb, ws.cta[failed])) {
      cb.fail_epoch = epoch;
      continue;
    }
    const double gap = la - ws.load[b];
    WalkExchange e;
    if (best_exchange(ca.cost, ca.count, cb.cost, cb.count, 1, gap, e) ||
        best_exchange(ca.pair, ca.pairs(), cb.pair, cb.pairs(), 2, gap, e)) {
      apply_exchange(ws, top, i, g, e);
      return true;
    }
    failed = b, cb.fail_epoch = epoch;
  }
  return false;
}

// Whether list index a runs before c in a CTA: heavier, or as heavy and listed first.
inline bool heavier(const WalkScratch& ws, int64_t a, int64_t c) {
  return ws.w[a] > ws.w[c] || (ws.w[a] == ws.w[c] && a < c);
}

// Each CTA runs its items heaviest first (ties: list order).
inline void heaviest_first_per_cta(WalkScratch& ws, int64_t g, int64_t rounds) {
  const int64_t n = static_cast<int64_t>(ws.at.size());
  int64_t pos[kWalkMaxRounds], mine[kWalkMaxRounds];
  for (int64_t b = 0; b < g; ++b) {
    int64_t k = 0;
    for (int64_t r = 0; r < rounds && walk_position(r, b, g) < n; ++r)
      pos[k] = walk_position(r, b, g), mine[k] = ws.at[pos[k]], ++k;
    for (int64_t i = 1; i < k; ++i)  // insertion sort of at most kWalkMaxRounds
      for (int64_t j = i; j > 0 && heavier(ws, mine[j], mine[j - 1]); --j)
        std::swap(mine[j], mine[j - 1]);
    for (int64_t i = 0; i < k; ++i) ws.at[pos[i]] = mine[i];
  }
}

// ws.at: the list index (heaviest first) to place at each position, for n items whose
// balance costs are ws.w, run by the walk over g = min(n, walk_ctas) CTAs. The identity when
// walk_ctas is 0, when each CTA runs one item or more than kWalkMaxRounds, or when the walk
// alone leaves no CTA kWalkSlack above the mean. Else at most kWalkStepsPerCta * g exchanges
// (exchange_step), then each CTA's items heaviest first.
inline void balance_walk(WalkScratch& ws, int64_t walk_ctas) {
  const int64_t n = static_cast<int64_t>(ws.w.size());
  ws.at.resize(n);
  for (int64_t q = 0; q < n; ++q) ws.at[q] = q;
  if (walk_ctas <= 0 || n == 0) return;
  const int64_t g = std::min(n, walk_ctas), rounds = (n + g - 1) / g;
  if (rounds < 2 || rounds > kWalkMaxRounds) return;
  ws.load.assign(g, 0.0);
  double total = 0.0;
  for (int64_t q = 0; q < n; ++q) ws.load[walk_cta(q, g)] += ws.w[q], total += ws.w[q];
  if (!(*std::max_element(ws.load.begin(), ws.load.end()) * static_cast<double>(g) >
        total * (1.0 + kWalkSlack)))
    return;
  ws.by_load.resize(g);
  for (int64_t b = 0; b < g; ++b) ws.by_load[b] = b;
  std::sort(ws.by_load.begin(), ws.by_load.end(),
            [&ws](int64_t x, int64_t y) { return lighter(ws, x, y); });
  ws.cta.assign(g, WalkCta());
  for (int64_t b = 0; b < g; ++b) {
    WalkCta& c = ws.cta[b];
    for (int64_t r = 0; r < rounds && walk_position(r, b, g) < n; ++r)
      c.cost[c.count++] = ws.w[walk_position(r, b, g)];
    c.refresh();
  }
  ws.last_load = -1.0;  // loads are never negative: the first step starts an epoch
  for (int64_t step = 0; step < kWalkStepsPerCta * g; ++step)
    if (!exchange_step(ws, g)) break;
  heaviest_first_per_cta(ws, g, rounds);
}

}  // namespace prefill_plan
}  // namespace attnc
