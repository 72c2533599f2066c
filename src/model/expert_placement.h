// Where the routed experts live under expert parallelism: per MoE layer, the logical expert in
// each of the N ranks' S physical slots (S = (E + R) / N with R redundant experts). A logical
// expert may have several replicas; every one must have at least one. The default is the
// contiguous placement (slot p holds expert p mod E: rank r holds [r·E/N, (r+1)·E/N) when R = 0).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/expert_load.h"

namespace sy {

struct ExpertPlacement {
  int64_t experts = 0;          // logical experts E
  int ranks = 1;                // expert-parallel ranks N
  int64_t slots_per_rank = 0;   // physical experts per rank S
  std::vector<int64_t> layers;  // MoE layer indices, ascending
  // [layers][N · S]: physical expert p = rank · S + slot holds logical expert physical[l][p].
  std::vector<std::vector<int32_t>> physical;

  int64_t redundant() const { return ranks * slots_per_rank - experts; }
  // The layer's slots, or null when the placement does not name the layer.
  const std::vector<int32_t>* Layer(int64_t layer) const;
};

// Slot p holds expert p mod E on every layer: R = 0 gives each rank a contiguous range; R > 0
// adds replicas of experts 0, 1, … in the last ranks' extra slots. Needs (E + R) % N == 0.
ExpertPlacement DefaultPlacement(const std::vector<int64_t>& layers, int64_t experts, int ranks,
                                 int64_t redundant);

// Every problem named: a layer missing or not a MoE layer, slot counts that are not
// (E + R) / N per rank, an id out of range, an expert with no replica. `layers`: the MoE layers
// the placement must name; it may name no others except those in `also_allowed`.
Status CheckPlacement(const ExpertPlacement& placement, const std::vector<int64_t>& layers,
                      int64_t experts, int ranks, int64_t redundant,
                      const std::vector<int64_t>& also_allowed = {});

// {"experts", "ranks", "redundant_experts", "layers": [{"layer", "ranks": [[ids of rank 0's
// slots], …]}]}; ParseExpertPlacement checks the shape (each rank the same slot count, ids in
// range, every expert placed) and names `source` and the place of any error.
std::string ExpertPlacementToJson(const ExpertPlacement& placement);
Result<ExpertPlacement> ParseExpertPlacement(const std::string& json_text,
                                             const std::string& source);
Result<ExpertPlacement> LoadExpertPlacement(const std::string& path);

// The logical experts rank `rank` holds in `layer` (ascending, once each).
std::vector<int32_t> HeldExperts(const std::vector<int32_t>& layer_slots, int64_t slots_per_rank,
                                 int rank);

// The expected rows per rank of each layer under the placement when every logical expert's
// load is split evenly over its replicas: [layers][ranks], in load.layers order (a layer the
// placement does not name counts nothing).
std::vector<std::vector<double>> PredictedRankLoads(const ExpertPlacement& placement,
                                                    const ExpertLoad& load);
// Σ over layers of the busiest rank's predicted load / Σ of the mean rank's.
double PredictedImbalance(const ExpertPlacement& placement, const ExpertLoad& load);
// How an expert's rows in one exchange split over its replicas, as the dispatch rule does it:
// kEven, an even share each (--replica-dispatch spread, and own-rank's expectation); kLeastLoaded
// (--replica-dispatch balanced, the default), the single-replica experts' rows first, then each
// replicated expert's rows one at a time, heaviest expert first, to its replica on the least
// loaded rank. The recording sums the ranks' exchanges, so this models the senders' own choices
// as one: a bound the dispatch approaches, not a replay of it.
enum class ReplicaShare { kEven, kLeastLoaded };

// The same over the sampled single exchanges (ExpertLoad::exchanges) instead of the window's
// sums: what the measured imbalance counts. nullopt without samples.
std::optional<double> PredictedExchangeImbalance(const ExpertPlacement& placement,
                                                 const ExpertLoad& load,
                                                 ReplicaShare share = ReplicaShare::kLeastLoaded);

}  // namespace sy
