// Deployment enumeration and the Pareto frontier of throughput per device against output speed
// per request, one frontier per EP size (the Perplexity figure).
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/expert_balance.h"

namespace sy::plan {

struct SearchSpace {
  std::vector<int> ep;  // empty: {8, 16, 32, 64, 128} within what the hardware allows
  std::vector<int> tp = {1, 2, 4, 8};
  std::vector<int> batch = {1, 2, 4, 8, 16, 32, 64, 128};
  // Skewed expert traffic. A measured imbalance (busiest rank / mean, e.g. from `generate
  // --json` under mpirun) applies as it is; a Zipf skew > 0 instead gives each EP size the
  // fewest redundant experts that bring the balancer's imbalance to `imbalance_target`.
  double expert_imbalance = 1.0;
  double expert_skew = 0;
  double imbalance_target = 1.10;
  std::vector<Overlap> overlap = {Overlap::kNone, Overlap::kDispatch, Overlap::kMicrobatch};
};

struct ParetoFrontier {
  int ep = 0;
  std::vector<const Prediction*> points;  // fitting configurations, fastest first
};

struct Plan {
  int64_t kv_bytes_per_token = 0;
  DType kv_dtype = DType::kBF16;
  std::vector<Prediction> configs;  // every enumerated configuration
  std::vector<ParetoFrontier> pareto;
  std::vector<BalanceEstimate> balance;  // per EP size, with an expert skew
};

// EP sizes the hardware allows: the seed's {8..128} within devices_per_node × max_nodes that
// divide the expert count; for smaller clusters, every power of two up to the device count.
std::vector<int> DefaultEpSizes(const ModelConfig& model, const HardwareSpec& hardware);

Plan MakePlan(const CostModel& model, const ModelConfig& config, const SearchSpace& space);

// Throughput per device on a frontier at a given output speed, interpolated linearly between its
// points; 0 when the frontier does not reach that speed.
double ThroughputAt(const ParetoFrontier& frontier, double output_tok_s);

std::string PlanToJson(const Plan& plan);
// The readable table: the frontier of each EP size.
std::string PlanToTable(const Plan& plan, const HardwareSpec& hardware);

}  // namespace sy::plan
