#include "plan/calibration.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace sy::plan {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

Status CalibrateFromBench(const std::string& text, const std::string& source, HardwareSpec& spec) {
  using nlohmann::json;
  json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) return Status::Errorf("{}: not a JSON object", source);
  auto machine = root.find("machine");
  auto results = root.find("results");
  if (machine == root.end() || !machine->is_object())
    return Status::Errorf("{}: field 'machine' is missing", source);
  if (results == root.end() || !results->is_array())
    return Status::Errorf("{}: field 'results' is missing", source);
  for (const char* key : {"read_gbps", "bf16_gflops"}) {
    auto it = machine->find(key);
    if (it == machine->end() || !it->is_number() || !(it->get<double>() > 0))
      return Status::Errorf("{}: field 'machine.{}' must be a positive number", source, key);
  }
  spec.memory_bandwidth_gbps = (*machine)["read_gbps"].get<double>();
  spec.peak_bf16_tflops = (*machine)["bf16_gflops"].get<double>() / 1000;
  spec.peak_fp8_tflops = 0;  // a CPU decodes fp8 weights and multiplies at the bf16 rate

  // Memory-bound fractions from decode shapes (m ≤ 32), compute-bound ones from prefill (m ≥ 256).
  std::vector<double> gemm_memory, gemm_compute, grouped_memory, grouped_compute, attention;
  for (size_t i = 0; i < results->size(); ++i) {
    const json& r = (*results)[i];
    if (!r.is_object() || !r.contains("kernel") || !r["kernel"].is_string() || !r.contains("roofline_fraction") ||
        !r["roofline_fraction"].is_number() || !r.contains("m") || !r["m"].is_number())
      return Status::Errorf("{}: results[{}] needs 'kernel', 'm' and 'roofline_fraction'", source, i);
    const std::string kernel = r["kernel"].get<std::string>();
    const double fraction = r["roofline_fraction"].get<double>(), m = r["m"].get<double>();
    if (!(fraction > 0 && fraction <= 1.5))
      return Status::Errorf("{}: results[{}].roofline_fraction {} is out of range", source, i, fraction);
    if (kernel == "gemv" || kernel == "gemm") {
      if (m <= 32) gemm_memory.push_back(fraction);
      if (m >= 256) gemm_compute.push_back(fraction);
    } else if (kernel == "grouped_gemm") {
      (m >= 256 ? grouped_compute : grouped_memory).push_back(fraction);
    } else if (kernel == "mla_decode") {
      attention.push_back(fraction);
    }
  }
  Efficiency& e = spec.efficiency;
  if (!gemm_memory.empty()) e.gemm_memory = std::min(1.0, Median(gemm_memory));
  if (!gemm_compute.empty()) e.gemm_compute = std::min(1.0, Median(gemm_compute));
  if (!grouped_memory.empty()) e.grouped_memory = std::min(1.0, Median(grouped_memory));
  if (!grouped_compute.empty()) e.grouped_compute = std::min(1.0, Median(grouped_compute));
  if (!attention.empty()) e.attention_memory = e.attention_compute = std::min(1.0, Median(attention));
  spec.name += " (calibrated by " + source + ")";
  return Status::Ok();
}

Status CalibrateFromBenchFile(const std::string& path, HardwareSpec& spec) {
  std::ifstream in(path);
  if (!in) return Status::Errorf("{}: cannot open", path);
  std::stringstream text;
  text << in.rdbuf();
  return CalibrateFromBench(text.str(), path, spec);
}

}  // namespace sy::plan
