// Deployment enumeration and the Pareto frontier of throughput per device against output speed
// per request, one frontier per EP size (the Perplexity figure).
#pragma once

#include <string>
#include <vector>

#include "plan/cost_model.h"

namespace sy::plan {

struct SearchSpace {
  std::vector<int> ep;  // empty: {8, 16, 32, 64, 128} within what the hardware allows
  std::vector<int> tp = {1, 2, 4, 8};
  std::vector<int> batch = {1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<Overlap> overlap = {Overlap::kNone, Overlap::kDispatch, Overlap::kMicrobatch};
};

struct ParetoFrontier {
  int ep = 0;
  std::vector<const Prediction*> points;  // fitting configurations, fastest first
};

struct Plan {
  int64_t kv_bytes_per_token = 0;
  std::vector<Prediction> configs;  // every enumerated configuration
  std::vector<ParetoFrontier> pareto;
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
