// The expert-parallel load balancer (EPLB), written from DeepSeek's published description
// (github.com/deepseek-ai/EPLB): from each MoE layer's measured expert load, choose R redundant
// replicas and a placement of the E + R physical experts on N ranks so that the busiest rank's
// load is as close to the mean as the greedy steps get.
//
// Hierarchical policy, when the expert groups divide evenly over the nodes (group-limited routing
// then keeps a token's experts on few nodes):
//   1. pack the expert groups onto nodes, each node the same number, balancing their load;
//   2. within each node, replicate experts until the node's physical slots are full, each new
//      replica going to the expert with the highest load per replica;
//   3. pack each node's physical experts onto its ranks, S per rank, heaviest first onto the
//      lightest rank with room.
// Global policy otherwise: the same with one group and one node.
// No MPI: the offline verb (`switchyard eplb`) and the planner use it.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "model/expert_load.h"
#include "model/expert_placement.h"

namespace sy {

struct EplbOptions {
  int ranks = 1;          // expert-parallel ranks N
  int nodes = 1;          // hosts the ranks are spread over (consecutive ranks per node)
  int64_t redundant = 0;  // R: (E + R) must divide by N
  int64_t groups = 1;     // expert groups (the config's n_group); must divide E
};

// Items of `weights` packed into `packs` packs of weights.size() / packs items each: heaviest
// first, each onto the lightest pack that still has room (ties: the lower pack). pack[i] and
// position[i] (the order it joined its pack) per item.
void BalancedPacking(const std::vector<double>& weights, int packs, std::vector<int>* pack,
                     std::vector<int>* position);

// `physical` replicas of weights.size() logical experts: the first E are the experts themselves,
// each further one goes to the expert with the highest load per replica (ties: the lower id).
// Returns physical → logical; replicas[e] is expert e's replica count.
std::vector<int32_t> ReplicateExperts(const std::vector<double>& weights, int64_t physical,
                                      std::vector<int>* replicas);

// One layer: physical slot (rank · S + slot) → logical expert. With `exchanges` (sampled single
// exchanges' counts, ExpertLoad::exchanges), the greedy placement is then refined for them
// (RefineForExchanges).
std::vector<int32_t> RebalanceLayer(const std::vector<double>& load, const EplbOptions& options,
                                    bool hierarchical,
                                    const std::vector<std::vector<int64_t>>& exchanges = {});

// Not in DeepSeek's algorithm. The greedy steps balance the window's sum, but a step's cost is
// its busiest rank in each exchange, and experts that are hot in the same exchanges can share a
// rank while the sums still balance. This swaps two slots between two ranks (ranks of one node
// when `nodes` > 1; never two replicas of an expert on one rank) while the objective falls:
//   Σ over sampled exchanges of the busiest rank / Σ of the mean rank
//   + the same ratio for the window's sum.
// The first improving swap is taken each time, and at most `budget` exchange evaluations are
// spent, so a layer costs at most tens of milliseconds. Replica counts do not change, and each
// replica carries an even share of its expert's tokens.
void RefineForExchanges(std::vector<int32_t>& slots, const std::vector<double>& load,
                        const std::vector<std::vector<int64_t>>& exchanges, int64_t per_rank,
                        int nodes, int64_t budget = int64_t{1} << 22);

// True when the hierarchical policy applies: groups divide evenly over the nodes.
bool UsesHierarchicalPolicy(const EplbOptions& options);

// Every layer of `load`. Errors name the option that does not fit.
Result<ExpertPlacement> RebalanceExperts(const ExpertLoad& load, const EplbOptions& options);

// `next` with each layer's ranks renamed so that as many experts as possible stay where
// `current` has them: the balance is the same (a rank's set of experts moves whole), and an
// online rebalance moves only what it must. Ranks are renamed within their node only (nodes
// hold `ranks / nodes` consecutive ranks, as the hierarchical policy packs them): greedily, the
// pair of a new rank and an old one that share the most experts first (ties: lower ranks).
ExpertPlacement KeepHeldExperts(const ExpertPlacement& next, const ExpertPlacement& current,
                                int nodes = 1);

}  // namespace sy
