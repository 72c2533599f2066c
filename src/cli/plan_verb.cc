// switchyard plan: which EP, TP, batch and overlap give the wanted latency at the most throughput.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "cli/verbs.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "plan/calibration.h"
#include "plan/planner.h"
#include "plan/svg_plot.h"

namespace sy {
namespace {

struct PlanArgs {
  std::string model;
  std::string hardware = "H100";
  std::string calibrate;
  int64_t kv_len = 5000;
  std::string kv_dtype = "bf16";
  int mtp = 0;
  double acceptance = 0.6;
  std::vector<int> ep;
  bool json = false;
  std::string plot;
  double expert_imbalance = 1.0;
  double expert_skew = 0;
  double imbalance_target = 1.10;
};

void RunPlan(const PlanArgs& args) {
  auto config =
      IsGgufFile(args.model) ? LoadGgufModelConfig(args.model) : LoadModelConfig(args.model);
  if (!config.ok()) FailVerb(config.status().message());
  if (config.value().n_routed_experts == 0)
    FailVerb(args.model + ": the planner needs an MoE model");
  auto hardware = plan::LoadHardware(args.hardware);
  if (!hardware.ok()) FailVerb(hardware.status().message());
  plan::HardwareSpec spec = hardware.value();
  if (!args.calibrate.empty()) {
    Status status = plan::CalibrateFromBenchFile(args.calibrate, spec);
    if (!status.ok()) FailVerb(status.message());
  }
  for (int ep : args.ep)
    if (config.value().n_routed_experts % ep != 0)
      FailVerb(fmt::format("--ep {} does not divide the {} routed experts", ep,
                           config.value().n_routed_experts));
  plan::Workload workload{args.kv_len, args.mtp, args.acceptance, KvDTypeOrFail(args.kv_dtype)};
  if (workload.kv_dtype == DType::kF32) FailVerb("--kv-dtype: the planner models bf16 or fp8");
  plan::CostModel model(config.value(), spec, workload);
  plan::SearchSpace space;
  space.ep = args.ep;
  space.expert_imbalance = args.expert_imbalance;
  space.expert_skew = args.expert_skew;
  space.imbalance_target = args.imbalance_target;
  plan::Plan result = plan::MakePlan(model, config.value(), space);
  if (!args.plot.empty()) {
    std::ofstream out(args.plot);
    out << plan::PlotParetoSvg(result, spec,
                               fmt::format("{} on {}: KV {} tokens, MTP {}", args.model, spec.name,
                                           args.kv_len, args.mtp));
    if (!out) FailVerb(args.plot + ": cannot write");
  }
  std::fputs((args.json ? plan::PlanToJson(result) : plan::PlanToTable(result, spec)).c_str(),
             stdout);
}

}  // namespace

void AddPlanVerb(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* verb = app.add_subcommand(
      "plan", "Deployment planner: memory fit, roofline time model, Pareto frontier");
  verb->add_option("--model", args->model,
                   "config.json of the model (configs/deepseek-v3.json), or a GGUF")
      ->required();
  verb->add_option("--hardware", args->hardware,
                   "H100, H200, B200, GB200, or a JSON spec file (docs/planner.md)");
  verb->add_option("--calibrate", args->calibrate,
                   "`switchyard bench kernels --json` output measured on the target machine");
  verb->add_option("--kv-len", args->kv_len, "Context tokens per request")
      ->check(CLI::PositiveNumber);
  verb->add_option("--kv-dtype", args->kv_dtype,
                   "Latent cache dtype: bf16, or fp8 (the latent as scaled e4m3, rope bf16)")
      ->check(CLI::IsMember({"bf16", "fp8", "fp8_e4m3"}));
  verb->add_option("--mtp", args->mtp, "MTP draft tokens per step")->check(CLI::Range(0, 1));
  verb->add_option("--acceptance", args->acceptance, "Draft acceptance rate")
      ->check(CLI::Range(0.0, 1.0));
  verb->add_option("--ep", args->ep, "Restrict EP sizes (repeatable)")->check(CLI::PositiveNumber);
  verb->add_option("--expert-imbalance", args->expert_imbalance,
                   "Measured expert imbalance (busiest EP rank's routed rows over the mean "
                   "rank's; `generate --json` under mpirun reports it): MoE layers wait for the "
                   "busiest rank")
      ->check(CLI::Range(1.0, 1e6));
  verb->add_option("--expert-skew", args->expert_skew,
                   "Zipf exponent of the experts' loads (0: balanced): each EP size gets the "
                   "fewest redundant experts whose balanced imbalance meets --imbalance-target")
      ->check(CLI::Range(0.0, 10.0));
  verb->add_option("--imbalance-target", args->imbalance_target,
                   "Expert imbalance the redundant experts should reach (default 1.10)")
      ->check(CLI::Range(1.0, 100.0));
  verb->add_flag("--json", args->json, "Print JSON instead of a table");
  verb->add_option("--plot", args->plot, "Write the Pareto figure as SVG");
  verb->callback([args] { RunPlan(*args); });
}

}  // namespace sy
