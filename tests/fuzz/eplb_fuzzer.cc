// libFuzzer target for the expert-load and expert-placement JSON parsers and what consumes their
// results: the first byte picks the parser, the rest is the text. Accepted input must survive a
// round trip through the writer, the placement checks, the predicted imbalance and the balancer
// without a crash; every balanced placement must pass CheckPlacement.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/expert_load.h"
#include "model/expert_placement.h"
#include "plan/eplb.h"

using namespace sy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto placement = ParseExpertPlacement(text, "fuzz.json");
    if (!placement.ok()) return 0;
    auto again = ParseExpertPlacement(ExpertPlacementToJson(*placement), "again.json");
    if (!again.ok() || again->physical != placement->physical) std::abort();
    (void)CheckPlacement(*placement, placement->layers, placement->experts, placement->ranks,
                         placement->redundant());
    ExpertLoad load;
    load.experts = placement->experts;
    load.layers = placement->layers;
    load.counts.assign(load.layers.size(), std::vector<int64_t>(load.experts, 1));
    (void)PredictedImbalance(*placement, load);
    return 0;
  }
  auto load = ParseExpertLoad(text, "fuzz.json");
  if (!load.ok()) return 0;
  auto again = ParseExpertLoad(ExpertLoadToJson(*load), "again.json");
  if (!again.ok() || again->counts != load->counts) std::abort();
  if (load->experts > 4096 || load->layers.size() > 64) return 0;  // keep each run quick
  for (int ranks : {1, 2, 3, 4}) {
    EplbOptions options;
    options.ranks = ranks;
    options.nodes = ranks % 2 == 0 ? 2 : 1;
    options.groups = load->groups;
    options.redundant = (ranks - load->experts % ranks) % ranks;
    auto placement = RebalanceExperts(*load, options);
    if (!placement.ok()) continue;
    if (!CheckPlacement(*placement, load->layers, load->experts, ranks, options.redundant).ok())
      std::abort();
    (void)PredictedImbalance(*placement, *load);
  }
  return 0;
}
