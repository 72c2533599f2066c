#include "model/calibration.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/model.h"

namespace sy {

LinearInputObserver*& ActiveLinearInputObserver() {
  static LinearInputObserver* observer = nullptr;
  return observer;
}

void SquareSums::Observe(const Matrix& w, const float* x, int64_t rows, int64_t cols,
                         int64_t stride) {
  if (rows <= 0) return;
  std::vector<double> local(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const double v = x[r * stride + c];
      local[c] += v * v;
    }
  std::lock_guard<std::mutex> lock(mutex_);
  Sums& s = sums_[&w];
  if (s.squares.empty()) s.squares.assign(static_cast<size_t>(cols), 0.0);
  for (int64_t c = 0; c < cols && c < static_cast<int64_t>(s.squares.size()); ++c)
    s.squares[c] += local[c];
  s.rows += rows;
}

const std::vector<float>* Importance::Find(const std::string& weight) const {
  auto it = mean_squares.find(weight);
  return it == mean_squares.end() ? nullptr : &it->second;
}

std::vector<float> Importance::Weights(const std::string& weight, int64_t cols) const {
  const std::vector<float>* found = Find(weight);
  if (found == nullptr || static_cast<int64_t>(found->size()) != cols || cols == 0) return {};
  double mean = 0;
  for (float v : *found)
    mean += v;
  mean /= static_cast<double>(cols);
  std::vector<float> out(*found);
  for (float& v : out)
    v = std::max(v, static_cast<float>(0.01 * mean));
  return out;
}

namespace {

// Every linear layer of the main layers, with its checkpoint name.
std::vector<std::pair<const Matrix*, std::string>> NamedLinears(const ModelWeights& w) {
  std::vector<std::pair<const Matrix*, std::string>> out;
  auto mlp = [&](const FeedForwardWeights& ff, const std::string& prefix) {
    if (ff.empty()) return;
    out.emplace_back(&ff.gate_proj, prefix + ".gate_proj.weight");
    out.emplace_back(&ff.up_proj, prefix + ".up_proj.weight");
    out.emplace_back(&ff.down_proj, prefix + ".down_proj.weight");
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayerWeights& layer = w.layers[i];
    const std::string attn = fmt::format("model.layers.{}.self_attn.", i);
    const AttentionWeights& a = layer.self_attn;
    for (const auto& [m, name] :
         {std::pair{&a.q_a_proj, "q_a_proj"}, std::pair{&a.q_b_proj, "q_b_proj"},
          std::pair{&a.q_proj, "q_proj"}, std::pair{&a.kv_a_proj_with_mqa, "kv_a_proj_with_mqa"},
          std::pair{&a.kv_b_proj, "kv_b_proj"}, std::pair{&a.o_proj, "o_proj"}})
      out.emplace_back(m, attn + name + ".weight");
    const std::string prefix = fmt::format("model.layers.{}.mlp", i);
    if (!layer.is_moe) {
      mlp(layer.mlp, prefix);
      continue;
    }
    for (size_t e = 0; e < layer.moe.experts.size(); ++e)
      mlp(layer.moe.experts[e], fmt::format("{}.experts.{}", prefix, e));
    mlp(layer.moe.shared_experts, prefix + ".shared_experts");
  }
  return out;
}

}  // namespace

Result<Importance> CollectImportance(Model& model,
                                     const std::vector<std::vector<int32_t>>& sequences,
                                     const std::function<void(size_t, size_t)>& progress) {
  if (ObservingLinearInputs()) return Status::Error("a calibration is already running");
  SquareSums sums;
  Importance importance;
  ActiveLinearInputObserver() = &sums;
  Status status;
  for (size_t s = 0; s < sequences.size() && status.ok(); ++s) {
    const std::vector<int32_t>& ids = sequences[s];
    if (ids.empty()) continue;
    ForwardOptions options;
    options.logit_rows = LogitRows::kLast;
    std::vector<float> logits;
    status = model.ForwardSequence(ids, options, &logits);
    importance.tokens += static_cast<int64_t>(ids.size());
    if (progress) progress(s + 1, sequences.size());
  }
  ActiveLinearInputObserver() = nullptr;
  SY_RETURN_IF_ERROR(status);
  for (const auto& [matrix, name] : NamedLinears(model.weights())) {
    auto it = sums.sums().find(matrix);
    if (it == sums.sums().end() || it->second.rows == 0) continue;
    std::vector<float> mean(it->second.squares.size());
    for (size_t c = 0; c < mean.size(); ++c)
      mean[c] = static_cast<float>(it->second.squares[c] / static_cast<double>(it->second.rows));
    importance.mean_squares[name] = std::move(mean);
    importance.rows[name] = it->second.rows;
  }
  return importance;
}

std::vector<std::vector<int32_t>> CalibrationWindows(const std::vector<int32_t>& tokens,
                                                     int64_t length, int64_t max_tokens) {
  std::vector<std::vector<int32_t>> out;
  const int64_t total = std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_tokens);
  for (int64_t begin = 0; length > 0 && begin + 1 < total; begin += length) {
    const int64_t end = std::min(total, begin + length);
    out.emplace_back(tokens.begin() + begin, tokens.begin() + end);
  }
  return out;
}

}  // namespace sy
