#include "model/expert_placement.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sy {

const std::vector<int32_t>* ExpertPlacement::Layer(int64_t layer) const {
  auto it = std::lower_bound(layers.begin(), layers.end(), layer);
  if (it == layers.end() || *it != layer) return nullptr;
  return &physical[static_cast<size_t>(it - layers.begin())];
}

ExpertPlacement DefaultPlacement(const std::vector<int64_t>& layers, int64_t experts, int ranks,
                                 int64_t redundant) {
  ExpertPlacement p;
  p.experts = experts;
  p.ranks = ranks;
  p.slots_per_rank = (experts + redundant) / ranks;
  p.layers = layers;
  std::vector<int32_t> slots(static_cast<size_t>(p.slots_per_rank * ranks));
  for (size_t i = 0; i < slots.size(); ++i)
    slots[i] = static_cast<int32_t>(static_cast<int64_t>(i) % experts);
  p.physical.assign(layers.size(), slots);
  return p;
}

namespace {

// Shape and ids of one layer's slots; `where` names the layer.
Status CheckLayerSlots(const std::vector<int32_t>& slots, int64_t experts, int ranks,
                       int64_t slots_per_rank, const std::string& where) {
  if (static_cast<int64_t>(slots.size()) != ranks * slots_per_rank)
    return Status::Errorf("{}: {} physical experts, expected {} ranks × {} slots", where,
                          slots.size(), ranks, slots_per_rank);
  std::vector<int> replicas(static_cast<size_t>(experts), 0);
  for (size_t p = 0; p < slots.size(); ++p) {
    if (slots[p] < 0 || slots[p] >= experts)
      return Status::Errorf("{}: rank {} slot {} holds expert {}, outside [0, {})", where,
                            static_cast<int64_t>(p) / slots_per_rank,
                            static_cast<int64_t>(p) % slots_per_rank, slots[p], experts);
    ++replicas[slots[p]];
  }
  for (int64_t e = 0; e < experts; ++e)
    if (replicas[e] == 0) return Status::Errorf("{}: expert {} has no replica", where, e);
  return Status::Ok();
}

}  // namespace

Status CheckPlacement(const ExpertPlacement& p, const std::vector<int64_t>& layers, int64_t experts,
                      int ranks, int64_t redundant, const std::vector<int64_t>& also_allowed) {
  if (p.experts != experts)
    return Status::Errorf("the placement is for {} experts, the model has {}", p.experts, experts);
  if (p.ranks != ranks)
    return Status::Errorf("the placement is for {} ranks, this run has {}", p.ranks, ranks);
  if ((experts + redundant) % ranks != 0)
    return Status::Errorf("{} experts + {} redundant cannot be spread evenly over {} ranks",
                          experts, redundant, ranks);
  if (p.slots_per_rank != (experts + redundant) / ranks)
    return Status::Errorf(
        "the placement has {} slots per rank ({} redundant experts), but --num-redundant-experts "
        "{} needs ({} + {}) / {} = {}",
        p.slots_per_rank, p.redundant(), redundant, experts, redundant, ranks,
        (experts + redundant) / ranks);
  for (int64_t layer : layers)
    if (p.Layer(layer) == nullptr)
      return Status::Errorf("the placement has no layer {} (a MoE layer of the model)", layer);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    if (!std::binary_search(layers.begin(), layers.end(), p.layers[i]) &&
        std::find(also_allowed.begin(), also_allowed.end(), p.layers[i]) == also_allowed.end())
      return Status::Errorf("the placement names layer {}, which is not a MoE layer of the model",
                            p.layers[i]);
    SY_RETURN_IF_ERROR(CheckLayerSlots(p.physical[i], experts, ranks, p.slots_per_rank,
                                       fmt::format("placement layer {}", p.layers[i])));
  }
  return Status::Ok();
}

std::string ExpertPlacementToJson(const ExpertPlacement& p) {
  // One line per rank's slots: the file stays readable at E = 256.
  std::string out = fmt::format(
      "{{\n \"experts\": {},\n \"ranks\": {},\n \"redundant_experts\": {},\n \"layers\": [",
      p.experts, p.ranks, p.redundant());
  for (size_t l = 0; l < p.layers.size(); ++l) {
    out += fmt::format("{}\n  {{\"layer\": {}, \"ranks\": [", l == 0 ? "" : ",", p.layers[l]);
    for (int r = 0; r < p.ranks; ++r) {
      out += r == 0 ? "\n   [" : ",\n   [";
      for (int64_t s = 0; s < p.slots_per_rank; ++s)
        out += fmt::format("{}{}", s == 0 ? "" : ", ", p.physical[l][r * p.slots_per_rank + s]);
      out += "]";
    }
    out += "]}";
  }
  out += "\n ]\n}\n";
  return out;
}

Result<ExpertPlacement> ParseExpertPlacement(const std::string& text, const std::string& source) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    return Status::Errorf("{}: not a JSON object", source);
  auto positive = [&](const char* key) -> Result<int64_t> {
    auto it = json.find(key);
    if (it == json.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
      return Status::Errorf("{}: '{}' must be a positive integer", source, key);
    return it->get<int64_t>();
  };
  ExpertPlacement p;
  SY_ASSIGN_OR_RETURN(p.experts, positive("experts"));
  if (p.experts > (1 << 20))
    return Status::Errorf("{}: 'experts' {} is too many", source, p.experts);
  SY_ASSIGN_OR_RETURN(int64_t ranks, positive("ranks"));
  if (ranks > (1 << 20)) return Status::Errorf("{}: 'ranks' {} is too many", source, ranks);
  p.ranks = static_cast<int>(ranks);
  auto layers = json.find("layers");
  if (layers == json.end() || !layers->is_array() || layers->empty())
    return Status::Errorf("{}: 'layers' must be a non-empty array", source);
  for (size_t i = 0; i < layers->size(); ++i) {
    const nlohmann::json& layer = (*layers)[i];
    std::string where = fmt::format("{}: layers[{}]", source, i);
    if (!layer.is_object() || !layer.contains("layer") || !layer["layer"].is_number_integer() ||
        layer["layer"].get<int64_t>() < 0)
      return Status::Errorf("{}: needs 'layer', a non-negative integer", where);
    const int64_t index = layer["layer"].get<int64_t>();
    where = fmt::format("{} (layer {})", where, index);
    if (!p.layers.empty() && index <= p.layers.back())
      return Status::Errorf("{}: not after layer {} (layers ascend, once each)", where,
                            p.layers.back());
    auto per_rank = layer.find("ranks");
    if (per_rank == layer.end() || !per_rank->is_array() ||
        per_rank->size() != static_cast<size_t>(p.ranks))
      return Status::Errorf("{}: 'ranks' must list the slots of {} ranks", where, p.ranks);
    std::vector<int32_t> slots;
    for (int r = 0; r < p.ranks; ++r) {
      const nlohmann::json& ids = (*per_rank)[static_cast<size_t>(r)];
      if (!ids.is_array() || ids.empty())
        return Status::Errorf("{}: rank {} must list at least one expert", where, r);
      if (p.slots_per_rank == 0) p.slots_per_rank = static_cast<int64_t>(ids.size());
      if (static_cast<int64_t>(ids.size()) != p.slots_per_rank)
        return Status::Errorf("{}: rank {} has {} slots, rank 0 of layer {} has {}", where, r,
                              ids.size(), p.layers.empty() ? index : p.layers.front(),
                              p.slots_per_rank);
      for (size_t s = 0; s < ids.size(); ++s) {
        if (!ids[s].is_number_integer() || ids[s].get<int64_t>() < 0 ||
            ids[s].get<int64_t>() >= p.experts)
          return Status::Errorf("{}: rank {} slot {} is {}, not an expert id in [0, {})", where, r,
                                s, ids[s].dump(), p.experts);
        slots.push_back(static_cast<int32_t>(ids[s].get<int64_t>()));
      }
    }
    SY_RETURN_IF_ERROR(CheckLayerSlots(slots, p.experts, p.ranks, p.slots_per_rank, where));
    p.layers.push_back(index);
    p.physical.push_back(std::move(slots));
  }
  if (p.redundant() < 0)
    return Status::Errorf("{}: {} slots for {} experts", source, p.ranks * p.slots_per_rank,
                          p.experts);
  if (json.contains("redundant_experts") &&
      (!json["redundant_experts"].is_number_integer() ||
       json["redundant_experts"].get<int64_t>() != p.redundant()))
    return Status::Errorf(
        "{}: 'redundant_experts' is {}, but {} ranks × {} slots − {} experts "
        "= {}",
        source, json["redundant_experts"].dump(), p.ranks, p.slots_per_rank, p.experts,
        p.redundant());
  return p;
}

Result<ExpertPlacement> LoadExpertPlacement(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Errorf("{}: cannot read the expert placement", path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseExpertPlacement(text.str(), path);
}

std::vector<int32_t> HeldExperts(const std::vector<int32_t>& layer_slots, int64_t slots_per_rank,
                                 int rank) {
  std::vector<int32_t> held(layer_slots.begin() + rank * slots_per_rank,
                            layer_slots.begin() + (rank + 1) * slots_per_rank);
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  return held;
}

std::vector<std::vector<double>> PredictedRankLoads(const ExpertPlacement& p,
                                                    const ExpertLoad& load) {
  std::vector<std::vector<double>> out;
  for (size_t l = 0; l < load.layers.size(); ++l) {
    std::vector<double> ranks(static_cast<size_t>(p.ranks), 0.0);
    const std::vector<int32_t>* slots = p.Layer(load.layers[l]);
    if (slots != nullptr) {
      std::vector<int> replicas(static_cast<size_t>(p.experts), 0);
      for (int32_t e : *slots)
        ++replicas[e];
      for (size_t s = 0; s < slots->size(); ++s) {
        const int32_t e = (*slots)[s];
        if (e < static_cast<int32_t>(load.counts[l].size()))
          ranks[s / static_cast<size_t>(p.slots_per_rank)] +=
              static_cast<double>(load.counts[l][e]) / replicas[e];
      }
    }
    out.push_back(std::move(ranks));
  }
  return out;
}

namespace {

// One exchange's rows per rank when each replicated expert's rows go to the least loaded of its
// replicas' ranks (ReplicaShare::kLeastLoaded).
std::vector<double> LeastLoadedRankLoads(const std::vector<int32_t>& slots, int64_t per_rank,
                                         int ranks, const std::vector<int64_t>& counts) {
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  std::vector<std::vector<int>> replica_ranks(counts.size());
  for (size_t s = 0; s < slots.size(); ++s)
    if (static_cast<size_t>(slots[s]) < counts.size())
      replica_ranks[slots[s]].push_back(static_cast<int>(s / static_cast<size_t>(per_rank)));
  std::vector<size_t> replicated;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (replica_ranks[e].size() == 1) load[replica_ranks[e][0]] += static_cast<double>(counts[e]);
    if (replica_ranks[e].size() > 1) replicated.push_back(e);
  }
  std::stable_sort(replicated.begin(), replicated.end(),
                   [&](size_t a, size_t b) { return counts[a] > counts[b]; });
  for (size_t e : replicated)
    for (int64_t row = 0; row < counts[e]; ++row) {
      int best = replica_ranks[e][0];
      for (int r : replica_ranks[e])
        if (load[r] < load[best]) best = r;
      load[best] += 1;
    }
  return load;
}

}  // namespace

std::optional<double> PredictedExchangeImbalance(const ExpertPlacement& p, const ExpertLoad& load,
                                                 ReplicaShare share) {
  // Each sampled exchange as a one-layer load of its own.
  double busiest = 0, mean = 0;
  bool any = false;
  for (size_t l = 0; l < load.exchanges.size() && l < load.layers.size(); ++l)
    for (const std::vector<int64_t>& sample : load.exchanges[l]) {
      ExpertLoad one;
      one.experts = load.experts;
      one.layers = {load.layers[l]};
      one.counts = {sample};
      std::vector<std::vector<double>> per_layer;
      const std::vector<int32_t>* slots = p.Layer(load.layers[l]);
      if (share == ReplicaShare::kLeastLoaded && slots != nullptr)
        per_layer = {LeastLoadedRankLoads(*slots, p.slots_per_rank, p.ranks, sample)};
      else
        per_layer = PredictedRankLoads(p, one);
      for (const std::vector<double>& ranks : per_layer) {
        double total = 0;
        for (double v : ranks)
          total += v;
        busiest += *std::max_element(ranks.begin(), ranks.end());
        mean += total / static_cast<double>(ranks.size());
        any = true;
      }
    }
  if (!any) return std::nullopt;
  return mean > 0 ? busiest / mean : 1.0;
}

double PredictedImbalance(const ExpertPlacement& p, const ExpertLoad& load) {
  double busiest = 0, mean = 0;
  for (const std::vector<double>& ranks : PredictedRankLoads(p, load)) {
    double total = 0;
    for (double v : ranks)
      total += v;
    busiest += *std::max_element(ranks.begin(), ranks.end());
    mean += total / static_cast<double>(ranks.size());
  }
  return mean > 0 ? busiest / mean : 1.0;
}

}  // namespace sy
