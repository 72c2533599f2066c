#include "bench/layer_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "base/clock.h"
#include "bench/random_weights.h"
#include "kernels/cpu/elementwise.h"
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

// One MoE decoder layer of DeepSeek-V3 holding routed experts [0, E / ep).
DecoderLayerWeights RandomMoeLayer(const ModelConfig& c, int64_t local_experts) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  DecoderLayerWeights w;
  AttentionWeights& a = w.self_attn;
  a.input_layernorm.assign(static_cast<size_t>(D), 1.0f);
  a.q_a_proj = RandomPackedMatrix(DType::kF8E4M3, *c.q_lora_rank, D, 1);
  a.q_a_layernorm.assign(static_cast<size_t>(*c.q_lora_rank), 1.0f);
  a.q_b_proj = RandomPackedMatrix(DType::kF8E4M3, H * c.qk_head_dim(), *c.q_lora_rank, 2);
  a.kv_a_proj_with_mqa = RandomPackedMatrix(DType::kF8E4M3, c.latent_cache_width(), D, 3);
  a.kv_a_layernorm.assign(static_cast<size_t>(c.kv_lora_rank), 1.0f);
  for (int64_t h = 0; h < H; ++h) {  // the absorbed per-head matrices, as PackWeights makes them
    a.w_uk_t.push_back(
        RandomPackedMatrix(DType::kF32, c.kv_lora_rank, c.qk_nope_head_dim, 100 + h));
    a.w_uv.push_back(RandomPackedMatrix(DType::kF32, c.v_head_dim, c.kv_lora_rank, 400 + h));
  }
  a.o_proj = RandomPackedMatrix(DType::kF8E4M3, D, H * c.v_head_dim, 4);
  w.post_attention_layernorm.assign(static_cast<size_t>(D), 1.0f);
  w.is_moe = true;
  w.moe.gate = RandomPackedMatrix(DType::kBF16, c.n_routed_experts, D, 5);
  w.moe.e_score_correction_bias.assign(static_cast<size_t>(c.n_routed_experts), 0.01f);
  w.moe.experts.resize(static_cast<size_t>(c.n_routed_experts));
  for (int64_t e = 0; e < local_experts; ++e)
    w.moe.experts[e] = RandomFeedForward(c.moe_intermediate_size, D, 1000 + 3 * e);
  w.moe.shared_experts = RandomFeedForward(c.shared_expert_width(), D, 6);
  return w;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<LayerResult> BenchLayer(const LayerBenchOptions& options) {
  Communicator& comm = WorldCommunicator();
  ModelConfig c = DeepSeekV3Config();
  const RopeParams rope = ComputeRopeParams(c);
  const int64_t D = c.hidden_size, local_experts = c.n_routed_experts / options.ep;
  std::unique_ptr<ExpertParallelMoe> exchange;
  if (comm.size() > 1) {
    // The experts of the N real ranks form the whole MoE: rank r holds experts
    // [r·local, (r+1)·local) of N·local, and top-8 routing picks among them.
    c.n_routed_experts = comm.size() * local_experts;
    c.n_group = std::min<int64_t>(c.n_group, c.n_routed_experts / 2);
    c.topk_group = std::max<int64_t>(1, c.n_group / 2);
    c.num_experts_per_tok =
        std::min<int64_t>(c.num_experts_per_tok, c.topk_group * (c.n_routed_experts / c.n_group));
    const OverlapMode mode = options.overlap == "dispatch"     ? OverlapMode::kDispatch
                             : options.overlap == "microbatch" ? OverlapMode::kMicrobatch
                                                               : OverlapMode::kNone;
    exchange = std::make_unique<ExpertParallelMoe>(comm, c, DType::kBF16, mode);
  }
  DecoderLayerWeights layer = RandomMoeLayer(c, local_experts);
  if (comm.size() > 1) {  // move this rank's experts to their global slots
    std::vector<FeedForwardWeights> placed(static_cast<size_t>(c.n_routed_experts));
    for (int64_t e = 0; e < local_experts; ++e)
      placed[comm.rank() * local_experts + e] = layer.moe.experts[e];
    layer.moe.experts = std::move(placed);
  }

  // A latent cache holding kv_len rows for each of the largest batch's requests.
  const int64_t max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  const int64_t max_query =
      *std::max_element(options.query_lengths.begin(), options.query_lengths.end());
  const int64_t page = 64, per_request = (options.kv_len + max_query + page - 1) / page;
  LatentCache cache(1, c.latent_cache_width(), page, max_batch * per_request, DType::kBF16);
  std::vector<SequenceCache> sequences(static_cast<size_t>(max_batch));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> row(static_cast<size_t>(c.latent_cache_width()));
  for (auto& s : sequences) {
    (void)cache.Reserve(s, options.kv_len);
    for (int64_t p = 0; p < options.kv_len; ++p) {
      for (size_t i = 0; i < row.size(); i += 37)
        row[i] = normal(rng);  // varied, cheaply
      cache.Write(0, s, p, row.data());
    }
  }

  std::vector<LayerResult> results;
  for (int64_t q : options.query_lengths) {
    for (int64_t batch : options.batches) {
      const int64_t T = batch * q;
      ForwardBatch step;
      std::vector<int32_t> ids(static_cast<size_t>(q), 7);
      std::vector<int64_t> positions;
      for (int64_t b = 0; b < batch; ++b) {
        step.Add(ids.data(), q, &sequences[b]);
        for (int64_t i = 0; i < q; ++i)
          positions.push_back(options.kv_len + i);
      }
      std::vector<float> hidden(static_cast<size_t>(T * D)), normed(hidden.size()),
          delta(hidden.size());
      for (float& v : hidden)
        v = normal(rng);
      std::vector<StageTimes> runs;
      std::vector<double> totals;
      double active = 0;
      for (int r = 0; r <= options.repetitions; ++r) {  // run 0 warms up
        for (int64_t b = 0; b < batch; ++b)
          (void)cache.Reserve(sequences[b], options.kv_len + q);
        StageTimes times;
        CurrentStageTimes() = &times;
        const double start = NowSeconds();
        kernels::RmsNorm(hidden.data(), T, D, layer.self_attn.input_layernorm.data(), 1e-6f,
                         normed.data());
        MlaForward(c, rope, layer.self_attn, 0, step, positions, cache, AttentionForm::kAuto,
                   normed.data(), delta.data());
        for (size_t i = 0; i < hidden.size(); ++i)
          delta[i] += hidden[i];
        kernels::RmsNorm(delta.data(), T, D, layer.post_attention_layernorm.data(), 1e-6f,
                         normed.data());
        if (exchange) {
          exchange->Run(c, layer.moe, 0, normed.data(), T, delta.data());
          active = local_experts;
        } else {
          ExpertRouting routing = RouteTokens(c, layer.moe, normed.data(), T);
          {
            // This rank's share of the layer: the routed slots land on its own experts, as the
            // dispatch from all EP ranks delivers them on average (tokens × top-k per rank).
            ScopedStage router(Stage::kRouter);
            for (int32_t& e : routing.expert_ids)
              e %= static_cast<int32_t>(local_experts);
            SortByExpert(routing, c.n_routed_experts);
          }
          std::vector<float> expert_rows(static_cast<size_t>(T * routing.top_k * D)),
              shared(hidden.size());
          RunExperts(layer.moe, routing, normed.data(), D, expert_rows.data());
          FeedForward(layer.moe.shared_experts, normed.data(), T, shared.data());
          FinalizeRouting(routing, expert_rows.data(), shared.data(), D, delta.data());
          active = 0;
          for (int64_t e = 0; e < local_experts; ++e)
            active += routing.expert_offsets[e + 1] > routing.expert_offsets[e];
        }
        const double total = NowSeconds() - start;
        CurrentStageTimes() = nullptr;
        double staged = 0;
        for (double s : times.seconds)
          staged += s;
        times[Stage::kOther] = total - staged;
        if (r > 0) {
          runs.push_back(times);
          totals.push_back(total);
        }
        for (int64_t b = 0; b < batch; ++b)
          cache.Truncate(sequences[b], options.kv_len);
      }
      LayerResult result;
      result.batch = batch;
      result.query_len = q;
      result.total = Median(totals);
      result.experts_active = active;
      result.ranks = comm.size();
      for (size_t s = 0; s < result.stages.seconds.size(); ++s) {
        std::vector<double> values;
        for (const auto& run : runs)
          values.push_back(run.seconds[s]);
        result.stages.seconds[s] = Median(values);
      }
      results.push_back(result);
    }
  }
  return results;
}

std::string LayerResultsTable(const LayerBenchOptions& options,
                              const std::vector<LayerResult>& results) {
  const int ranks = results.empty() ? 1 : results[0].ranks;
  std::string out = fmt::format(
      "DeepSeek-V3 MoE layer, EP{} rank ({} local experts), KV {} tokens per request, bf16 latent "
      "cache; µs\n",
      options.ep, 256 / options.ep, options.kv_len);
  if (ranks > 1)
    out += fmt::format("{} ranks exchanging bf16 rows by dispatch and combine, overlap {}\n", ranks,
                       options.overlap);
  out += fmt::format("{:>6} {:>3} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8} {:>10} {:>8}\n",
                     "batch", "q", "attention", "gemm", "grouped", "router", "dispatch", "combine",
                     "other", "total", "experts");
  for (const auto& r : results)
    out += fmt::format(
        "{:>6} {:>3} {:>10.0f} {:>10.0f} {:>10.0f} {:>8.0f} {:>9.0f} {:>9.0f} {:>8.0f} {:>10.0f} "
        "{:>8.0f}\n",
        r.batch, r.query_len, r.stages[Stage::kAttention] * 1e6, r.stages[Stage::kGemm] * 1e6,
        r.stages[Stage::kGroupedGemm] * 1e6, r.stages[Stage::kRouter] * 1e6,
        r.stages[Stage::kDispatch] * 1e6, r.stages[Stage::kCombine] * 1e6,
        r.stages[Stage::kOther] * 1e6, r.total * 1e6, r.experts_active);
  return out;
}

std::string LayerResultsJson(const LayerBenchOptions& options,
                             const std::vector<LayerResult>& results) {
  nlohmann::json j;
  j["ep"] = options.ep;
  j["kv_len"] = options.kv_len;
  j["results"] = nlohmann::json::array();
  for (const auto& r : results)
    j["results"].push_back({{"batch", r.batch},
                            {"query_len", r.query_len},
                            {"total_us", r.total * 1e6},
                            {"attention_us", r.stages[Stage::kAttention] * 1e6},
                            {"gemm_us", r.stages[Stage::kGemm] * 1e6},
                            {"grouped_gemm_us", r.stages[Stage::kGroupedGemm] * 1e6},
                            {"router_us", r.stages[Stage::kRouter] * 1e6},
                            {"other_us", r.stages[Stage::kOther] * 1e6},
                            {"dispatch_us", r.stages[Stage::kDispatch] * 1e6},
                            {"combine_us", r.stages[Stage::kCombine] * 1e6},
                            {"ranks", r.ranks},
                            {"experts_active", r.experts_active}});
  return j.dump(1) + "\n";
}

}  // namespace sy::bench
