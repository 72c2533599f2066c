// The seed's figure as SVG: output speed per request (x) against throughput per machine
// (log y), one Pareto frontier per EP size.
#pragma once

#include <string>

#include "plan/planner.h"

namespace sy::plan {

std::string PlotParetoSvg(const Plan& plan, const HardwareSpec& hardware, const std::string& title);

}  // namespace sy::plan
