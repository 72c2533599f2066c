// The planner's cost model: memory per device and time per step for one deployment of a
// DeepSeek-V3-class model (docs/planner.md explains every term and its source).
//
// Conventions. EP = number of devices = DP × TP. `batch` is the batch of one DP group — what each
// attention replica runs; with TP = 1 it is the batch per device. After attention the group's
// tokens are spread over its TP ranks, so each device feeds batch·q/TP tokens into the MoE.
#pragma once

#include <string>

#include "model/config.h"
#include "plan/hardware.h"
#include "tensor/dtype.h"

namespace sy::plan {

enum class Overlap { kNone, kDispatch, kMicrobatch };
const char* OverlapName(Overlap overlap);

struct Workload {
  int64_t kv_len = 5000;          // tokens of context per request
  int mtp = 0;                    // draft tokens per step (0 or 1): query length 1 + mtp
  double acceptance = 0.6;        // probability a draft token is accepted
  DType kv_dtype = DType::kBF16;  // the latent cache's rows: kBF16 or kF8E4M3 (latent_row.h)
};

struct Deployment {
  int ep = 8;
  int tp = 1;
  int batch = 1;
  Overlap overlap = Overlap::kNone;
  // Skewed expert traffic: each rank holds (E + R) / EP physical experts, and the busiest rank
  // receives `expert_imbalance` times the mean rank's routed rows — every rank waits for it.
  int64_t redundant_experts = 0;
  double expert_imbalance = 1.0;
  int dp() const { return ep / tp; }
};

struct MemoryEstimate {
  double routed_expert_bytes = 0;
  double attention_bytes = 0;
  double dense_bytes = 0;  // dense-first MLP layers
  double shared_expert_bytes = 0;
  double other_weight_bytes = 0;  // embeddings, head, routers, norms, MTP projections
  double weight_bytes = 0;
  double activation_bytes = 0;
  double kv_bytes_per_request = 0;
  double free_bytes = 0;     // capacity − reserve − weights − activations
  int64_t max_requests = 0;  // per device (KV is replicated across a TP group)
  bool fits = false;         // weights and `batch` requests fit
};

// One layer's time on one device, µs. In overlapped modes dispatch and combine are the parts
// left exposed; in micro-batch mode compute terms are the sum over both half-batches.
struct LayerBreakdown {
  double attention = 0;     // MLA over the latent cache
  double gemm = 0;          // projections, o_proj, router, shared expert or dense MLP
  double tp_reduce = 0;     // o_proj reduction inside a TP group
  double grouped_gemm = 0;  // routed experts
  double dispatch = 0;
  double combine = 0;
  double other = 0;  // norms, top-k, quantization, launch
  double total = 0;
};

struct Prediction {
  Deployment deployment;
  MemoryEstimate memory;
  LayerBreakdown moe_layer;
  LayerBreakdown dense_layer;
  double head_us = 0;
  double step_us = 0;
  double output_tok_s = 0;  // per request
  double throughput_tok_s_per_gpu = 0;
  double experts_active_per_gpu = 0;  // expected distinct local experts read per step
  double tokens_per_expert = 0;       // rows per active expert in the grouped GEMM
};

class CostModel {
 public:
  CostModel(const ModelConfig& model, const HardwareSpec& hardware, const Workload& workload);

  Prediction Predict(const Deployment& deployment) const;
  MemoryEstimate Memory(const Deployment& deployment) const;
  // Latent KV bytes per token over the main layers (70,272 for DeepSeek-V3 in bf16).
  int64_t KvBytesPerToken() const;
  // Bytes of one token's row in one layer, as the workload's cache dtype lays it out: all of it,
  // or the part attention reads (without a DSA model's index keys).
  int64_t KvRowBytes(bool index_keys = true) const;

  const HardwareSpec& hardware() const { return hw_; }
  const Workload& workload() const { return work_; }

 private:
  struct Parts;  // the per-stage times of one layer for a given token count
  Parts LayerParts(const Deployment& d, double group_tokens, bool moe) const;
  double GemmUs(double m, double k, double n, double weight_bytes_per_element, bool fp8) const;
  double LinkUs(double bytes_per_device, int ep) const;

  ModelConfig m_;
  HardwareSpec hw_;
  Workload work_;
};

}  // namespace sy::plan
