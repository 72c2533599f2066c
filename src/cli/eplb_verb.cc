// switchyard eplb: a placement of the routed experts (with R redundant replicas) on N ranks from
// a measured expert load (`--record-expert-load`), by DeepSeek's balancing algorithm
// (plan/eplb.h); the file `--expert-placement` reads at start.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/verbs.h"
#include "model/expert_placement.h"
#include "plan/eplb.h"

namespace sy {
namespace {

struct EplbArgs {
  std::string load;
  int ep = 0;
  int nodes = 1;
  int64_t groups = 0;  // 0: the load file's
  int64_t redundant = 0;
  std::string out;
};

std::string SampledExchanges(const ExpertLoad& load) {
  size_t samples = 0;
  for (const auto& layer : load.exchanges)
    samples += layer.size();
  return std::to_string(samples);
}

void RunEplb(const EplbArgs& args) {
  std::ifstream in(args.load);
  if (!in) FailVerb(fmt::format("--load {}: cannot read", args.load));
  std::stringstream text;
  text << in.rdbuf();
  auto load = ParseExpertLoad(text.str(), args.load);
  if (!load.ok()) FailVerb(load.status().message());
  EplbOptions options;
  options.ranks = args.ep;
  options.nodes = args.nodes;
  options.redundant = args.redundant;
  options.groups = args.groups > 0 ? args.groups : load->groups;
  auto placement = RebalanceExperts(load.value(), options);
  if (!placement.ok()) FailVerb(placement.status().message());
  std::ofstream out(args.out);
  out << ExpertPlacementToJson(placement.value());
  if (!out.good()) FailVerb(fmt::format("--out {}: cannot write", args.out));

  // What it buys, predicted from the same load (each expert's tokens split evenly over its
  // replicas): against the contiguous placement where E divides over the ranks.
  std::printf(
      "%s policy (%lld expert groups over %d node(s)); %lld slots per rank, %lld "
      "redundant; %zu layers\n",
      UsesHierarchicalPolicy(options) ? "hierarchical" : "global",
      static_cast<long long>(options.groups), options.nodes,
      static_cast<long long>(placement->slots_per_rank), static_cast<long long>(args.redundant),
      placement->layers.size());
  if (load->experts % args.ep == 0) {
    const ExpertPlacement contiguous = DefaultPlacement(load->layers, load->experts, args.ep, 0);
    std::printf("predicted imbalance (busiest rank / mean): contiguous %.3f, balanced %.3f\n",
                PredictedImbalance(contiguous, load.value()),
                PredictedImbalance(placement.value(), load.value()));
  } else {
    std::printf("predicted imbalance (busiest rank / mean): balanced %.3f\n",
                PredictedImbalance(placement.value(), load.value()));
  }
  // What the measured imbalance counts: each exchange's busiest rank (the recording's samples),
  // with the default dispatch (replicas least loaded first) and with an even share per replica.
  if (auto balanced = PredictedExchangeImbalance(placement.value(), load.value())) {
    const double even =
        *PredictedExchangeImbalance(placement.value(), load.value(), ReplicaShare::kEven);
    if (load->experts % args.ep == 0)
      std::printf(
          "per exchange (%s sampled): contiguous %.3f, balanced %.3f (%.3f with an even "
          "share per replica)\n",
          SampledExchanges(load.value()).c_str(),
          *PredictedExchangeImbalance(DefaultPlacement(load->layers, load->experts, args.ep, 0),
                                      load.value()),
          *balanced, even);
    else
      std::printf(
          "per exchange (%s sampled): balanced %.3f (%.3f with an even share per "
          "replica)\n",
          SampledExchanges(load.value()).c_str(), *balanced, even);
  }
  std::printf("wrote %s\n", args.out.c_str());
}

}  // namespace

void AddEplbVerb(CLI::App& app) {
  auto args = std::make_shared<EplbArgs>();
  CLI::App* verb = app.add_subcommand(
      "eplb", "Balance routed experts over EP ranks from a measured load (DeepSeek's EPLB)");
  verb->add_option("--load", args->load, "Expert load JSON from --record-expert-load")->required();
  verb->add_option("--ep", args->ep, "Expert-parallel ranks N")
      ->required()
      ->check(CLI::PositiveNumber);
  verb->add_option("--nodes", args->nodes,
                   "Hosts the ranks span (consecutive ranks per host): expert groups are packed "
                   "onto hosts first when they divide evenly (the hierarchical policy)")
      ->check(CLI::PositiveNumber);
  verb->add_option("--groups", args->groups,
                   "Expert groups of the router (default: the load file's, the model's n_group)")
      ->check(CLI::PositiveNumber);
  verb->add_option("--num-redundant-experts", args->redundant,
                   "R replicas beyond the E experts; E + R must divide by --ep")
      ->check(CLI::NonNegativeNumber);
  verb->add_option("--out", args->out, "Placement JSON to write (for --expert-placement)")
      ->required();
  verb->callback([args] { RunEplb(*args); });
}

}  // namespace sy
