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
  if (root.is_discarded() || !root.is_object())
    return Status::Errorf("{}: not a JSON object", source);
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
  // A CPU decodes fp8 and multiplies at the rate of its fastest multiply-add, which need not be
  // the bf16 one (on some Xeons f32 FMA outruns VDPBF16PS): that is the peak the planner uses.
  double f32 = 0;
  if (machine->contains("f32_gflops") && (*machine)["f32_gflops"].is_number())
    f32 = (*machine)["f32_gflops"].get<double>();
  const double peak_gflops = std::max((*machine)["bf16_gflops"].get<double>(), f32);
  spec.peak_bf16_tflops = peak_gflops / 1000;
  spec.peak_fp8_tflops = 0;

  // Each result is memory-bound or compute-bound on this machine's roofline; its achieved
  // bandwidth or FLOP/s over the matching peak becomes that family's efficiency.
  std::vector<double> gemm_memory, gemm_compute, grouped_memory, grouped_compute, attention;
  for (size_t i = 0; i < results->size(); ++i) {
    const json& r = (*results)[i];
    auto number = [&](const char* key) {
      return r.contains(key) && r[key].is_number() ? r[key].get<double>() : -1.0;
    };
    if (!r.is_object() || !r.contains("kernel") || !r["kernel"].is_string() || number("gbps") < 0 ||
        number("gflops") < 0 || number("m") < 0)
      return Status::Errorf("{}: results[{}] needs 'kernel', 'm', 'gbps' and 'gflops'", source, i);
    const std::string kernel = r["kernel"].get<std::string>();
    const double gbps = number("gbps"), gflops = number("gflops");
    if (gbps <= 0 || gflops <= 0)
      return Status::Errorf("{}: results[{}] has no measurement", source, i);
    const double intensity = gflops / gbps;  // FLOPs per byte moved
    const bool memory_bound = intensity * spec.memory_bandwidth_gbps < peak_gflops;
    const double memory = gbps / spec.memory_bandwidth_gbps, compute = gflops / peak_gflops;
    if (kernel == "gemv" || kernel == "gemm") {
      (memory_bound ? gemm_memory : gemm_compute).push_back(memory_bound ? memory : compute);
    } else if (kernel == "grouped_gemm") {
      (memory_bound ? grouped_memory : grouped_compute).push_back(memory_bound ? memory : compute);
    } else if (kernel == "mla_decode") {
      attention.push_back(memory_bound ? memory : compute);
    }
  }
  Efficiency& e = spec.efficiency;
  if (!gemm_memory.empty()) e.gemm_memory = std::min(1.0, Median(gemm_memory));
  if (!gemm_compute.empty()) e.gemm_compute = std::min(1.0, Median(gemm_compute));
  if (!grouped_memory.empty()) e.grouped_memory = std::min(1.0, Median(grouped_memory));
  if (!grouped_compute.empty()) e.grouped_compute = std::min(1.0, Median(grouped_compute));
  if (!attention.empty())
    e.attention_memory = e.attention_compute = std::min(1.0, Median(attention));
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
