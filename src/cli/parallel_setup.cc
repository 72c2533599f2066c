#include "cli/parallel_setup.h"

#include <cstdio>
#include <fstream>

#include "cli/verbs.h"
#include "serve/metrics.h"

namespace sy {

void FailEverywhere(Communicator& comm, const std::string& message) {
  if (comm.size() == 1) FailVerb(message);
  // Every rank reached the same conclusion from the same inputs: exit together, no abort needed.
  if (comm.rank() == 0) std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  comm.AllReduceMax(0);  // nobody leaves while a peer still waits in a collective
  throw CLI::RuntimeError(1);
}

void AddParallelOptions(CLI::App* verb, ParallelArgs& args) {
  verb->add_option("--wire-dtype", args.wire_dtype,
                   "Row format between expert-parallel ranks: bf16, f32, or fp8 (dispatch in e4m3 "
                   "with a scale per 128 values, combine in bf16)")
      ->check(CLI::IsMember({"bf16", "f32", "fp8"}));
  verb->add_option("--tp", args.tp,
                   "Tensor-parallel ranks per DP group: attention heads split, EP = ranks")
      ->check(CLI::PositiveNumber);
  verb->add_option("--overlap", args.overlap,
                   "Communication overlap: none; dispatch (shared expert between dispatch send and "
                   "receive); microbatch (two halves whose exchanges interleave)")
      ->check(CLI::IsMember({"none", "dispatch", "microbatch"}));
  verb->add_option("--attention-split", args.attention_split,
                   "With --tp: heads (every rank holds the group's tokens, heads split, o_proj "
                   "all-reduced) or sp-tp-sp (tokens spread over the group, q and outputs "
                   "exchanged, TP over heads; the prefill recipe for few or long requests)")
      ->check(CLI::IsMember({"heads", "sp-tp-sp"}));
  verb->add_option("--progress-thread", args.progress_thread,
                   "A thread advancing started exchanges while compute runs")
      ->check(CLI::IsMember({"on", "off"}));
  verb->add_option("--num-redundant-experts", args.redundant_experts,
                   "Under mpirun: R extra physical experts, each rank holding (E + R) / N; without "
                   "--expert-placement the extra slots replicate experts 0, 1, ...")
      ->check(CLI::NonNegativeNumber);
  verb->add_option("--replica-dispatch", args.replica_dispatch,
                   "Under mpirun, with redundant experts: balanced (the default: per exchange, "
                   "to the replica on the rank this rank has sent the fewest rows so far), "
                   "own-rank (the replica on the token's rank where there is one: fewer bytes on "
                   "the wire) or spread (every replica an even share of its expert's tokens)")
      ->check(CLI::IsMember({"own-rank", "spread", "balanced"}));
  verb->add_option("--expert-placement", args.expert_placement,
                   "Under mpirun: the logical experts in each rank's slots per MoE layer, a JSON "
                   "file from `switchyard eplb` (default: contiguous ranges)");
  verb->add_option("--eplb-interval", args.eplb_interval,
                   "Under mpirun: every this many steps, balance the experts anew from the "
                   "window's measured load (DeepSeek's EPLB, --num-redundant-experts R) and load "
                   "the experts that move on every rank; outputs do not change")
      ->check(CLI::NonNegativeNumber);
  verb->add_option("--eplb-min-gain", args.eplb_min_gain,
                   "With --eplb-interval: move to a new placement only when it lowers the "
                   "predicted per-exchange imbalance by at least this much (negative: always)")
      ->capture_default_str();
  // The server's windowed recording rides along here; generate records its whole run itself.
  if (verb->get_name() == "serve") AddExpertLoadWindowOptions(verb, args);
}

void AddExpertLoadWindowOptions(CLI::App* verb, ParallelArgs& args) {
  verb->add_option("--record-expert-load", args.expert_load_file,
                   "Write each window's routed tokens per MoE layer and expert (all ranks, "
                   "summed) to this JSON file, the input of `switchyard eplb`; under mpirun "
                   "/metrics then reports switchyard:expert_imbalance");
  verb->add_option("--expert-load-window", args.expert_load_window,
                   "Steps per expert-load window (with --record-expert-load)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
}

namespace {

// Each window's load replaces the file (written aside, then renamed, so a reader never sees
// half of one), and under mpirun its imbalance goes to /metrics.
void WriteExpertLoadWindows(ParallelRun& run, const std::string& path, int64_t steps) {
  RecordExpertLoadWindows(run, steps, [path](const ExpertLoad& load) {
    {
      std::ofstream out(path + ".tmp");
      out << ExpertLoadToJson(load);
    }
    if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0)
      std::fprintf(stderr, "switchyard: --record-expert-load %s: cannot write\n", path.c_str());
    if (!load.imbalance) return;
    std::vector<std::pair<int64_t, double>> per_layer;
    for (size_t l = 0; l < load.layer_imbalance.size(); ++l)
      per_layer.emplace_back(load.layers[l], load.layer_imbalance[l]);
    serve::PublishExpertImbalance(*load.imbalance, std::move(per_layer));
  });
}

}  // namespace

ParallelRun LoadParallel(const std::string& directory, const ParallelArgs& args) {
  ParallelArgs options = args;
  if (!args.expert_load_file.empty()) options.record_expert_load = true;
  auto run = LoadParallelRun(directory, options);
  if (!run.ok()) FailVerb(run.status().message());
  if (!args.expert_load_file.empty())  // with rebalancing, its windows are the load's
    WriteExpertLoadWindows(run.value(), args.expert_load_file,
                           args.eplb_interval > 0 ? args.eplb_interval : args.expert_load_window);
  return std::move(run).value();
}

}  // namespace sy
