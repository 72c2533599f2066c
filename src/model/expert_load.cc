#include "model/expert_load.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace sy {

std::string ExpertLoadToJson(const ExpertLoad& load) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < load.layers.size(); ++i) {
    nlohmann::json layer = {{"layer", load.layers[i]}, {"counts", load.counts[i]}};
    if (i < load.layer_imbalance.size()) layer["imbalance"] = load.layer_imbalance[i];
    if (i < load.exchanges.size() && !load.exchanges[i].empty())
      layer["exchanges"] = load.exchanges[i];
    layers.push_back(std::move(layer));
  }
  nlohmann::json out = {{"experts", load.experts},
                        {"top_k", load.top_k},
                        {"groups", load.groups},
                        {"ranks", load.ranks},
                        {"window", {{"steps", load.steps}, {"tokens", load.tokens}}},
                        {"expert_imbalance", nullptr},
                        {"layers", layers}};
  if (load.imbalance) out["expert_imbalance"] = *load.imbalance;
  return out.dump(1) + "\n";
}

namespace {

// A non-negative integer field of `object`, or an error naming it.
Result<int64_t> Count(const nlohmann::json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
    return Status::Errorf("{}: '{}' must be a non-negative integer", where, key);
  return it->get<int64_t>();
}

}  // namespace

Result<ExpertLoad> ParseExpertLoad(const std::string& text, const std::string& source) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    return Status::Errorf("{}: not a JSON object", source);
  ExpertLoad load;
  SY_ASSIGN_OR_RETURN(load.experts, Count(json, "experts", source));
  if (load.experts == 0) return Status::Errorf("{}: 'experts' must be positive", source);
  if (load.experts > (1 << 20))
    return Status::Errorf("{}: 'experts' {} is too many", source, load.experts);
  SY_ASSIGN_OR_RETURN(load.top_k, Count(json, "top_k", source));
  if (json.contains("groups")) {
    SY_ASSIGN_OR_RETURN(load.groups, Count(json, "groups", source));
    if (load.groups == 0 || load.experts % load.groups != 0)
      return Status::Errorf("{}: 'groups' {} does not divide the {} experts", source, load.groups,
                            load.experts);
  }
  if (json.contains("ranks")) {
    SY_ASSIGN_OR_RETURN(int64_t ranks, Count(json, "ranks", source));
    if (ranks > (1 << 20))  // held as an int; no deployment has a million ranks
      return Status::Errorf("{}: 'ranks' {} is too many", source, ranks);
    load.ranks = static_cast<int>(std::max<int64_t>(1, ranks));
  }
  if (json.contains("window")) {
    const std::string where = source + ": window";
    if (!json["window"].is_object()) return Status::Errorf("{} must be an object", where);
    SY_ASSIGN_OR_RETURN(load.steps, Count(json["window"], "steps", where));
    SY_ASSIGN_OR_RETURN(load.tokens, Count(json["window"], "tokens", where));
  }
  if (json.contains("expert_imbalance") && json["expert_imbalance"].is_number())
    load.imbalance = json["expert_imbalance"].get<double>();
  auto layers = json.find("layers");
  if (layers == json.end() || !layers->is_array() || layers->empty())
    return Status::Errorf("{}: 'layers' must be a non-empty array", source);
  for (size_t i = 0; i < layers->size(); ++i) {
    const nlohmann::json& layer = (*layers)[i];
    const std::string where = fmt::format("{}: layers[{}]", source, i);
    if (!layer.is_object()) return Status::Errorf("{} must be an object", where);
    SY_ASSIGN_OR_RETURN(int64_t index, Count(layer, "layer", where));
    if (!load.layers.empty() && index <= load.layers.back())
      return Status::Errorf("{}: layer {} is not after layer {} (layers ascend, once each)", where,
                            index, load.layers.back());
    auto counts = layer.find("counts");
    if (counts == layer.end() || !counts->is_array() ||
        counts->size() != static_cast<size_t>(load.experts))
      return Status::Errorf("{} (layer {}): 'counts' must list {} experts", where, index,
                            load.experts);
    std::vector<int64_t> values;
    for (size_t e = 0; e < counts->size(); ++e) {
      const nlohmann::json& v = (*counts)[e];
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        return Status::Errorf("{} (layer {}): counts[{}] must be a non-negative integer", where,
                              index, e);
      values.push_back(v.get<int64_t>());
    }
    std::vector<std::vector<int64_t>> exchanges;
    if (layer.contains("exchanges")) {
      const nlohmann::json& samples = layer["exchanges"];
      if (!samples.is_array() || samples.size() > 4 * static_cast<size_t>(kExchangeSamples))
        return Status::Errorf("{} (layer {}): 'exchanges' must be an array of at most {} samples",
                              where, index, 4 * kExchangeSamples);
      for (size_t t = 0; t < samples.size(); ++t) {
        const nlohmann::json& sample = samples[t];
        if (!sample.is_array() || sample.size() != static_cast<size_t>(load.experts))
          return Status::Errorf("{} (layer {}): exchanges[{}] must list {} experts", where, index,
                                t, load.experts);
        std::vector<int64_t> row;
        for (const nlohmann::json& v : sample) {
          if (!v.is_number_integer() || v.get<int64_t>() < 0)
            return Status::Errorf("{} (layer {}): exchanges[{}] must hold non-negative integers",
                                  where, index, t);
          row.push_back(v.get<int64_t>());
        }
        exchanges.push_back(std::move(row));
      }
    }
    load.layers.push_back(index);
    load.counts.push_back(std::move(values));
    load.exchanges.push_back(std::move(exchanges));
    if (layer.contains("imbalance") && layer["imbalance"].is_number())
      load.layer_imbalance.push_back(layer["imbalance"].get<double>());
  }
  if (load.layer_imbalance.size() != load.layers.size()) load.layer_imbalance.clear();
  if (std::all_of(load.exchanges.begin(), load.exchanges.end(),
                  [](const auto& samples) { return samples.empty(); }))
    load.exchanges.clear();
  return load;
}

double ImbalanceOverExchanges(const std::vector<std::vector<int64_t>>& rows,
                              const std::vector<int32_t>& exchange_layer,
                              std::vector<double>* per_layer, size_t layers,
                              std::pair<double, double>* sums) {
  if (sums != nullptr) *sums = {0.0, 0.0};
  if (rows.empty()) return 1.0;
  const size_t ranks = rows.size();
  size_t exchanges = rows[0].size();
  for (const auto& r : rows)
    exchanges = std::min(exchanges, r.size());
  double busiest = 0, mean = 0;
  std::vector<double> layer_busiest(layers), layer_mean(layers);
  for (size_t i = 0; i < exchanges; ++i) {
    int64_t most = 0, total = 0;
    for (size_t r = 0; r < ranks; ++r) {
      most = std::max(most, rows[r][i]);
      total += rows[r][i];
    }
    busiest += static_cast<double>(most);
    mean += static_cast<double>(total) / static_cast<double>(ranks);
    if (per_layer != nullptr && i < exchange_layer.size() &&
        static_cast<size_t>(exchange_layer[i]) < layers) {
      layer_busiest[exchange_layer[i]] += static_cast<double>(most);
      layer_mean[exchange_layer[i]] += static_cast<double>(total) / static_cast<double>(ranks);
    }
  }
  if (per_layer != nullptr) {
    per_layer->assign(layers, 1.0);
    for (size_t l = 0; l < layers; ++l)
      if (layer_mean[l] > 0) (*per_layer)[l] = layer_busiest[l] / layer_mean[l];
  }
  if (sums != nullptr) *sums = {busiest, mean};
  return mean > 0 ? busiest / mean : 1.0;
}

ExpertLoadRecorder::ExpertLoadRecorder(std::vector<int64_t> layers, int64_t experts, int64_t top_k)
    : layers_(std::move(layers)), experts_(experts), top_k_(top_k) {
  counts_.assign(layers_.size(), std::vector<int64_t>(static_cast<size_t>(experts_), 0));
  samples_.resize(layers_.size());
  routed_.assign(layers_.size(), 0);
}

int ExpertLoadRecorder::LayerIndex(int64_t layer) const {
  auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
  return it != layers_.end() && *it == layer ? static_cast<int>(it - layers_.begin()) : -1;
}

void ExpertLoadRecorder::Record(int64_t layer, const ExpertRouting& routing) {
  const int index = LayerIndex(layer);
  if (index < 0) return;
  if (index == 0) {
    bool begins, ended;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      begins = last_layer_ != layer;
      ended = begins && on_window_end_ && steps_ >= window_steps_;
    }
    // Outside the lock: the window's end takes a snapshot and clears.
    if (begins && on_step_begin_) on_step_begin_();
    if (ended) on_window_end_();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t>& counts = counts_[index];
  for (int32_t expert : routing.expert_ids)
    ++counts[expert];
  // Reservoir sampling of this layer's exchanges: the n-th is kept with probability k/n, in the
  // slot a hash of (layer, n) picks, so every rank keeps the same exchanges (they make the same
  // ones in the same order) and the root can add them up.
  const int64_t n = ++routed_[index];
  int64_t keep = n - 1;
  if (n > kExchangeSamples) {
    uint64_t h = static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(index);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    keep = static_cast<int64_t>(h % static_cast<uint64_t>(n));
  }
  if (keep < kExchangeSamples) {
    std::vector<std::vector<int64_t>>& samples = samples_[index];
    if (keep >= static_cast<int64_t>(samples.size())) samples.resize(keep + 1);
    std::vector<int64_t>& sample = samples[keep];
    sample.assign(static_cast<size_t>(experts_), 0);
    for (int32_t expert : routing.expert_ids)
      ++sample[expert];
  }
  if (index == 0) {
    if (last_layer_ != layer) ++steps_;
    tokens_ += routing.tokens;
  }
  last_layer_ = layer;
}

void ExpertLoadRecorder::RecordExchange(int64_t layer, int64_t received_rows) {
  const int index = LayerIndex(layer);
  std::lock_guard<std::mutex> lock(mutex_);
  exchange_rows_.push_back(received_rows);
  exchange_layer_.push_back(index);
}

ExpertLoad ExpertLoadRecorder::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpertLoad load;
  load.experts = experts_;
  load.top_k = top_k_;
  load.layers = layers_;
  load.counts = counts_;
  load.steps = steps_;
  load.tokens = tokens_;
  load.exchanges = samples_;
  return load;
}

void ExpertLoadRecorder::Exchanges(std::vector<int64_t>* rows,
                                   std::vector<int32_t>* layer_index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  *rows = exchange_rows_;
  *layer_index = exchange_layer_;
}

void ExpertLoadRecorder::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& counts : counts_)
    std::fill(counts.begin(), counts.end(), 0);
  steps_ = tokens_ = 0;
  last_layer_ = -1;
  exchange_rows_.clear();
  exchange_layer_.clear();
  // The sampled exchanges stay: one window of online rebalancing holds a few steps, too few
  // to balance single exchanges on without fitting their noise, and which experts are hot
  // together changes more slowly than the sums do.
}

void ExpertLoadRecorder::SetWindow(int64_t steps, std::function<void()> on_window_end) {
  std::lock_guard<std::mutex> lock(mutex_);
  window_steps_ = steps;
  on_window_end_ = steps > 0 ? std::move(on_window_end) : nullptr;
}

void ExpertLoadRecorder::SetStepBegin(std::function<void()> on_step_begin) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_step_begin_ = std::move(on_step_begin);
}

int64_t ExpertLoadRecorder::steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return steps_;
}

}  // namespace sy
