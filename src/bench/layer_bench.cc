#include "bench/layer_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "base/clock.h"
#include "bench/random_weights.h"
#include "kernels/cpu/elementwise.h"
#include "model/decoder_schedule.h"
#include "model/feed_forward.h"
#include "model/latent_cache.h"
#include "model/mla.h"
#include "model/rope.h"
#include "model/synthetic.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace sy::bench {
namespace {

FeedForwardWeights RandomFeedForward(int64_t width, int64_t hidden, uint64_t seed) {
  return {RandomPackedMatrix(DType::kF8E4M3, width, hidden, seed),
          RandomPackedMatrix(DType::kF8E4M3, width, hidden, seed + 1),
          RandomPackedMatrix(DType::kF8E4M3, hidden, width, seed + 2)};
}

// One MoE decoder layer of DeepSeek-V3 holding routed experts [0, local_experts).
DecoderLayerWeights RandomMoeLayer(const ModelConfig& c, int64_t local_experts, uint64_t seed) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  DecoderLayerWeights w;
  AttentionWeights& a = w.self_attn;
  a.input_layernorm.assign(static_cast<size_t>(D), 1.0f);
  a.q_a_proj = RandomPackedMatrix(DType::kF8E4M3, *c.q_lora_rank, D, seed + 1);
  a.q_a_layernorm.assign(static_cast<size_t>(*c.q_lora_rank), 1.0f);
  a.q_b_proj = RandomPackedMatrix(DType::kF8E4M3, H * c.qk_head_dim(), *c.q_lora_rank, seed + 2);
  a.kv_a_proj_with_mqa = RandomPackedMatrix(DType::kF8E4M3, c.latent_cache_width(), D, seed + 3);
  a.kv_a_layernorm.assign(static_cast<size_t>(c.kv_lora_rank), 1.0f);
  for (int64_t h = 0; h < H; ++h) {  // the absorbed per-head matrices, as PackWeights makes them
    a.w_uk_t.push_back(
        RandomPackedMatrix(DType::kF32, c.kv_lora_rank, c.qk_nope_head_dim, seed + 100 + h));
    a.w_uv.push_back(RandomPackedMatrix(DType::kF32, c.v_head_dim, c.kv_lora_rank, seed + 400 + h));
  }
  a.o_proj = RandomPackedMatrix(DType::kF8E4M3, D, H * c.v_head_dim, seed + 4);
  w.post_attention_layernorm.assign(static_cast<size_t>(D), 1.0f);
  w.is_moe = true;
  w.moe.gate = RandomPackedMatrix(DType::kBF16, c.n_routed_experts, D, seed + 5);
  w.moe.e_score_correction_bias.assign(static_cast<size_t>(c.n_routed_experts), 0.01f);
  w.moe.experts.resize(static_cast<size_t>(c.n_routed_experts));
  for (int64_t e = 0; e < local_experts; ++e)
    w.moe.experts[e] = RandomFeedForward(c.moe_intermediate_size, D, seed + 1000 + 3 * e);
  w.moe.shared_experts = RandomFeedForward(c.shared_expert_width(), D, seed + 6);
  return w;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One process standing in for one EP rank: the routed slots land on its own experts, as the
// dispatch from all EP ranks delivers them on average (tokens × top-k per rank).
class OneRankShareMoe final : public WholeLayerMoe {
 public:
  explicit OneRankShareMoe(int64_t local_experts) : local_(local_experts) {}
  void Run(const ModelConfig& c, const MoeWeights& w, int64_t, const float* x, int64_t tokens,
           float* out) override {
    if (tokens == 0) return;
    const int64_t D = c.hidden_size;
    ExpertRouting routing = RouteTokens(c, w, x, tokens);
    {
      ScopedStage router(Stage::kRouter);
      for (int32_t& e : routing.expert_ids)
        e %= static_cast<int32_t>(local_);
      SortByExpert(routing, c.n_routed_experts);
    }
    std::vector<float> expert_rows(static_cast<size_t>(tokens * routing.top_k * D)),
        shared(static_cast<size_t>(tokens * D));
    RunExperts(w, routing, x, D, expert_rows.data());
    FeedForward(w.shared_experts, x, tokens, shared.data());
    FinalizeRouting(routing, expert_rows.data(), shared.data(), D, out);
    active_ = 0;
    for (int64_t e = 0; e < local_; ++e)
      active_ += routing.expert_offsets[e + 1] > routing.expert_offsets[e];
  }
  double active() const { return active_; }

 private:
  int64_t local_;
  double active_ = 0;
};

OverlapMode ParseOverlap(const std::string& name) {
  return name == "dispatch"     ? OverlapMode::kDispatch
         : name == "microbatch" ? OverlapMode::kMicrobatch
                                : OverlapMode::kNone;
}

}  // namespace

std::vector<LayerResult> BenchLayer(const LayerBenchOptions& options) {
  Communicator& comm = WorldCommunicator();
  ModelConfig c = DeepSeekV3Config();
  const int64_t D = c.hidden_size, local_experts = c.n_routed_experts / options.ep;
  const int64_t L = std::max(1, options.layers);
  if (comm.size() > 1) {
    // The experts of the N real ranks form the whole MoE: rank r holds experts
    // [r·local, (r+1)·local) of N·local, and top-8 routing picks among them.
    c.n_routed_experts = comm.size() * local_experts;
    c.n_group = std::min<int64_t>(c.n_group, c.n_routed_experts / 2);
    c.topk_group = std::max<int64_t>(1, c.n_group / 2);
    c.num_experts_per_tok =
        std::min<int64_t>(c.num_experts_per_tok, c.topk_group * (c.n_routed_experts / c.n_group));
  }
  c.num_hidden_layers = L;
  const RopeParams rope = ComputeRopeParams(c);
  std::vector<DecoderLayerWeights> layers;
  for (int64_t l = 0; l < L; ++l) {
    layers.push_back(RandomMoeLayer(c, local_experts, 10000 * static_cast<uint64_t>(l)));
    if (comm.size() > 1) {  // move this rank's experts to their global slots
      std::vector<FeedForwardWeights> placed(static_cast<size_t>(c.n_routed_experts));
      for (int64_t e = 0; e < local_experts; ++e)
        placed[comm.rank() * local_experts + e] = layers[l].moe.experts[e];
      layers[l].moe.experts = std::move(placed);
    }
  }
  // One executor per mode, all present at once so the modes alternate batch by batch.
  std::vector<std::unique_ptr<ExpertParallelMoe>> exchanges;
  OneRankShareMoe one_rank(local_experts);
  for (const std::string& mode : options.overlaps)
    exchanges.push_back(comm.size() > 1 ? std::make_unique<ExpertParallelMoe>(comm, c, DType::kBF16,
                                                                              ParseOverlap(mode))
                                        : nullptr);

  // A latent cache holding kv_len rows per layer for each of the largest batch's requests.
  const int64_t max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  const int64_t max_query =
      *std::max_element(options.query_lengths.begin(), options.query_lengths.end());
  const int64_t page = 64, per_request = (options.kv_len + max_query + page - 1) / page;
  LatentCache cache(L, c.latent_cache_width(), page, max_batch * per_request, DType::kBF16);
  std::vector<SequenceCache> sequences(static_cast<size_t>(max_batch));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> row(static_cast<size_t>(c.latent_cache_width()));
  for (auto& s : sequences) {
    (void)cache.Reserve(s, options.kv_len);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t p = 0; p < options.kv_len; ++p) {
        for (size_t i = 0; i < row.size(); i += 37)
          row[i] = normal(rng);  // varied, cheaply
        cache.Write(l, s, p, row.data());
      }
  }
  std::vector<const DecoderLayerWeights*> layer_table;
  for (const auto& layer : layers)
    layer_table.push_back(&layer);
  const DecoderContext context{&c, &c, &rope, &layer_table, &cache};

  std::vector<LayerResult> results;
  for (int64_t q : options.query_lengths) {
    for (int64_t batch : options.batches) {
      const int64_t T = batch * q;
      ForwardBatch step;
      std::vector<int32_t> ids(static_cast<size_t>(q), 7);
      for (int64_t b = 0; b < batch; ++b)
        step.Add(ids.data(), q, &sequences[b]);
      for (auto& s : step.sequences)
        s.start_position = options.kv_len;  // the cache holds kv_len tokens before the step
      std::vector<float> input(static_cast<size_t>(T * D)), hidden(input.size());
      for (float& v : input)
        v = normal(rng);
      const size_t modes = options.overlaps.size();
      std::vector<std::vector<StageTimes>> runs(modes);
      std::vector<std::vector<double>> totals(modes);
      std::vector<double> bytes(modes, 0), active(modes, 0);
      for (int r = 0; r <= options.repetitions; ++r) {  // run 0 warms up
        for (size_t m = 0; m < modes; ++m) {            // the modes alternate
          ForwardOptions forward;
          forward.moe = exchanges[m] ? static_cast<MoeExecutor*>(exchanges[m].get()) : &one_rank;
          forward.micro_batches = options.overlaps[m] == "microbatch";
          std::vector<MicroBatch> parts = SplitBatch(step, forward.micro_batches ? 2 : 1, 1, 0);
          hidden = input;
          parts[0].hidden = hidden.data();
          if (parts.size() == 2) parts[1].hidden = hidden.data() + parts[0].rows * D;
          for (int64_t b = 0; b < batch; ++b)
            (void)cache.Reserve(sequences[b], options.kv_len + q);
          const int64_t bytes_before = exchanges[m] ? exchanges[m]->remote_bytes_sent() : 0;
          comm.AllReduceMax(0);  // start together
          StageTimes times;
          CurrentStageTimes() = &times;
          const double start = NowSeconds();
          RunDecoderLayers(context, forward, parts, 0, L);
          const double total = NowSeconds() - start;
          CurrentStageTimes() = nullptr;
          double staged = 0;
          for (double s : times.seconds)
            staged += s;
          times[Stage::kOther] = total - staged;
          if (r > 0) {
            runs[m].push_back(times);
            totals[m].push_back(total);
          }
          if (exchanges[m]) {
            bytes[m] = static_cast<double>(exchanges[m]->remote_bytes_sent() - bytes_before) / L;
            active[m] = static_cast<double>(local_experts);
          } else {
            active[m] = one_rank.active();
          }
          for (int64_t b = 0; b < batch; ++b)
            cache.Truncate(sequences[b], options.kv_len);
        }
      }
      for (size_t m = 0; m < modes; ++m) {
        LayerResult result;
        result.overlap = options.overlaps[m];
        result.batch = batch;
        result.query_len = q;
        result.total = Median(totals[m]) / static_cast<double>(L);
        result.experts_active = active[m];
        result.ranks = comm.size();
        result.remote_bytes = bytes[m];
        for (size_t s = 0; s < result.stages.seconds.size(); ++s) {
          std::vector<double> values;
          for (const auto& run : runs[m])
            values.push_back(run.seconds[s]);
          result.stages.seconds[s] = Median(values) / static_cast<double>(L);
        }
        results.push_back(result);
      }
    }
  }
  return results;
}

std::string LayerResultsTable(const LayerBenchOptions& options,
                              const std::vector<LayerResult>& results) {
  const int ranks = results.empty() ? 1 : results[0].ranks;
  std::string out = fmt::format(
      "DeepSeek-V3 MoE layers, EP{} rank ({} local experts), KV {} tokens per request, bf16 "
      "latent cache; µs per layer (median of {}, {} layers per run)\n",
      options.ep, 256 / options.ep, options.kv_len, options.repetitions, options.layers);
  if (ranks > 1)
    out += fmt::format(
        "{} ranks exchanging bf16 rows by dispatch and combine; wire MB/s = bytes sent to other "
        "ranks / (dispatch + combine time), a lower bound (it includes waiting for peers)\n",
        ranks);
  out += fmt::format(
      "{:>10} {:>6} {:>3} {:>10} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8} {:>10} {:>8} {:>8}\n",
      "overlap", "batch", "q", "attention", "gemm", "grouped", "router", "dispatch", "combine",
      "other", "total", "experts", "wire MB/s");
  for (const auto& r : results) {
    const double comm = r.stages[Stage::kDispatch] + r.stages[Stage::kCombine];
    out += fmt::format(
        "{:>10} {:>6} {:>3} {:>10.0f} {:>9.0f} {:>9.0f} {:>8.0f} {:>9.0f} {:>9.0f} {:>8.0f} "
        "{:>10.0f} {:>8.0f} {:>8.0f}\n",
        r.overlap, r.batch, r.query_len, r.stages[Stage::kAttention] * 1e6,
        r.stages[Stage::kGemm] * 1e6, r.stages[Stage::kGroupedGemm] * 1e6,
        r.stages[Stage::kRouter] * 1e6, r.stages[Stage::kDispatch] * 1e6,
        r.stages[Stage::kCombine] * 1e6, r.stages[Stage::kOther] * 1e6, r.total * 1e6,
        r.experts_active, comm > 0 ? r.remote_bytes / comm / 1e6 : 0.0);
  }
  if (options.overlaps.size() > 1) {  // each mode beside the first, measured alternately
    out +=
        fmt::format("\nlayer time relative to {} (same run, alternating):\n", options.overlaps[0]);
    out += fmt::format("{:>6} {:>3}", "batch", "q");
    for (const auto& mode : options.overlaps)
      out += fmt::format(" {:>12}", mode);
    out += "\n";
    const size_t modes = options.overlaps.size();
    for (size_t i = 0; i + modes <= results.size(); i += modes) {
      out += fmt::format("{:>6} {:>3}", results[i].batch, results[i].query_len);
      for (size_t m = 0; m < modes; ++m)
        out += fmt::format(" {:>12}", fmt::format("{:.0f} ({:.2f}×)", results[i + m].total * 1e6,
                                                  results[i + m].total / results[i].total));
      out += "\n";
    }
  }
  return out;
}

std::string LayerResultsJson(const LayerBenchOptions& options,
                             const std::vector<LayerResult>& results) {
  nlohmann::json j;
  j["ep"] = options.ep;
  j["kv_len"] = options.kv_len;
  j["layers"] = options.layers;
  j["results"] = nlohmann::json::array();
  for (const auto& r : results)
    j["results"].push_back({{"overlap", r.overlap},
                            {"batch", r.batch},
                            {"query_len", r.query_len},
                            {"total_us", r.total * 1e6},
                            {"attention_us", r.stages[Stage::kAttention] * 1e6},
                            {"gemm_us", r.stages[Stage::kGemm] * 1e6},
                            {"grouped_gemm_us", r.stages[Stage::kGroupedGemm] * 1e6},
                            {"router_us", r.stages[Stage::kRouter] * 1e6},
                            {"other_us", r.stages[Stage::kOther] * 1e6},
                            {"dispatch_us", r.stages[Stage::kDispatch] * 1e6},
                            {"combine_us", r.stages[Stage::kCombine] * 1e6},
                            {"remote_bytes", r.remote_bytes},
                            {"ranks", r.ranks},
                            {"experts_active", r.experts_active}});
  return j.dump(1) + "\n";
}

}  // namespace sy::bench
