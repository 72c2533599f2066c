// /metrics in Prometheus' text format, with vLLM's metric names under a "switchyard:" prefix.
#pragma once

#include <string>

#include "engine/engine.h"

namespace sy::serve {

std::string PrometheusText(const EngineMetrics& metrics, const std::string& model_name);

}  // namespace sy::serve
