// The expert-parallel load balancer (plan/eplb.h), placements (model/expert_placement.h) and
// measured loads (model/expert_load.h): DeepSeek's published example, balance on skewed loads,
// invariants on random ones, the policy choice, and every malformed placement named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "model/config.h"
#include "model/expert_load.h"
#include "model/expert_placement.h"
#include "plan/eplb.h"
#include "plan/expert_balance.h"
#include "plan/planner.h"

namespace sy {
namespace {

ExpertLoad LoadOf(const std::vector<std::vector<int64_t>>& counts) {
  ExpertLoad load;
  load.experts = static_cast<int64_t>(counts[0].size());
  load.top_k = 1;
  for (size_t l = 0; l < counts.size(); ++l)
    load.layers.push_back(static_cast<int64_t>(l));
  load.counts = counts;
  return load;
}

// The example in DeepSeek's EPLB README: 2 layers of 12 experts in 4 groups, 16 physical experts
// on 8 GPUs in 2 nodes (hierarchical). Its printed phy2log is the expected output.
TEST(Eplb, ReproducesDeepSeeksPublishedExample) {
  const ExpertLoad load = LoadOf({{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                                  {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}});
  EplbOptions options;
  options.ranks = 8;
  options.nodes = 2;
  options.groups = 4;
  options.redundant = 4;
  ASSERT_TRUE(UsesHierarchicalPolicy(options));
  auto placement = RebalanceExperts(load, options);
  ASSERT_TRUE(placement.ok()) << placement.status().message();
  EXPECT_EQ(placement->physical[0],
            (std::vector<int32_t>{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1}));
  EXPECT_EQ(placement->physical[1],
            (std::vector<int32_t>{7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}));
}

// A Zipf-like skew (expert i draws ∝ 1/(i+1)^s, shuffled per layer).
ExpertLoad SkewedLoad(int64_t experts, int layers, double s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> counts;
  for (int l = 0; l < layers; ++l) {
    std::vector<int64_t> c(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e)
      c[e] = static_cast<int64_t>(100000.0 / std::pow(static_cast<double>(e + 1), s));
    std::shuffle(c.begin(), c.end(), rng);
    counts.push_back(c);
  }
  return LoadOf(counts);
}

TEST(Eplb, RedundantExpertsBringSkewedLoadNearTheMean) {
  for (int ranks : {4, 8}) {
    const ExpertLoad load = SkewedLoad(64, 4, 0.8, 7);
    const ExpertPlacement before = DefaultPlacement(load.layers, 64, ranks, 0);
    EplbOptions options;
    options.ranks = ranks;
    options.redundant = ranks;
    auto after = RebalanceExperts(load, options);
    ASSERT_TRUE(after.ok()) << after.status().message();
    const double was = PredictedImbalance(before, load), now = PredictedImbalance(*after, load);
    EXPECT_GT(was, 1.3) << ranks;  // the skew is real
    EXPECT_LT(now, 1.05) << ranks << " ranks: " << was << " → " << now;
    // Without redundant experts the packing alone already helps.
    options.redundant = 0;
    EXPECT_LT(PredictedImbalance(RebalanceExperts(load, options).value(), load), was);
  }
}

TEST(Eplb, EveryExpertPlacedAndSlotsEqualOnRandomLoads) {
  std::mt19937 rng(1);
  struct Shape {
    int64_t experts;
    int ranks, nodes;
    int64_t groups, redundant;
  };
  for (const Shape& s : {Shape{16, 4, 1, 4, 0}, Shape{16, 4, 2, 4, 4}, Shape{12, 8, 2, 4, 4},
                         Shape{32, 4, 4, 8, 8}, Shape{24, 6, 2, 3, 6}, Shape{256, 32, 4, 8, 32},
                         Shape{16, 2, 1, 1, 16}, Shape{8, 8, 1, 1, 0}}) {
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<std::vector<int64_t>> counts(3, std::vector<int64_t>(s.experts));
      std::uniform_int_distribution<int64_t> draw(0, trial == 0 ? 0 : 1000);
      for (auto& layer : counts)
        for (auto& c : layer)
          c = draw(rng);
      EplbOptions options{s.ranks, s.nodes, s.redundant, s.groups};
      auto placement = RebalanceExperts(LoadOf(counts), options);
      ASSERT_TRUE(placement.ok()) << placement.status().message();
      EXPECT_EQ(placement->slots_per_rank, (s.experts + s.redundant) / s.ranks);
      const Status check = CheckPlacement(*placement, {0, 1, 2}, s.experts, s.ranks, s.redundant);
      EXPECT_TRUE(check.ok()) << check.message() << " E=" << s.experts << " N=" << s.ranks;
    }
  }
}

TEST(Eplb, HierarchicalWhenGroupsDivideOverNodesGlobalOtherwise) {
  EXPECT_TRUE(UsesHierarchicalPolicy({8, 2, 8, 4}));
  EXPECT_TRUE(UsesHierarchicalPolicy({8, 1, 0, 3}));
  EXPECT_FALSE(UsesHierarchicalPolicy({8, 4, 8, 6}));
  // Hierarchical: a group's experts (and their replicas) stay on the node its group went to.
  const ExpertLoad load = SkewedLoad(32, 2, 1.0, 3);
  EplbOptions options{8, 2, 8, 4};
  auto p = RebalanceExperts(load, options).value();
  const int64_t per_node = p.slots_per_rank * (options.ranks / options.nodes);
  for (const auto& slots : p.physical) {
    std::vector<std::set<int64_t>> group_nodes(4);
    for (size_t i = 0; i < slots.size(); ++i)
      group_nodes[slots[i] / 8].insert(static_cast<int64_t>(i) / per_node);
    for (const auto& nodes : group_nodes)
      EXPECT_EQ(nodes.size(), 1u);
  }
  // Global (6 groups over 4 nodes): still valid and balanced, groups free to split.
  options = {8, 4, 8, 6};
  auto global = RebalanceExperts(SkewedLoad(48, 2, 1.0, 3), options);
  ASSERT_TRUE(global.ok());
  EXPECT_TRUE(CheckPlacement(*global, {0, 1}, 48, 8, 8).ok());
}

// Renaming ranks keeps the balance and moves only what must move: a placement that is the
// current one with its ranks shuffled moves nothing, and on random loads the renamed placement
// never moves more experts than the balancer's own and predicts the same imbalance.
TEST(Eplb, RenamedRanksKeepHeldExpertsWhereTheyAre) {
  auto moved = [](const ExpertPlacement& from, const ExpertPlacement& to) {
    int64_t count = 0;
    for (size_t l = 0; l < to.layers.size(); ++l)
      for (int r = 0; r < to.ranks; ++r) {
        const auto had = HeldExperts(*from.Layer(to.layers[l]), from.slots_per_rank, r);
        for (int32_t e : HeldExperts(to.physical[l], to.slots_per_rank, r))
          count += std::binary_search(had.begin(), had.end(), e) ? 0 : 1;
      }
    return count;
  };
  std::mt19937 random(7);
  for (int trial = 0; trial < 20; ++trial) {
    ExpertLoad load;
    load.experts = 32;
    load.layers = {1, 2, 3};
    for (size_t l = 0; l < load.layers.size(); ++l) {
      std::vector<int64_t> counts(32);
      for (auto& c : counts)
        c = static_cast<int64_t>(random() % 1000);
      load.counts.push_back(counts);
    }
    EplbOptions options;
    options.ranks = 4;
    options.redundant = 4;
    auto current = RebalanceExperts(load, options);
    ASSERT_TRUE(current.ok());
    // The same placement with its ranks rotated moves every expert; renamed back, none.
    ExpertPlacement rotated = current.value();
    for (auto& slots : rotated.physical)
      std::rotate(slots.begin(), slots.begin() + 9, slots.end());
    EXPECT_GT(moved(current.value(), rotated), 0);
    EXPECT_EQ(moved(current.value(), KeepHeldExperts(rotated, current.value())), 0);
    // A new load's placement: fewer or as many moves, the same balance, still a placement.
    for (auto& counts : load.counts)
      for (auto& c : counts)
        c += static_cast<int64_t>(random() % 300);
    auto next = RebalanceExperts(load, options);
    ASSERT_TRUE(next.ok());
    const ExpertPlacement kept = KeepHeldExperts(next.value(), current.value());
    EXPECT_LE(moved(current.value(), kept), moved(current.value(), next.value()));
    EXPECT_DOUBLE_EQ(PredictedImbalance(kept, load), PredictedImbalance(next.value(), load));
    EXPECT_TRUE(CheckPlacement(kept, load.layers, 32, 4, 4).ok());
    // Two nodes: ranks are renamed only within their node.
    const ExpertPlacement by_node = KeepHeldExperts(rotated, current.value(), 2);
    for (size_t l = 0; l < rotated.layers.size(); ++l)
      for (int r = 0; r < 4; ++r) {
        const auto mine = HeldExperts(by_node.physical[l], 9, r);
        bool from_same_node = false;
        for (int s = (r / 2) * 2; s < (r / 2) * 2 + 2; ++s)
          from_same_node |= mine == HeldExperts(rotated.physical[l], 9, s);
        EXPECT_TRUE(from_same_node) << "layer " << l << " rank " << r;
      }
  }
}

TEST(Eplb, OptionsThatDoNotFitAreNamed) {
  const ExpertLoad load = SkewedLoad(16, 1, 1.0, 1);
  auto message = [&](EplbOptions o) { return RebalanceExperts(load, o).status().message(); };
  EXPECT_NE(message({3, 1, 0, 1}).find("cannot be spread evenly over 3 ranks"), std::string::npos);
  EXPECT_NE(message({4, 3, 0, 1}).find("--nodes 3 does not divide --ep 4"), std::string::npos);
  EXPECT_NE(message({4, 1, -4, 1}).find("negative"), std::string::npos);
  EXPECT_NE(message({4, 1, 0, 5}).find("5 expert groups"), std::string::npos);
}

TEST(ExpertPlacement, DefaultIsContiguousWithReplicasAfter) {
  const ExpertPlacement p = DefaultPlacement({1, 2}, 16, 4, 4);
  EXPECT_EQ(p.slots_per_rank, 5);
  EXPECT_EQ(p.redundant(), 4);
  EXPECT_EQ(HeldExperts(p.physical[0], 5, 0), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(HeldExperts(p.physical[0], 5, 3), (std::vector<int32_t>{0, 1, 2, 3, 15}));
  EXPECT_TRUE(CheckPlacement(p, {1, 2}, 16, 4, 4).ok());
  // JSON round trip.
  auto parsed = ParseExpertPlacement(ExpertPlacementToJson(p), "p.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->physical, p.physical);
  EXPECT_EQ(parsed->layers, p.layers);
}

TEST(ExpertPlacement, BadPlacementsAreNamed) {
  auto error = [](const std::string& text) {
    auto p = ParseExpertPlacement(text, "p.json");
    return p.ok() ? std::string("accepted") : p.status().message();
  };
  EXPECT_NE(
      error(R"({"experts": 4, "ranks": 2, "layers": [{"layer": 1, "ranks": [[0, 1], [1, 2]]}]})")
          .find("p.json: layers[0] (layer 1): expert 3 has no replica"),
      std::string::npos);
  EXPECT_NE(
      error(R"({"experts": 4, "ranks": 2, "layers": [{"layer": 1, "ranks": [[0, 1, 2], [3]]}]})")
          .find("rank 1 has 1 slots"),
      std::string::npos);
  EXPECT_NE(
      error(R"({"experts": 4, "ranks": 2, "layers": [{"layer": 1, "ranks": [[0, 1], [2, 4]]}]})")
          .find("rank 1 slot 1 is 4, not an expert id in [0, 4)"),
      std::string::npos);
  EXPECT_NE(error(R"({"experts": 4, "ranks": 2, "layers": [{"layer": 1, "ranks": [[0, 1]]}]})")
                .find("'ranks' must list the slots of 2 ranks"),
            std::string::npos);
  EXPECT_NE(
      error(
          R"({"experts": 4, "ranks": 2, "redundant_experts": 2, "layers": [{"layer": 1, "ranks": [[0, 1], [2, 3]]}]})")
          .find("'redundant_experts' is 2"),
      std::string::npos);
  EXPECT_NE(error("[1, 2]").find("p.json: not a JSON object"), std::string::npos);
  // Against the model: a missing layer, a wrong rank count, redundant count, a stray layer.
  const ExpertPlacement p = DefaultPlacement({1, 2}, 16, 4, 4);
  EXPECT_EQ(CheckPlacement(p, {1, 2, 3}, 16, 4, 4).message(),
            "the placement has no layer 3 (a MoE layer of the model)");
  EXPECT_NE(CheckPlacement(p, {1, 2}, 16, 2, 4).message().find("for 4 ranks, this run has 2"),
            std::string::npos);
  EXPECT_NE(CheckPlacement(p, {1, 2}, 16, 4, 0).message().find("5 slots per rank"),
            std::string::npos);
  EXPECT_NE(CheckPlacement(p, {1}, 16, 4, 4).message().find("layer 2, which is not a MoE layer"),
            std::string::npos);
}

TEST(ExpertLoad, RecorderCountsSlotsStepsAndTokens) {
  ExpertLoadRecorder recorder({1, 2, 3}, 4, 2);
  ExpertRouting routing;
  routing.tokens = 3;
  routing.top_k = 2;
  routing.expert_ids = {0, 1, 1, 2, 3, 1};
  for (int step = 0; step < 2; ++step)
    for (int64_t layer : {1, 1, 2, 3})  // two micro-batches of layer 1, then the rest
      recorder.Record(layer, routing);
  recorder.Record(3, routing);  // an MTP pass: no step
  ExpertLoad load = recorder.Snapshot();
  EXPECT_EQ(load.steps, 2);
  EXPECT_EQ(load.tokens, 12);
  EXPECT_EQ(load.counts[0], (std::vector<int64_t>{4, 12, 4, 4}));
  EXPECT_EQ(load.counts[2], (std::vector<int64_t>{3, 9, 3, 3}));
  // JSON round trip keeps every field.
  load.ranks = 2;
  load.imbalance = 1.25;
  auto parsed = ParseExpertLoad(ExpertLoadToJson(load), "load.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->counts, load.counts);
  EXPECT_EQ(parsed->steps, 2);
  EXPECT_EQ(parsed->tokens, 12);
  EXPECT_EQ(parsed->ranks, 2);
  EXPECT_DOUBLE_EQ(parsed->imbalance.value(), 1.25);
  EXPECT_NE(ParseExpertLoad(
                R"({"experts": 2, "top_k": 1, "layers": [{"layer": 1, "counts": [1]}]})", "l.json")
                .status()
                .message()
                .find("l.json: layers[0] (layer 1): 'counts' must list 2 experts"),
            std::string::npos);
  // A rank count past an int is refused, not wrapped (found by the fuzzer: the written file
  // then failed to parse).
  EXPECT_NE(ParseExpertLoad(R"({"experts": 2, "top_k": 1, "ranks": 4444444444442,
                               "layers": [{"layer": 1, "counts": [1, 2]}]})",
                            "l.json")
                .status()
                .message()
                .find("l.json: 'ranks' 4444444444442 is too many"),
            std::string::npos);
  recorder.Clear();
  EXPECT_EQ(recorder.Snapshot().steps, 0);
}

// Single exchanges are sampled per layer, the same ones for the same sequence of calls (so
// every rank keeps the same and the root adds them up), at most kExchangeSamples, across
// windows, and they survive the JSON round trip; malformed samples are named.
TEST(ExpertLoad, RecorderSamplesSingleExchanges) {
  ExpertRouting routing;
  routing.top_k = 2;
  auto run = [&](ExpertLoadRecorder& recorder, int calls) {
    for (int i = 0; i < calls; ++i) {
      routing.tokens = 1 + i % 3;
      routing.expert_ids.clear();
      for (int64_t k = 0; k < routing.tokens * 2; ++k)
        routing.expert_ids.push_back(static_cast<int32_t>((i + k) % 4));
      recorder.Record(1, routing);
    }
  };
  ExpertLoadRecorder few({1}, 4, 2), many({1}, 4, 2), again({1}, 4, 2);
  run(few, 5);
  ASSERT_EQ(few.Snapshot().exchanges[0].size(), 5u);
  EXPECT_EQ(few.Snapshot().exchanges[0][0], (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(few.Snapshot().exchanges[0][1], (std::vector<int64_t>{1, 1, 1, 1}));
  run(many, 1000);
  run(again, 1000);
  const ExpertLoad load = many.Snapshot();
  ASSERT_EQ(load.exchanges[0].size(), static_cast<size_t>(kExchangeSamples));
  EXPECT_EQ(load.exchanges, again.Snapshot().exchanges);
  // A sample of the whole window, not its first exchanges.
  ExpertLoadRecorder first({1}, 4, 2);
  run(first, static_cast<int>(kExchangeSamples));
  EXPECT_NE(load.exchanges, first.Snapshot().exchanges);
  for (const auto& sample : load.exchanges[0]) {
    int64_t slots = 0;
    for (int64_t c : sample)
      slots += c;
    EXPECT_TRUE(slots == 2 || slots == 4 || slots == 6) << slots;
  }
  auto parsed = ParseExpertLoad(ExpertLoadToJson(load), "load.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->exchanges, load.exchanges);
  EXPECT_NE(ParseExpertLoad(R"({"experts": 2, "top_k": 1, "layers": [{"layer": 1, "counts": [1, 2],
                               "exchanges": [[1, 2], [3]]}]})",
                            "l.json")
                .status()
                .message()
                .find("l.json: layers[0] (layer 1): exchanges[1] must list 2 experts"),
            std::string::npos);
  EXPECT_NE(ParseExpertLoad(R"({"experts": 2, "top_k": 1, "layers": [{"layer": 1, "counts": [1, 2],
                               "exchanges": [[1, -2]]}]})",
                            "l.json")
                .status()
                .message()
                .find("exchanges[0] must hold non-negative integers"),
            std::string::npos);
  // A new window keeps sampling where the last one left off (windows of online rebalancing
  // are a few steps each).
  many.Clear();
  EXPECT_EQ(many.Snapshot().exchanges, load.exchanges);
  EXPECT_EQ(many.Snapshot().counts[0], (std::vector<int64_t>(4, 0)));
}

// Experts hot in the same exchanges: the window's sums are even, so the greedy steps may put
// them on one rank (here they do: 0 and 2, 1 and 3), and every exchange then has a rank with
// all of its load. The refinement for the sampled exchanges separates them.
TEST(Eplb, RefinementSeparatesExpertsHotInTheSameExchanges) {
  ExpertLoad load = LoadOf({{10, 10, 10, 10}});
  EplbOptions options;
  options.ranks = 2;
  auto greedy = RebalanceExperts(load, options);
  ASSERT_TRUE(greedy.ok());
  EXPECT_EQ(greedy->physical[0], (std::vector<int32_t>{0, 2, 1, 3}));
  load.exchanges = {{{5, 0, 5, 0}, {0, 5, 0, 5}}};
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(greedy.value(), load).value(), 2.0);
  auto refined = RebalanceExperts(load, options);
  ASSERT_TRUE(refined.ok());
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(refined.value(), load).value(), 1.0);
  EXPECT_DOUBLE_EQ(PredictedImbalance(refined.value(), load), 1.0);  // the sums stay even
  std::vector<int32_t> held = refined->physical[0];
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(PredictedExchangeImbalance(greedy.value(), LoadOf({{10, 10, 10, 10}})));
}

// A replicated expert's rows: an even share on each replica's rank, or the least loaded rank's
// replica first, as --replica-dispatch spread and balanced send them.
TEST(PredictedExchangeImbalance, ModelsTheReplicaShare) {
  ExpertPlacement p;
  p.experts = 3;
  p.ranks = 2;
  p.slots_per_rank = 2;
  p.layers = {0};
  p.physical = {{0, 2, 1, 2}};  // expert 2 on both ranks
  ExpertLoad load = LoadOf({{6, 2, 4}});
  load.exchanges = {{{6, 2, 4}}};
  // Even: rank 0 gets 6 + 2, rank 1 gets 2 + 2; the mean is 6.
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(p, load, ReplicaShare::kEven).value(), 8.0 / 6.0);
  // Least loaded: expert 2's four rows all go to rank 1 (2 → 6), level with rank 0.
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(p, load, ReplicaShare::kLeastLoaded).value(), 1.0);
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(p, load).value(), 1.0);  // the default
  // {3, 2, 7}: rank 1 first (2 → 3), then the rows alternate from the lower rank on: 6 and 6.
  load.exchanges = {{{3, 2, 7}}};
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(p, load, ReplicaShare::kLeastLoaded).value(), 1.0);
  EXPECT_DOUBLE_EQ(PredictedExchangeImbalance(p, load, ReplicaShare::kEven).value(), 6.5 / 6.0);
}

// On random loads with replicas: never worse than the greedy placement by the objective, no
// rank with fewer distinct experts than before, every expert still placed as often.
TEST(Eplb, RefinementNeverWorsensAndKeepsReplicas) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t experts = 16;
    std::vector<int64_t> counts(experts);
    std::vector<std::vector<int64_t>> samples(12, std::vector<int64_t>(experts));
    for (auto& sample : samples)
      for (int64_t e = 0; e < experts; ++e) {
        sample[e] = static_cast<int64_t>(rng() % (e % 5 == 0 ? 40 : 8));
        counts[e] += sample[e];
      }
    ExpertLoad load = LoadOf({counts});
    EplbOptions options;
    options.ranks = 4;
    options.redundant = 4;
    const ExpertPlacement greedy = RebalanceExperts(load, options).value();
    load.exchanges = {samples};
    const ExpertPlacement refined = RebalanceExperts(load, options).value();
    const double before = PredictedExchangeImbalance(greedy, load, ReplicaShare::kEven).value() +
                          PredictedImbalance(greedy, load);
    const double after = PredictedExchangeImbalance(refined, load, ReplicaShare::kEven).value() +
                         PredictedImbalance(refined, load);
    EXPECT_LE(after, before + 1e-9) << "trial " << trial;
    std::vector<int32_t> a = greedy.physical[0], b = refined.physical[0];
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(a, b);
    for (int r = 0; r < 4; ++r)  // no swap puts a second replica of an expert on a rank
      EXPECT_GE(HeldExperts(refined.physical[0], refined.slots_per_rank, r).size(),
                HeldExperts(greedy.physical[0], greedy.slots_per_rank, r).size());
  }
}

TEST(ExpertLoad, ImbalanceIsBusiestOverMeanSummedOverExchanges) {
  // Two ranks, three exchanges: (3, 1), (2, 2), (0, 0) → (3 + 2) / (2 + 2).
  std::vector<double> per_layer;
  EXPECT_DOUBLE_EQ(ImbalanceOverExchanges({{3, 2, 0}, {1, 2, 0}}, {0, 1, 1}, &per_layer, 2), 1.25);
  EXPECT_DOUBLE_EQ(per_layer[0], 1.5);
  EXPECT_DOUBLE_EQ(per_layer[1], 1.0);
  EXPECT_DOUBLE_EQ(ImbalanceOverExchanges({{0}, {0}}), 1.0);
}

ModelConfig DeepSeekV3() {
  auto config = LoadModelConfig(std::string(SY_SOURCE_DIR) + "/configs/deepseek-v3.json");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return config.value();
}

TEST(PlannerBalance, ZipfLoadIsNormalizedAndHotFirst) {
  const std::vector<double> uniform = plan::ZipfExpertLoad(8, 0);
  for (double v : uniform)
    EXPECT_DOUBLE_EQ(v, 1.0 / 8);
  const std::vector<double> skewed = plan::ZipfExpertLoad(256, 1.0);
  double total = 0;
  for (double v : skewed)
    total += v;
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(skewed[0] / skewed[1], 2.0);
}

// The seed's EP128 deployment of DeepSeek-V3 (256 experts, 8 groups, 16 nodes of 8): balanced
// traffic needs no redundant experts; a Zipf skew of 0.8 needs some, and they bring the
// imbalance to the target.
TEST(PlannerBalance, RedundantExpertsTheSeedsEp128DeploymentNeeds) {
  const ModelConfig v3 = DeepSeekV3();
  const plan::BalanceEstimate even = plan::RedundantExpertsFor(v3, 128, 16, 0.0, 1.10, 256);
  EXPECT_EQ(even.redundant, 0);
  EXPECT_NEAR(even.balanced, 1.0, 1e-9);
  const plan::BalanceEstimate skew = plan::RedundantExpertsFor(v3, 128, 16, 0.8, 1.10, 256);
  EXPECT_GT(skew.contiguous, 1.5);  // a skew like this costs the contiguous placement dearly
  EXPECT_GT(skew.redundant, 0);
  EXPECT_EQ((256 + skew.redundant) % 128, 0);
  EXPECT_LE(skew.balanced, 1.10);
  // Fewer redundant experts do not reach it.
  if (skew.redundant >= 128) {
    EXPECT_GT(plan::EstimateBalance(v3, 128, 16, skew.redundant - 128, 0.8).balanced, 1.10);
  }
}

// The cost model: the MoE stage waits for the busiest rank, and redundant experts cost memory.
TEST(PlannerBalance, ImbalanceSlowsTheMoeStageAndReplicasCostMemory) {
  auto hardware = plan::LoadHardware("H200");
  ASSERT_TRUE(hardware.ok());
  plan::CostModel model(DeepSeekV3(), hardware.value(), {5000, 1, 0.6});
  plan::Deployment balanced{128, 1, 64, plan::Overlap::kNone};
  plan::Deployment skewed = balanced;
  skewed.expert_imbalance = 2.0;
  const plan::Prediction a = model.Predict(balanced), b = model.Predict(skewed);
  EXPECT_GT(b.moe_layer.grouped_gemm, a.moe_layer.grouped_gemm);
  EXPECT_GT(b.moe_layer.dispatch + b.moe_layer.combine, a.moe_layer.dispatch + a.moe_layer.combine);
  EXPECT_LT(b.throughput_tok_s_per_gpu, a.throughput_tok_s_per_gpu);
  plan::Deployment replicated = balanced;
  replicated.redundant_experts = 128;
  EXPECT_NEAR(
      model.Memory(replicated).routed_expert_bytes / model.Memory(balanced).routed_expert_bytes,
      384.0 / 256.0, 1e-9);
  // The planner applies the skew per EP size: its EP128 frontier carries the redundant experts.
  plan::SearchSpace space;
  space.ep = {128};
  space.expert_skew = 0.8;
  const plan::Plan result = plan::MakePlan(model, DeepSeekV3(), space);
  ASSERT_EQ(result.balance.size(), 1u);
  EXPECT_EQ(result.configs.front().deployment.redundant_experts, result.balance[0].redundant);
  EXPECT_NE(plan::PlanToTable(result, hardware.value()).find("redundant experts"),
            std::string::npos);
}

}  // namespace
}  // namespace sy
