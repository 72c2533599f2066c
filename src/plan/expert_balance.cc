#include "plan/expert_balance.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "model/expert_placement.h"
#include "plan/eplb.h"

namespace sy::plan {

std::vector<double> ZipfExpertLoad(int64_t experts, double skew) {
  std::vector<double> load(static_cast<size_t>(experts));
  double total = 0;
  for (int64_t i = 0; i < experts; ++i)
    total += load[i] = 1.0 / std::pow(static_cast<double>(i + 1), skew);
  for (double& v : load)
    v /= total;
  return load;
}

namespace {

// One layer's load as ExpertLoad counts, in parts per 2^30 (exact enough for the ratios).
ExpertLoad OneLayer(const std::vector<double>& load) {
  ExpertLoad out;
  out.experts = static_cast<int64_t>(load.size());
  out.layers = {0};
  std::vector<int64_t> counts;
  for (double v : load)
    counts.push_back(static_cast<int64_t>(std::llround(v * (1 << 30))));
  out.counts = {counts};
  return out;
}

}  // namespace

BalanceEstimate EstimateBalance(const ModelConfig& m, int ep, int nodes, int64_t redundant,
                                double skew, int trials) {
  BalanceEstimate b;
  b.ep = ep;
  b.redundant = redundant;
  const int64_t E = m.n_routed_experts;
  const std::vector<double> hot_first = ZipfExpertLoad(E, skew);
  std::mt19937 rng(12345);  // fixed: the estimate is reproducible
  double contiguous = 0, balanced = 0;
  EplbOptions options;
  options.ranks = ep;
  options.nodes = nodes;
  options.redundant = redundant;
  options.groups = std::max<int64_t>(1, m.n_group);
  if (E % options.groups != 0) options.groups = 1;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> load = hot_first;
    std::shuffle(load.begin(), load.end(), rng);
    const ExpertLoad layer = OneLayer(load);
    if (E % ep == 0) contiguous += PredictedImbalance(DefaultPlacement({0}, E, ep, 0), layer);
    auto placement = RebalanceExperts(layer, options);
    balanced += placement.ok() ? PredictedImbalance(placement.value(), layer) : 0;
  }
  b.contiguous = E % ep == 0 ? contiguous / trials : 0;
  b.balanced = balanced / trials;
  return b;
}

BalanceEstimate RedundantExpertsFor(const ModelConfig& m, int ep, int nodes, double skew,
                                    double target, int64_t max_redundant) {
  const int64_t E = m.n_routed_experts;
  BalanceEstimate best;
  for (int64_t r = (ep - E % ep) % ep; r <= max_redundant; r += ep) {
    best = EstimateBalance(m, ep, nodes, r, skew);
    if (best.balanced <= target) break;
  }
  return best;
}

}  // namespace sy::plan
