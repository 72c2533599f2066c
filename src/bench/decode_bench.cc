#include "bench/decode_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/clock.h"
#include "model/model.h"
#include "tensor/packed_matrix.h"

namespace sy::bench {
namespace {

double MatrixBytes(const Matrix& m) {
  if (m.packed) return m.packed->StoredBytes();
  return static_cast<double>(m.rows) * m.cols * DTypeSize(m.dtype);
}

double FeedForwardBytes(const FeedForwardWeights& f) {
  return f.empty() ? 0
                   : MatrixBytes(f.gate_proj) + MatrixBytes(f.up_proj) + MatrixBytes(f.down_proj);
}

// Bytes one decode step of `batch` sequences of `context` tokens must read at least once.
double StepBytes(const Model& model, int64_t batch, int64_t context) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  double bytes = MatrixBytes(w.lm_head) + batch * c.hidden_size * 2.0;  // head, embedding rows
  for (const auto& layer : w.layers) {
    const AttentionWeights& a = layer.self_attn;
    for (const Matrix* m : {&a.q_a_proj, &a.q_b_proj, &a.q_proj, &a.kv_a_proj_with_mqa, &a.o_proj})
      if (!m->empty()) bytes += MatrixBytes(*m);
    for (const auto& m : a.w_uk_t)
      bytes += MatrixBytes(m);
    for (const auto& m : a.w_uv)
      bytes += MatrixBytes(m);
    if (!layer.is_moe) {
      bytes += FeedForwardBytes(layer.mlp);
      continue;
    }
    bytes += MatrixBytes(layer.moe.gate) + FeedForwardBytes(layer.moe.shared_experts);
    // Expected distinct experts for `batch` tokens choosing top-k of E each.
    const double E = c.n_routed_experts, K = c.num_experts_per_tok;
    const double active = E * (1 - std::pow(1 - K / E, static_cast<double>(batch)));
    bytes += active * FeedForwardBytes(layer.moe.experts[0]);
  }
  bytes += static_cast<double>(batch) * context * c.latent_cache_width() * 2 *
           c.num_hidden_layers;  // bf16 cache
  return bytes;
}

// VmRSS of this process, in bytes (0 where /proc is not there).
double ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  return 0;
}

double CheckpointBytes(const std::string& directory) {
  double bytes = 0;
  std::error_code error;
  if (std::filesystem::is_regular_file(directory, error))  // a GGUF (its other shards beside it)
    return static_cast<double>(std::filesystem::file_size(directory, error));
  for (const auto& entry : std::filesystem::directory_iterator(directory, error))
    if (entry.path().extension() == ".safetensors")
      bytes += static_cast<double>(entry.file_size(error));
  return bytes;
}

// One checkpoint's batch of sequences, prefilled and stepped one decode step at a time.
class SteppedDecode {
 public:
  SteppedDecode(const Model& model, int64_t batch, const DecodeBenchOptions& options)
      : model_(model),
        cache_(
            model.NewCache(batch * (options.prompt_len + options.steps + 1), batch, DType::kBF16)),
        sequences_(static_cast<size_t>(batch)),
        next_(static_cast<size_t>(batch)) {
    forward_.logit_rows = LogitRows::kLast;
    const int64_t vocab = model.config().vocab_size;
    prompts_.resize(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < options.prompt_len; ++i)
        prompts_[b].push_back(static_cast<int32_t>((b * 131 + i * 17 + 3) % vocab));
  }
  Status Prefill() {
    ForwardBatch prefill;
    for (size_t b = 0; b < sequences_.size(); ++b)
      prefill.Add(prompts_[b].data(), static_cast<int64_t>(prompts_[b].size()), &sequences_[b]);
    return model_.Forward(prefill, cache_, forward_, &logits_);
  }
  // One greedy step; its seconds.
  Result<double> Step() {
    const double start = NowSeconds();
    const int64_t vocab = model_.config().vocab_size;
    ForwardBatch decode;
    for (size_t b = 0; b < sequences_.size(); ++b) {
      const float* row = logits_.data() + b * vocab;
      next_[b] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      decode.Add(&next_[b], 1, &sequences_[b]);
    }
    SY_RETURN_IF_ERROR(model_.Forward(decode, cache_, forward_, &logits_));
    return NowSeconds() - start;
  }

 private:
  const Model& model_;
  LatentCache cache_;
  std::vector<SequenceCache> sequences_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<int32_t> next_;
  std::vector<float> logits_;
  ForwardOptions forward_;
};

double Quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5)];
}

}  // namespace

Result<std::vector<DecodeResult>> BenchDecode(const std::string& model_dir, MachinePeaks& peaks,
                                              const DecodeBenchOptions& options) {
  const double load_start = NowSeconds();
  SY_ASSIGN_OR_RETURN(auto model, Model::Load(model_dir));
  const double load_seconds = NowSeconds() - load_start;
  const double rss_after_load = ResidentBytes();
  // 1 GiB: past any last-level cache here. Resident after a batch leaves the probe's pages out.
  const int64_t kProbeBytes = StreamingBytes(1ll << 30);
  ReadBandwidthProbe probe(kProbeBytes);
  const double checkpoint = CheckpointBytes(model_dir);
  const ModelConfig& c = model->config();
  std::vector<DecodeResult> results;
  for (int64_t batch : options.batches) {
    SteppedDecode run(*model, batch, options);
    SY_RETURN_IF_ERROR(run.Prefill());
    const double read_before = probe.MeasureGbps(3);
    SY_RETURN_IF_ERROR(run.Step().status());  // warm-up, not timed
    std::vector<double> step_seconds;
    for (int64_t step = 0; step < options.steps; ++step) {
      SY_ASSIGN_OR_RETURN(const double seconds, run.Step());
      step_seconds.push_back(seconds);
    }
    DecodeResult r;
    r.batch = batch;
    // The median step: this machine is shared, and a step that met a noisy neighbour says little.
    r.tokens_per_second = batch / Quantile(step_seconds, 0.5);
    r.bytes_per_step = StepBytes(*model, batch, options.prompt_len + options.steps / 2);
    r.read_gbps_beside = std::max(read_before, probe.MeasureGbps(3));
    r.checkpoint_bytes = checkpoint;
    r.load_seconds = load_seconds;
    r.rss_after_load_bytes = rss_after_load;
    r.rss_after_batch_bytes = ResidentBytes() - static_cast<double>(kProbeBytes);
    r.cache_bytes = static_cast<double>(batch) * (options.prompt_len + options.steps + 1) *
                    c.latent_cache_width() * 2 * c.num_hidden_layers;
    results.push_back(r);
  }
  for (const auto& r : results)
    peaks.read_gbps = std::max(peaks.read_gbps, r.read_gbps_beside);
  for (auto& r : results)
    r.bound_tokens_per_second = r.batch / (r.bytes_per_step / (peaks.read_gbps * 1e9));
  return results;
}

Result<std::vector<PairedDecodeResult>> BenchDecodePaired(const std::string& model_a,
                                                          const std::string& model_b,
                                                          const DecodeBenchOptions& options) {
  SY_ASSIGN_OR_RETURN(auto a, Model::Load(model_a));
  SY_ASSIGN_OR_RETURN(auto b, Model::Load(model_b));
  std::vector<PairedDecodeResult> results;
  for (int64_t batch : options.batches) {
    SteppedDecode runs[2] = {SteppedDecode(*a, batch, options), SteppedDecode(*b, batch, options)};
    for (auto& run : runs) {
      SY_RETURN_IF_ERROR(run.Prefill());
      SY_RETURN_IF_ERROR(run.Step().status());  // warm-up, not timed
    }
    std::vector<double> seconds[2], ratios;
    for (int64_t step = 0; step < options.steps; ++step) {
      double taken[2];
      for (int i = 0; i < 2; ++i) {
        const int k = step % 2 == 0 ? i : 1 - i;  // A, B, B, A: neither always goes first
        SY_ASSIGN_OR_RETURN(taken[k], runs[k].Step());
      }
      seconds[0].push_back(taken[0]);
      seconds[1].push_back(taken[1]);
      ratios.push_back(taken[1] / taken[0]);
    }
    PairedDecodeResult r;
    r.batch = batch;
    r.pairs = options.steps;
    r.a_tokens_per_second = batch / Quantile(seconds[0], 0.5);
    r.b_tokens_per_second = batch / Quantile(seconds[1], 0.5);
    r.ratio_median = Quantile(ratios, 0.5);
    r.ratio_q1 = Quantile(ratios, 0.25);
    r.ratio_q3 = Quantile(ratios, 0.75);
    results.push_back(r);
  }
  return results;
}

std::string PairedDecodeTable(const std::string& model_a, const std::string& model_b,
                              const std::vector<PairedDecodeResult>& results) {
  std::string out = fmt::format(
      "A: {}\nB: {}\none process, decode steps alternated A, B, B, A; B/A: B's step time over "
      "A's, pair by pair (above 1: A is faster)\n",
      model_a, model_b);
  out += fmt::format("{:>6} {:>12} {:>12} {:>12} {:>20} {:>7}\n", "batch", "A tok/s", "B tok/s",
                     "B/A median", "B/A quartiles", "pairs");
  for (const auto& r : results)
    out += fmt::format("{:>6} {:>12.1f} {:>12.1f} {:>12.3f} {:>10.3f} .. {:<6.3f} {:>7}\n", r.batch,
                       r.a_tokens_per_second, r.b_tokens_per_second, r.ratio_median, r.ratio_q1,
                       r.ratio_q3, r.pairs);
  return out;
}

std::string DecodeResultsTable(const MachinePeaks& peaks,
                               const std::vector<DecodeResult>& results) {
  std::string out = fmt::format(
      "read bandwidth {:.1f} GB/s (the best reading of the run: at its start and beside each "
      "batch), {} threads\n",
      peaks.read_gbps, peaks.threads);
  out += fmt::format("{:>6} {:>12} {:>14} {:>16} {:>10} {:>14}\n", "batch", "tok/s", "MB per step",
                     "bound tok/s", "of bound", "read beside");
  for (const auto& r : results)
    out += fmt::format("{:>6} {:>12.1f} {:>14.1f} {:>16.1f} {:>9.0f}% {:>9.1f} GB/s\n", r.batch,
                       r.tokens_per_second, r.bytes_per_step / 1e6, r.bound_tokens_per_second,
                       100 * r.tokens_per_second / r.bound_tokens_per_second, r.read_gbps_beside);
  if (!results.empty()) {
    const DecodeResult& first = results.front();
    out += fmt::format(
        "memory: checkpoint {:.2f} GB; resident after load {:.2f} GB ({:.2f}x the checkpoint)\n",
        first.checkpoint_bytes / 1e9, first.rss_after_load_bytes / 1e9,
        first.rss_after_load_bytes / std::max(1.0, first.checkpoint_bytes));
    for (const auto& r : results)
      out += fmt::format("  batch {:>3}: resident {:.2f} GB with its {:.3f} GB latent cache\n",
                         r.batch, r.rss_after_batch_bytes / 1e9, r.cache_bytes / 1e9);
    // Loading reads the checkpoint once and writes its packed copy: its rate against the read
    // bandwidth says how far the re-layout is from a copy at memory speed.
    const double load_gbps = first.checkpoint_bytes / std::max(1e-9, first.load_seconds) / 1e9;
    out += fmt::format(
        "load: {:.3g} s, {:.3g} GB/s of checkpoint ({:.3g}x the read bandwidth; the page cache as "
        "the run found it)\n",
        first.load_seconds, load_gbps, load_gbps / std::max(1e-9, peaks.read_gbps));
  }
  return out;
}

}  // namespace sy::bench
