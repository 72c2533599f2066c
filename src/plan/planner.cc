#include "plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "kernels/cpu/latent_row.h"

namespace sy::plan {

std::vector<int> DefaultEpSizes(const ModelConfig& model, const HardwareSpec& hw) {
  const int devices = hw.devices_per_node * hw.max_nodes;
  std::vector<int> sizes;
  for (int ep : {8, 16, 32, 64, 128})
    if (ep <= devices && model.n_routed_experts % ep == 0) sizes.push_back(ep);
  if (sizes.empty())
    for (int ep = 1; ep <= devices && ep <= model.n_routed_experts; ep *= 2)
      if (model.n_routed_experts % ep == 0) sizes.push_back(ep);
  return sizes;
}

Plan MakePlan(const CostModel& model, const ModelConfig& config, const SearchSpace& space) {
  Plan plan;
  plan.kv_bytes_per_token = model.KvBytesPerToken();
  plan.kv_dtype = model.workload().kv_dtype;
  std::vector<int> eps = space.ep.empty() ? DefaultEpSizes(config, model.hardware()) : space.ep;
  const int per_node = std::max(1, model.hardware().devices_per_node);
  for (int ep : eps) {
    Deployment base{ep, 1, 1, Overlap::kNone};
    base.expert_imbalance = space.expert_imbalance;
    if (space.expert_skew > 0) {
      const int nodes = ep % per_node == 0 ? ep / per_node : 1;
      plan.balance.push_back(RedundantExpertsFor(config, ep, nodes, space.expert_skew,
                                                 space.imbalance_target,
                                                 /*max_redundant=*/config.n_routed_experts));
      base.redundant_experts = plan.balance.back().redundant;
      base.expert_imbalance = plan.balance.back().balanced;
    }
    for (int tp : space.tp) {
      if (tp > ep || ep % tp != 0 || tp > model.hardware().devices_per_node) continue;
      if (config.num_attention_heads % tp != 0) continue;
      for (int batch : space.batch)
        for (Overlap overlap : space.overlap) {
          Deployment d = base;
          d.tp = tp;
          d.batch = batch;
          d.overlap = overlap;
          plan.configs.push_back(model.Predict(d));
        }
    }
  }
  for (int ep : eps) {
    ParetoFrontier frontier;
    frontier.ep = ep;
    std::vector<const Prediction*> candidates;
    for (const auto& p : plan.configs)
      if (p.deployment.ep == ep && p.memory.fits) candidates.push_back(&p);
    std::sort(candidates.begin(), candidates.end(), [](const Prediction* a, const Prediction* b) {
      return a->output_tok_s != b->output_tok_s
                 ? a->output_tok_s > b->output_tok_s
                 : a->throughput_tok_s_per_gpu > b->throughput_tok_s_per_gpu;
    });
    double best = -1;  // highest throughput among faster configurations
    for (const Prediction* p : candidates) {
      if (p->throughput_tok_s_per_gpu > best) {
        frontier.points.push_back(p);
        best = p->throughput_tok_s_per_gpu;
      }
    }
    plan.pareto.push_back(std::move(frontier));
  }
  return plan;
}

double ThroughputAt(const ParetoFrontier& f, double speed) {
  const auto& pts = f.points;  // output speed descending, throughput ascending
  for (size_t i = 0; i + 1 < pts.size(); ++i) {
    double s0 = pts[i]->output_tok_s, s1 = pts[i + 1]->output_tok_s;
    if (speed <= s0 && speed >= s1) {
      double t = s0 == s1 ? 0 : (s0 - speed) / (s0 - s1);
      return pts[i]->throughput_tok_s_per_gpu +
             t * (pts[i + 1]->throughput_tok_s_per_gpu - pts[i]->throughput_tok_s_per_gpu);
    }
  }
  if (!pts.empty() && std::abs(pts.front()->output_tok_s - speed) < 1e-9)
    return pts.front()->throughput_tok_s_per_gpu;
  return 0;
}

std::string PlanToJson(const Plan& plan) {
  nlohmann::json j;
  j["kv_bytes_per_token"] = plan.kv_bytes_per_token;
  j["kv_dtype"] = kernels::LatentCacheDTypeName(plan.kv_dtype);
  j["configs"] = nlohmann::json::array();
  for (const auto& p : plan.configs) {
    const auto& d = p.deployment;
    const auto& l = p.moe_layer;
    j["configs"].push_back({
        {"ep", d.ep},
        {"dp", d.dp()},
        {"tp", d.tp},
        {"batch_per_gpu", d.batch},
        {"overlap", OverlapName(d.overlap)},
        {"fits", p.memory.fits},
        {"max_requests_per_gpu", p.memory.max_requests},
        {"layer_us", l.total},
        {"output_tok_s", p.output_tok_s},
        {"throughput_tok_s_per_gpu", p.throughput_tok_s_per_gpu},
        {"step_us", p.step_us},
        {"weights_gb_per_gpu", p.memory.weight_bytes / 1e9},
        {"experts_active_per_gpu", p.experts_active_per_gpu},
        {"redundant_experts", d.redundant_experts},
        {"expert_imbalance", d.expert_imbalance},
        {"layer_breakdown_us",
         {{"attention", l.attention},
          {"gemm", l.gemm},
          {"tp_reduce", l.tp_reduce},
          {"grouped_gemm", l.grouped_gemm},
          {"dispatch", l.dispatch},
          {"combine", l.combine},
          {"other", l.other}}},
    });
  }
  j["pareto"] = nlohmann::json::array();
  for (const auto& f : plan.pareto) {
    nlohmann::json points = nlohmann::json::array();
    for (const auto* p : f.points)
      points.push_back({p->output_tok_s, p->throughput_tok_s_per_gpu});
    j["pareto"].push_back({{"ep", f.ep}, {"points", points}});
  }
  j["expert_balance"] = nlohmann::json::array();
  for (const BalanceEstimate& b : plan.balance)
    j["expert_balance"].push_back({{"ep", b.ep},
                                   {"redundant_experts", b.redundant},
                                   {"contiguous_imbalance", b.contiguous},
                                   {"balanced_imbalance", b.balanced}});
  return j.dump(1) + "\n";
}

std::string PlanToTable(const Plan& plan, const HardwareSpec& hw) {
  std::string out = fmt::format(
      "KV cache: {} bytes per token ({}). Hardware: {} ({} per node).\n", plan.kv_bytes_per_token,
      plan.kv_dtype == DType::kF8E4M3 ? "fp8" : "bf16", hw.name, hw.devices_per_node);
  for (const BalanceEstimate& b : plan.balance)
    out += fmt::format(
        "EP{}: {} redundant experts ({} per device); expert imbalance {:.2f} contiguous, {:.2f} "
        "balanced (EPLB)\n",
        b.ep, b.redundant, static_cast<double>(b.redundant) / b.ep, b.contiguous, b.balanced);
  for (const auto& f : plan.pareto) {
    out += fmt::format("\nEP{} Pareto frontier ({} points)\n", f.ep, f.points.size());
    if (f.points.empty()) {
      out += "  no configuration fits in memory\n";
      continue;
    }
    out += fmt::format("  {:>4} {:>4} {:>6} {:>10} {:>12} {:>14} {:>16} {:>10} {:>9}\n", "DP", "TP",
                       "batch", "overlap", "tok/s/req", "tok/s/device", "tok/s/machine", "layer µs",
                       "max req");
    for (const auto* p : f.points) {
      const auto& d = p->deployment;
      out += fmt::format(
          "  {:>4} {:>4} {:>6} {:>10} {:>12.1f} {:>14.1f} {:>16.0f} {:>10.0f} {:>9}\n", d.dp(),
          d.tp, d.batch, OverlapName(d.overlap), p->output_tok_s, p->throughput_tok_s_per_gpu,
          p->throughput_tok_s_per_gpu * hw.devices_per_node, p->moe_layer.total,
          p->memory.max_requests);
    }
  }
  return out;
}

}  // namespace sy::plan
