#include "parallel/parallel_run.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "model/gguf_model.h"
#include "parallel/expert_migration.h"
#include "plan/eplb.h"

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
  if (config.ok() && !IsGgufFile(directory)) {
    if (Status s = ReadGenerationConfig(directory, &config.value()); !s.ok()) config = s;
  }
  int64_t local_ok = config.ok() ? 1 : 0;
  std::string reason = config.ok() ? "" : config.status().message();
  const bool placed =
      !args.expert_placement.empty() || args.redundant_experts > 0 || args.eplb_interval > 0;
  if (config.ok() && ranks == 1 && placed) {
    local_ok = 0;
    reason =
        "--expert-placement, --num-redundant-experts and --eplb-interval need expert parallelism "
        "(mpirun -np N, N > 1)";
  }
  if (config.ok() && ranks > 1 &&
      (config.value().n_routed_experts + args.redundant_experts) % ranks != 0) {
    local_ok = 0;
    reason = args.redundant_experts == 0
                 ? fmt::format("{} routed experts cannot be spread evenly over {} ranks",
                               config.value().n_routed_experts, ranks)
                 : fmt::format(
                       "{} routed experts + {} redundant cannot be spread evenly over {} "
                       "ranks",
                       config.value().n_routed_experts, args.redundant_experts, ranks);
  }
  if (local_ok && ranks > 1 && placed) {
    const ModelConfig& c = config.value();
    const std::vector<int64_t> layers = MoeLayers(c, /*with_mtp=*/true);
    if (args.expert_placement.empty()) {
      run.placement = std::make_unique<ExpertPlacement>(
          DefaultPlacement(layers, c.n_routed_experts, ranks, args.redundant_experts));
    } else if (auto loaded = LoadExpertPlacement(args.expert_placement); !loaded.ok()) {
      local_ok = 0;
      reason = loaded.status().message();
    } else {
      run.placement = std::make_unique<ExpertPlacement>(std::move(loaded).value());
      // The MTP blocks may be left out: a checkpoint may ship without them (then LoadWeights
      // names a missing one).
      Status fits = CheckPlacement(*run.placement, MoeLayers(c, /*with_mtp=*/false),
                                   c.n_routed_experts, ranks, args.redundant_experts, layers);
      if (!fits.ok()) {
        local_ok = 0;
        reason = fmt::format("--expert-placement {}: {}", args.expert_placement, fits.message());
      }
    }
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
  if (local_ok && ranks > 1 && run.placement) {
    options.placement = run.placement.get();
    options.placement_rank = rank;
  } else if (local_ok && ranks > 1) {
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
  run.rebalance = local_ok && args.eplb_interval > 0;
  run.eplb_min_gain = args.eplb_min_gain;
  if (local_ok && (args.record_expert_load || run.rebalance)) {
    const ModelConfig& c = run.model->config();
    run.load = std::make_unique<ExpertLoadRecorder>(MoeLayers(c, run.model->has_mtp()),
                                                    c.n_routed_experts, c.num_experts_per_tok);
  }
  if (ranks == 1) {
    if (!local_ok) return Status::Error(reason);
    if (run.load) {
      run.local_moe = std::make_unique<LocalMoe>();
      run.local_moe->set_load_recorder(run.load.get());
    }
    return run;
  }
  if (comm.AllReduceMax(local_ok ? 0 : 1) != 0)  // end every rank; the one that knows says why
    comm.Abort(local_ok ? "a peer rank failed to load the model" : reason, 1);
  // Same checkpoint and flags everywhere: compare a fingerprint of what shapes the run.
  const ModelConfig& c = run.model->config();
  const std::string fingerprint = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", ModelConfigToJson(c), args.wire_dtype, args.overlap,
      args.tp, args.attention_split, c.vocab_size, c.hidden_size, c.n_routed_experts, ranks,
      run.placement ? ExpertPlacementToJson(*run.placement) : "contiguous", args.record_expert_load,
      args.replica_dispatch);
  std::vector<uint8_t> mine(fingerprint.begin(), fingerprint.end());
  std::vector<uint8_t> root = comm.Broadcast(mine);
  if (comm.AllReduceMax(root == mine ? 0 : 1) != 0)
    comm.Abort(root != mine ? "this rank's checkpoint or flags differ from rank 0's"
                            : "a peer's checkpoint or flags differ from rank 0's",
               1);
  const OverlapMode overlap = args.overlap == "dispatch"     ? OverlapMode::kDispatch
                              : args.overlap == "microbatch" ? OverlapMode::kMicrobatch
                                                             : OverlapMode::kNone;
  run.moe = std::make_unique<ExpertParallelMoe>(
      comm, c,
      args.wire_dtype == "f32"   ? DType::kF32
      : args.wire_dtype == "fp8" ? DType::kF8E4M3
                                 : DType::kBF16,
      overlap, run.placement.get(),
      args.replica_dispatch == "spread"     ? ReplicaDispatch::kSpread
      : args.replica_dispatch == "balanced" ? ReplicaDispatch::kBalanced
                                            : ReplicaDispatch::kOwnRank);
  run.moe->set_load_recorder(run.load.get());
  if (run.rebalance) RecordExpertLoadWindows(run, args.eplb_interval, nullptr);
  if (run.tp > 1) {
    run.tp_group = comm.Split(run.dp_group);
    run.tp_attention = std::make_unique<TensorParallelAttention>(*run.tp_group);
    run.tp_moe = std::make_unique<TokenShardedMoe>(*run.moe, *run.tp_group);
  }
  std::string experts = fmt::format("experts [{}, {})", options.expert_begin, options.expert_end);
  if (run.placement) {
    const std::vector<int32_t>& first = run.placement->physical.front();
    const std::vector<int32_t> held = HeldExperts(first, run.placement->slots_per_rank, rank);
    experts = fmt::format("{} expert slots ({} redundant in all; layer {}: {})",
                          run.placement->slots_per_rank, run.placement->redundant(),
                          run.placement->layers.front(), fmt::join(held, " "));
  }
  std::fprintf(stderr,
               "rank %d of %d: DP group %d, TP rank %d of %d (%lld heads%s), %s, resident %.0f "
               "MB\n",
               rank, ranks, run.dp_group, options.tp_rank, run.tp,
               static_cast<long long>(run.model->attention_config().num_attention_heads),
               run.sequence_parallel ? ", SP-TP-SP" : "", experts.c_str(), ResidentMegabytes());
  return run;
}

std::vector<int64_t> MoeLayers(const ModelConfig& c, bool with_mtp) {
  std::vector<int64_t> layers;
  const int64_t count = c.num_hidden_layers + (with_mtp ? c.num_nextn_predict_layers : 0);
  for (int64_t l = 0; l < count; ++l)
    if (c.IsMoeLayer(l)) layers.push_back(l);
  return layers;
}

ExpertLoad GatherExpertLoad(const ParallelRun& run) {
  ExpertLoad load = GatherExpertLoad(*run.comm, *run.load, run.model->config().n_group);
  // The recorder holds only what came after the last window: add the windows before it.
  if (load.imbalance && run.closed_windows && run.closed_windows->second > 0) {
    load.busiest_rows += run.closed_windows->first;
    load.mean_rows += run.closed_windows->second;
    load.imbalance = load.mean_rows > 0 ? load.busiest_rows / load.mean_rows : 1.0;
  }
  return load;
}

ExpertLoad GatherExpertLoad(Communicator& comm, const ExpertLoadRecorder& recorder,
                            int64_t groups) {
  ExpertLoad load = recorder.Snapshot();
  load.groups = std::max<int64_t>(1, groups);
  std::vector<int64_t> rows;
  std::vector<int32_t> exchange_layer;
  recorder.Exchanges(&rows, &exchange_layer);
  // The sampled exchanges (the same ones on every rank, ExpertLoadRecorder) are summed by an
  // all-reduce rather than gathered: up to layers × 128 × E counts a rank, which root must not
  // hold N times over. Floats add them exactly: one exchange's count for one expert stays far
  // below 2^24.
  int64_t sampled = 0;
  for (const auto& samples : load.exchanges)
    sampled += static_cast<int64_t>(samples.size()) * load.experts;
  if (comm.AllReduceMax(sampled) != comm.AllReduceSum(sampled) / comm.size())
    comm.Abort("ranks sampled different expert-parallel exchanges", 1);
  std::vector<float> sample_sums;
  sample_sums.reserve(static_cast<size_t>(sampled));
  for (const auto& samples : load.exchanges)
    for (const auto& sample : samples)
      sample_sums.insert(sample_sums.end(), sample.begin(), sample.end());
  comm.AllReduceSumFloats(sample_sums.data(), sampled);
  // Each rank sends: tokens, exchange count, counts [layers × E], exchange rows.
  std::vector<int64_t> mine = {load.tokens, static_cast<int64_t>(rows.size())};
  for (const auto& counts : load.counts)
    mine.insert(mine.end(), counts.begin(), counts.end());
  mine.insert(mine.end(), rows.begin(), rows.end());
  std::vector<uint8_t> bytes(mine.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  const int64_t words = static_cast<int64_t>(mine.size());
  // Every rank made the same exchanges, so every rank sends the same number of words.
  if (comm.AllReduceMax(words) != comm.AllReduceSum(words) / comm.size())
    comm.Abort("ranks recorded different numbers of expert-parallel exchanges", 1);
  std::vector<uint8_t> all = comm.GatherToRoot(bytes);
  if (comm.rank() != 0) return {};
  load.ranks = comm.size();
  load.tokens = 0;
  for (auto& counts : load.counts)
    std::fill(counts.begin(), counts.end(), 0);
  const float* sum = sample_sums.data();
  for (auto& samples : load.exchanges)
    for (auto& sample : samples)
      for (auto& c : sample)
        c = static_cast<int64_t>(*sum++);
  std::vector<std::vector<int64_t>> per_rank_rows;
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* w = reinterpret_cast<const int64_t*>(all.data()) + r * words;
    load.tokens += w[0];
    const int64_t exchanges = w[1];
    const int64_t* counts = w + 2;
    for (auto& layer : load.counts)
      for (auto& c : layer)
        c += *counts++;
    per_rank_rows.emplace_back(counts, counts + exchanges);
  }
  if (comm.size() > 1) {
    std::pair<double, double> sums;
    load.imbalance = ImbalanceOverExchanges(per_rank_rows, exchange_layer, &load.layer_imbalance,
                                            load.layers.size(), &sums);
    load.busiest_rows = sums.first;
    load.mean_rows = sums.second;
  }
  return load;
}

}  // namespace sy

namespace sy {

// Online rebalancing's state between windows: the move in progress, if any.
struct OnlineRebalance {
  std::unique_ptr<ExpertMigration> migration;
  // Step times while no expert moves, since the last move began: what a step costs without a
  // move, beside the longest step during one.
  std::vector<double> quiet_steps;
  std::chrono::steady_clock::time_point last_step;
  double quiet_median = 0;
  // The least predicted fall in the imbalance a new placement must bring (ParallelOptions).
  double min_gain = 0;
};

namespace {

// Rank 0 balances the window's load (the run's N and R) and every rank starts moving the experts
// its new slots need (parallel/expert_migration.h); the layers switch at later step boundaries.
// Collective.
void StartRebalance(Communicator& comm, const ExpertLoad& load, int64_t groups, Model& model,
                    ExpertParallelMoe& moe, ExpertPlacement& placement, OnlineRebalance& state) {
  std::string text;
  double before = 0, after = 0;
  if (comm.rank() == 0) {
    EplbOptions options;
    options.ranks = comm.size();
    options.redundant = placement.redundant();
    options.groups = std::max<int64_t>(1, groups);
    if (load.experts % options.groups != 0) options.groups = 1;
    auto next = RebalanceExperts(load, options);
    if (next.ok()) {
      // The balancer numbers its ranks afresh; renamed, they keep what they hold where they can.
      next = KeepHeldExperts(next.value(), placement, options.nodes);
      // Judged on the sampled exchanges (what the measured imbalance counts) where there are
      // some: a new placement that the samples say gains less than the margin is noise from
      // one window, and moving to it costs a slower step for nothing.
      const auto sampled_before = PredictedExchangeImbalance(placement, load);
      const auto sampled_after = PredictedExchangeImbalance(next.value(), load);
      before = sampled_before.value_or(PredictedImbalance(placement, load));
      after = sampled_after.value_or(PredictedImbalance(next.value(), load));
      if (before - after >= state.min_gain) {
        text = ExpertPlacementToJson(next.value());
      } else {
        std::fprintf(stderr,
                     "switchyard: experts kept after %lld steps: predicted imbalance %.3f -> "
                     "%.3f gains less than %.2f (measured %.3f)\n",
                     static_cast<long long>(load.steps), before, after, state.min_gain,
                     load.imbalance.value_or(1.0));
      }
    } else {
      std::fprintf(stderr, "switchyard: experts not rebalanced: %s\n",
                   next.status().message().c_str());
    }
  }
  const std::vector<uint8_t> bytes = comm.Broadcast(std::vector<uint8_t>(text.begin(), text.end()));
  if (bytes.empty()) return;
  auto next = ParseExpertPlacement(std::string(bytes.begin(), bytes.end()), "rebalanced placement");
  if (comm.AllReduceMax(next.ok() ? 0 : 1) != 0)
    comm.Abort(next.ok() ? "a peer rank could not read the rebalanced placement"
                         : "rebalancing experts: " + next.status().message(),
               1);
  if (comm.rank() == 0)
    std::fprintf(stderr,
                 "switchyard: experts rebalanced after %lld steps: predicted imbalance %.3f -> "
                 "%.3f (measured %.3f); moving them\n",
                 static_cast<long long>(load.steps), before, after, load.imbalance.value_or(1.0));
  ExpertMigration::Options options;
  const char* verify = std::getenv("SWITCHYARD_VERIFY_EXPERT_MOVES");
  options.verify = verify != nullptr && std::string(verify) == "1";
  const char* inline_moves = std::getenv("SWITCHYARD_EXPERT_MOVES");
  options.background = !(inline_moves != nullptr && std::string(inline_moves) == "inline");
  options.step_began = state.last_step;
  std::vector<double>& quiet = state.quiet_steps;
  if (!quiet.empty()) {
    std::nth_element(quiet.begin(), quiet.begin() + quiet.size() / 2, quiet.end());
    state.quiet_median = quiet[quiet.size() / 2];
  }
  quiet.clear();
  state.migration = std::make_unique<ExpertMigration>(comm, model, moe, placement,
                                                      std::move(next).value(), options);
}

// At a step's start while a move is in progress: switch what has arrived everywhere; at the
// end, report what the move cost (rank 0, totals over the ranks).
void ContinueRebalance(Communicator& comm, OnlineRebalance& state) {
  const auto now = std::chrono::steady_clock::now();
  if (state.migration == nullptr && state.last_step != decltype(now){})
    state.quiet_steps.push_back(std::chrono::duration<double>(now - state.last_step).count());
  state.last_step = now;
  if (state.migration == nullptr || !state.migration->OnStepBegin()) return;
  const ExpertMigration::Report report = state.migration->report();
  const int64_t experts = comm.AllReduceSum(report.experts_received);
  const int64_t bytes = comm.AllReduceSum(report.bytes_received);
  const int64_t longest_us =
      comm.AllReduceMax(static_cast<int64_t>(report.longest_step_seconds * 1e6));
  const int64_t seconds_us = comm.AllReduceMax(static_cast<int64_t>(report.seconds * 1e6));
  if (comm.rank() == 0)
    std::fprintf(stderr,
                 "switchyard: experts moved: %lld experts, %.1f MB over MPI in %.3f s (%lld "
                 "steps while moving, the longest %.1f ms; before the move a step took %.1f ms, "
                 "median)\n",
                 static_cast<long long>(experts), static_cast<double>(bytes) / 1e6,
                 static_cast<double>(seconds_us) / 1e6, static_cast<long long>(report.steps),
                 static_cast<double>(longest_us) / 1e3, state.quiet_median * 1e3);
  state.migration.reset();
}

}  // namespace

void RecordExpertLoadWindows(ParallelRun& run, int64_t steps,
                             std::function<void(const ExpertLoad&)> on_window) {
  Communicator* comm = run.comm;
  ExpertLoadRecorder* recorder = run.load.get();
  const int64_t groups = run.model->config().n_group;
  Model* model = run.rebalance ? run.model.get() : nullptr;
  ExpertParallelMoe* moe = run.moe.get();
  ExpertPlacement* placement = run.placement.get();
  OnlineRebalance* state = nullptr;
  if (model != nullptr) {
    run.online_rebalance = std::make_shared<OnlineRebalance>();
    state = run.online_rebalance.get();
    state->min_gain = run.eplb_min_gain;
    recorder->SetStepBegin([comm, state] { ContinueRebalance(*comm, *state); });
  }
  run.closed_windows = std::make_shared<std::pair<double, double>>(0.0, 0.0);
  std::shared_ptr<std::pair<double, double>> closed = run.closed_windows;
  recorder->SetWindow(steps, [=, on_window = std::move(on_window)] {
    const ExpertLoad load = GatherExpertLoad(*comm, *recorder, groups);
    recorder->Clear();
    closed->first += load.busiest_rows;
    closed->second += load.mean_rows;
    // A window that ends while experts still move keeps the placement being moved to.
    if (model != nullptr && state->migration == nullptr)
      StartRebalance(*comm, load, groups, *model, *moe, *placement, *state);
    if (comm->rank() == 0 && on_window) on_window(load);
  });
}

}  // namespace sy
