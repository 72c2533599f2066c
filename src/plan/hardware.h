// Accelerator and cluster specifications for the planner: peaks, memory, links, and the
// efficiency factors that turn peaks into achievable kernel times. Built-in specs for H100,
// H200, B200 and GB200; any other machine (a CPU cluster included) is a JSON file in the same
// form (docs/planner.md, configs/hardware/).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace sy::plan {

// Fractions of a peak that real kernels reach, and fixed costs. Defaults are calibrated against
// the Perplexity measurements on H100 (docs/planner.md, "Calibration").
struct Efficiency {
  double gemm_memory = 0.70;        // memory-bound dense GEMMs, fraction of memory bandwidth
  double gemm_compute = 0.60;       // compute-bound dense GEMMs at large m, fraction of peak
  double gemm_m_half = 64;          // rows at which a GEMM reaches half its compute efficiency
  double grouped_memory = 0.53;     // grouped expert GEMM, memory-bound
  double grouped_compute = 0.38;    // grouped expert GEMM, compute-bound at large m per expert
  double grouped_m_half = 64;       // rows per expert at half of grouped_compute
  double attention_memory = 0.80;   // MLA decode reading the latent cache
  double attention_compute = 0.50;  // MLA decode FLOPs (absorbed form, bf16)
  double link = 0.50;               // dispatch/combine, fraction of link bandwidth achieved
  double kernel_floor_us = 10.0;    // least time of any kernel (launch, sync)
  double layer_overhead_us = 25.0;  // norms, top-k, activation quantization per layer
};

struct Link {
  double bandwidth_gbps = 0;  // GB/s per device, one direction
  double latency_us = 0;      // per collective call
};

struct HardwareSpec {
  std::string name;
  double peak_bf16_tflops = 0;
  double peak_fp8_tflops = 0;  // 0: no fp8 units; fp8 weights then run at the bf16 rate
  double memory_bandwidth_gbps = 0;
  double memory_capacity_gb = 0;
  double memory_reserved_gb = 2;  // runtime, communication buffers, fragmentation
  int devices_per_node = 8;
  int max_nodes = 16;
  Link intra_node;
  Link inter_node;
  Efficiency efficiency;

  double fp8_tflops() const { return peak_fp8_tflops > 0 ? peak_fp8_tflops : peak_bf16_tflops; }
};

// The built-in specs: "H100", "H200", "B200", "GB200".
std::vector<std::string> BuiltinHardwareNames();
// A built-in name (case-insensitive) or a path to a JSON spec.
Result<HardwareSpec> LoadHardware(const std::string& name_or_path);
Result<HardwareSpec> ParseHardware(const std::string& json_text, const std::string& source);
std::string HardwareToJson(const HardwareSpec& spec);

}  // namespace sy::plan
