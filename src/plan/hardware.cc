#include "plan/hardware.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace sy::plan {
namespace {

using nlohmann::json;

// Dense (not sparse) datasheet peaks per GPU. Links are per GPU, one direction: NVLink 4 gives
// 450 GB/s, NVLink 5 900 GB/s; one 400 Gb/s InfiniBand NIC per GPU is 50 GB/s.
std::vector<HardwareSpec> Builtins() {
  HardwareSpec h100;
  h100.name = "H100";
  h100.peak_bf16_tflops = 989;
  h100.peak_fp8_tflops = 1979;
  h100.memory_bandwidth_gbps = 3350;
  h100.memory_capacity_gb = 80;
  h100.devices_per_node = 8;
  h100.max_nodes = 16;
  h100.intra_node = {450, 5};
  h100.inter_node = {50, 30};

  HardwareSpec h200 = h100;
  h200.name = "H200";
  h200.memory_bandwidth_gbps = 4800;
  h200.memory_capacity_gb = 141;

  HardwareSpec b200 = h100;
  b200.name = "B200";
  b200.peak_bf16_tflops = 2250;
  b200.peak_fp8_tflops = 4500;
  b200.memory_bandwidth_gbps = 8000;
  b200.memory_capacity_gb = 180;
  b200.intra_node = {900, 5};
  b200.inter_node = {50, 30};

  HardwareSpec gb200 = b200;
  gb200.name = "GB200";
  gb200.peak_bf16_tflops = 2500;
  gb200.peak_fp8_tflops = 5000;
  gb200.memory_capacity_gb = 186;
  gb200.devices_per_node = 72;  // one NVL72 NVLink domain
  gb200.max_nodes = 2;
  gb200.intra_node = {900, 5};
  gb200.inter_node = {100, 30};
  return {h100, h200, b200, gb200};
}

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return text;
}

Status ReadNumber(const json& object, const char* key, double& out, const std::string& where,
                  bool required, bool positive = true) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (required) return Status::Errorf("{}: field '{}' is missing", where, key);
    return Status::Ok();
  }
  if (!it->is_number()) return Status::Errorf("{}: field '{}' must be a number", where, key);
  double value = it->get<double>();
  if (positive ? !(value > 0) : !(value >= 0))
    return Status::Errorf("{}: field '{}' must be {}", where, key,
                          positive ? "positive" : "non-negative");
  out = value;
  return Status::Ok();
}

}  // namespace

std::vector<std::string> BuiltinHardwareNames() {
  std::vector<std::string> names;
  for (const auto& spec : Builtins())
    names.push_back(spec.name);
  return names;
}

Result<HardwareSpec> ParseHardware(const std::string& text, const std::string& source) {
  json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object())
    return Status::Errorf("{}: not a JSON object", source);
  HardwareSpec spec;
  if (root.contains("base")) {  // start from a built-in and override fields
    if (!root["base"].is_string()) return Status::Errorf("{}: field 'base' must be a name", source);
    SY_ASSIGN_OR_RETURN(spec, LoadHardware(root["base"].get<std::string>()));
  }
  bool based = root.contains("base");
  if (root.contains("name")) {
    if (!root["name"].is_string())
      return Status::Errorf("{}: field 'name' must be a string", source);
    spec.name = root["name"].get<std::string>();
  }
  SY_RETURN_IF_ERROR(ReadNumber(root, "peak_bf16_tflops", spec.peak_bf16_tflops, source, !based));
  SY_RETURN_IF_ERROR(
      ReadNumber(root, "peak_fp8_tflops", spec.peak_fp8_tflops, source, false, false));
  SY_RETURN_IF_ERROR(
      ReadNumber(root, "memory_bandwidth_gbps", spec.memory_bandwidth_gbps, source, !based));
  SY_RETURN_IF_ERROR(
      ReadNumber(root, "memory_capacity_gb", spec.memory_capacity_gb, source, !based));
  SY_RETURN_IF_ERROR(
      ReadNumber(root, "memory_reserved_gb", spec.memory_reserved_gb, source, false, false));
  double devices = spec.devices_per_node, nodes = spec.max_nodes;
  SY_RETURN_IF_ERROR(ReadNumber(root, "devices_per_node", devices, source, !based));
  SY_RETURN_IF_ERROR(ReadNumber(root, "max_nodes", nodes, source, false));
  if (devices != static_cast<int>(devices) || nodes != static_cast<int>(nodes))
    return Status::Errorf("{}: devices_per_node and max_nodes must be integers", source);
  spec.devices_per_node = static_cast<int>(devices);
  spec.max_nodes = static_cast<int>(nodes);
  for (auto [key, link] : {std::pair<const char*, Link*>{"intra_node", &spec.intra_node},
                           {"inter_node", &spec.inter_node}}) {
    auto it = root.find(key);
    if (it == root.end()) {
      if (!based) return Status::Errorf("{}: field '{}' is missing", source, key);
      continue;
    }
    if (!it->is_object()) return Status::Errorf("{}: field '{}' must be an object", source, key);
    const std::string where = source + ": " + key;
    SY_RETURN_IF_ERROR(ReadNumber(*it, "bandwidth_gbps", link->bandwidth_gbps, where, !based));
    SY_RETURN_IF_ERROR(ReadNumber(*it, "latency_us", link->latency_us, where, false, false));
  }
  auto eff = root.find("efficiency");
  if (eff != root.end()) {
    if (!eff->is_object())
      return Status::Errorf("{}: field 'efficiency' must be an object", source);
    const std::string where = source + ": efficiency";
    Efficiency& e = spec.efficiency;
    for (auto [key, value] :
         std::vector<std::pair<const char*, double*>>{{"gemm_memory", &e.gemm_memory},
                                                      {"gemm_compute", &e.gemm_compute},
                                                      {"gemm_m_half", &e.gemm_m_half},
                                                      {"grouped_memory", &e.grouped_memory},
                                                      {"grouped_compute", &e.grouped_compute},
                                                      {"grouped_m_half", &e.grouped_m_half},
                                                      {"attention_memory", &e.attention_memory},
                                                      {"attention_compute", &e.attention_compute},
                                                      {"link", &e.link}}) {
      SY_RETURN_IF_ERROR(ReadNumber(*eff, key, *value, where, false));
    }
    SY_RETURN_IF_ERROR(ReadNumber(*eff, "kernel_floor_us", e.kernel_floor_us, where, false, false));
    SY_RETURN_IF_ERROR(
        ReadNumber(*eff, "layer_overhead_us", e.layer_overhead_us, where, false, false));
    for (const auto& item : eff->items()) {
      static const std::vector<std::string> known = {
          "gemm_memory",      "gemm_compute",      "gemm_m_half",
          "grouped_memory",   "grouped_compute",   "grouped_m_half",
          "attention_memory", "attention_compute", "link",
          "kernel_floor_us",  "layer_overhead_us"};
      if (std::find(known.begin(), known.end(), item.key()) == known.end())
        return Status::Errorf("{}: unknown field '{}'", where, item.key());
    }
  }
  if (spec.devices_per_node < 1 || spec.max_nodes < 1)
    return Status::Errorf("{}: devices_per_node and max_nodes must be at least 1", source);
  return spec;
}

Result<HardwareSpec> LoadHardware(const std::string& name_or_path) {
  for (const auto& spec : Builtins())
    if (Lower(spec.name) == Lower(name_or_path)) return spec;
  std::ifstream in(name_or_path);
  if (!in) {
    std::string names;
    for (const auto& n : BuiltinHardwareNames())
      names += (names.empty() ? "" : ", ") + n;
    return Status::Errorf("--hardware '{}' is neither a built-in ({}) nor a readable file",
                          name_or_path, names);
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseHardware(text.str(), name_or_path);
}

std::string HardwareToJson(const HardwareSpec& s) {
  const Efficiency& e = s.efficiency;
  json j = {
      {"name", s.name},
      {"peak_bf16_tflops", s.peak_bf16_tflops},
      {"peak_fp8_tflops", s.peak_fp8_tflops},
      {"memory_bandwidth_gbps", s.memory_bandwidth_gbps},
      {"memory_capacity_gb", s.memory_capacity_gb},
      {"memory_reserved_gb", s.memory_reserved_gb},
      {"devices_per_node", s.devices_per_node},
      {"max_nodes", s.max_nodes},
      {"intra_node",
       {{"bandwidth_gbps", s.intra_node.bandwidth_gbps}, {"latency_us", s.intra_node.latency_us}}},
      {"inter_node",
       {{"bandwidth_gbps", s.inter_node.bandwidth_gbps}, {"latency_us", s.inter_node.latency_us}}},
      {"efficiency",
       {{"gemm_memory", e.gemm_memory},
        {"gemm_compute", e.gemm_compute},
        {"gemm_m_half", e.gemm_m_half},
        {"grouped_memory", e.grouped_memory},
        {"grouped_compute", e.grouped_compute},
        {"grouped_m_half", e.grouped_m_half},
        {"attention_memory", e.attention_memory},
        {"attention_compute", e.attention_compute},
        {"link", e.link},
        {"kernel_floor_us", e.kernel_floor_us},
        {"layer_overhead_us", e.layer_overhead_us}}},
  };
  return j.dump(2) + "\n";
}

}  // namespace sy::plan
