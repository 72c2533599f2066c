// What skewed expert traffic costs a deployment, and what redundant experts buy back: the
// expected imbalance (busiest EP rank's routed rows over the mean rank's) of the contiguous
// placement and of DeepSeek's balancer (plan/eplb.h) with R redundant experts, under a Zipf
// skew of the experts' loads.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace sy::plan {

// Expected load of each expert when the i-th hottest draws ∝ 1/(i+1)^skew (skew 0: uniform), in
// order of heat (the hottest first), summing to 1.
std::vector<double> ZipfExpertLoad(int64_t experts, double skew);

struct BalanceEstimate {
  int ep = 1;
  int64_t redundant = 0;  // R
  double contiguous = 1;  // expert e on rank e / (E / N), the hot experts anywhere
  double balanced = 1;    // the balancer's placement with R redundant experts
};

// `nodes`: hosts the EP ranks span (the hierarchical policy when the groups divide over them).
// The contiguous figure is averaged over `trials` random choices of which experts are hot.
BalanceEstimate EstimateBalance(const ModelConfig& model, int ep, int nodes, int64_t redundant,
                                double skew, int trials = 16);

// The fewest redundant experts (E + R a multiple of ep, R ≤ max_redundant) whose balanced
// imbalance is at most `target`; the largest tried when none reaches it.
BalanceEstimate RedundantExpertsFor(const ModelConfig& model, int ep, int nodes, double skew,
                                    double target, int64_t max_redundant);

}  // namespace sy::plan
