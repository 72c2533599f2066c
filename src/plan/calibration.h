// Calibrating a hardware spec from `switchyard bench kernels --json` output: the machine's
// measured peaks replace the datasheet's, and each kernel family's measured roofline fraction
// becomes its efficiency factor.
#pragma once

#include <string>

#include "base/status.h"
#include "plan/hardware.h"

namespace sy::plan {

// Applies the bench results in `json_text` to `spec`; `source` names the file in messages.
Status CalibrateFromBench(const std::string& json_text, const std::string& source,
                          HardwareSpec& spec);
Status CalibrateFromBenchFile(const std::string& path, HardwareSpec& spec);

}  // namespace sy::plan
