#include "parallel/parallel_run.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "model/gguf_model.h"

namespace sy {

static double ResidentMegabytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * sysconf(_SC_PAGESIZE) / 1e6;
}

Result<ParallelRun> LoadParallelRun(const std::string& directory, const ParallelOptions& args) {
  ParallelRun run;
  run.comm = &WorldCommunicator();
  Communicator& comm = *run.comm;
  const int ranks = comm.size(), rank = comm.rank();
  // Every rank reads the config; a mismatch (a different checkpoint on one rank) shows up in the
  // fingerprint comparison below.
  auto config = IsGgufFile(directory) ? LoadGgufModelConfig(directory)
                                      : LoadModelConfig(directory + "/config.json");
  int64_t local_ok = config.ok() ? 1 : 0;
  std::string reason = config.ok() ? "" : config.status().message();
  if (config.ok() && ranks > 1 && config.value().n_routed_experts % ranks != 0) {
    local_ok = 0;
    reason = fmt::format("{} routed experts cannot be spread evenly over {} ranks",
                         config.value().n_routed_experts, ranks);
  }
  if (ranks % args.tp != 0) {
    local_ok = 0;
    reason = fmt::format("--tp {} does not divide the {} ranks", args.tp, ranks);
  }
  run.tp = local_ok ? args.tp : 1;
  run.dp_group = rank / run.tp;
  WeightLoadOptions options;
  options.tp_rank = rank % run.tp;
  options.tp_size = run.tp;
  run.sequence_parallel = run.tp > 1 && args.attention_split == "sp-tp-sp";
  options.sequence_parallel_attention = run.sequence_parallel;
  run.micro_batches = args.overlap == "microbatch";
  CommunicationOptions().progress_thread = args.progress_thread == "on";
  if (local_ok && ranks > 1) {
    const int64_t local = config.value().n_routed_experts / ranks;
    options.expert_begin = rank * local;
    options.expert_end = (rank + 1) * local;
  }
  if (local_ok) {
    auto model = Model::Load(directory, options);
    if (model.ok()) {
      run.model = std::move(model).value();
    } else {
      local_ok = 0;
      reason = model.status().message();
    }
  }
  if (ranks == 1) {
    if (!local_ok) return Status::Error(reason);
    return run;
  }
  if (comm.AllReduceMax(local_ok ? 0 : 1) != 0)  // end every rank; the one that knows says why
    comm.Abort(local_ok ? "a peer rank failed to load the model" : reason, 1);
  // Same checkpoint and flags everywhere: compare a fingerprint of what shapes the run.
  const ModelConfig& c = run.model->config();
  const std::string fingerprint = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}|{}|{}", ModelConfigToJson(c), args.wire_dtype, args.overlap, args.tp,
      args.attention_split, c.vocab_size, c.hidden_size, c.n_routed_experts, ranks);
  std::vector<uint8_t> mine(fingerprint.begin(), fingerprint.end());
  std::vector<uint8_t> root = comm.Broadcast(mine);
  if (comm.AllReduceMax(root == mine ? 0 : 1) != 0)
    comm.Abort(root != mine ? "this rank's checkpoint or flags differ from rank 0's"
                            : "a peer's checkpoint or flags differ from rank 0's",
               1);
  const OverlapMode overlap = args.overlap == "dispatch"     ? OverlapMode::kDispatch
                              : args.overlap == "microbatch" ? OverlapMode::kMicrobatch
                                                             : OverlapMode::kNone;
  run.moe = std::make_unique<ExpertParallelMoe>(comm, c,
                                                args.wire_dtype == "f32"   ? DType::kF32
                                                : args.wire_dtype == "fp8" ? DType::kF8E4M3
                                                                           : DType::kBF16,
                                                overlap);
  if (run.tp > 1) {
    run.tp_group = comm.Split(run.dp_group);
    run.tp_attention = std::make_unique<TensorParallelAttention>(*run.tp_group);
    run.tp_moe = std::make_unique<TokenShardedMoe>(*run.moe, *run.tp_group);
  }
  std::fprintf(stderr,
               "rank %d of %d: DP group %d, TP rank %d of %d (%lld heads%s), experts [%lld, %lld), "
               "resident %.0f MB\n",
               rank, ranks, run.dp_group, options.tp_rank, run.tp,
               static_cast<long long>(run.model->attention_config().num_attention_heads),
               run.sequence_parallel ? ", SP-TP-SP" : "",
               static_cast<long long>(options.expert_begin),
               static_cast<long long>(options.expert_end), ResidentMegabytes());
  return run;
}

}  // namespace sy
