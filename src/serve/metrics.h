// /metrics in Prometheus' text format, with vLLM's metric names under a "switchyard:" prefix.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace sy::serve {

std::string PrometheusText(const EngineMetrics& metrics, const std::string& model_name);

// The expert-parallel imbalance over the last completed window of `serve --record-expert-load`
// (busiest rank's routed rows over the mean rank's, summed over layers and steps), and per MoE
// layer: published by the step loop at each window's end, shown by every /metrics from then on.
// Process-wide, as there is one server per process.
void PublishExpertImbalance(double imbalance, std::vector<std::pair<int64_t, double>> per_layer);

}  // namespace sy::serve
