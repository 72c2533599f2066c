// Online expert moves without MPI: which rank sends which expert (every new slot filled once,
// from a holder, the work shared), and the wire form of an expert (the same bytes back, every
// malformed message refused with its reason). The moves under mpirun are in
// expert_placement_test.cc.
#include "parallel/expert_migration.h"

#include "model/expert_wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "model/model.h"
#include "tensor/packed_matrix.h"
#include "test_support.h"

namespace sy {
namespace {

ExpertPlacement Placement(std::vector<std::vector<int32_t>> physical, int ranks, int64_t experts) {
  ExpertPlacement p;
  p.experts = experts;
  p.ranks = ranks;
  p.slots_per_rank = static_cast<int64_t>(physical.front().size()) / ranks;
  for (size_t l = 0; l < physical.size(); ++l)
    p.layers.push_back(static_cast<int64_t>(l) + 1);
  p.physical = std::move(physical);
  return p;
}

TEST(PlanExpertMoves, EveryNewSlotIsFilledOnceFromAHolder) {
  // 8 experts, 4 ranks, 1 redundant slot each (3 slots a rank); layer 2 keeps its placement.
  const ExpertPlacement current =
      Placement({{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}}, 4, 8);
  const ExpertPlacement next =
      Placement({{7, 6, 5, 4, 3, 2, 1, 0, 7, 7, 7, 7}, {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}}, 4, 8);
  const std::vector<ExpertMove> moves = PlanExpertMoves(current, next);
  std::set<std::pair<int, int32_t>> arrivals;
  std::vector<int> sent(4, 0);
  for (const ExpertMove& m : moves) {
    EXPECT_EQ(m.layer_index, 0u) << "an unchanged layer moves nothing";
    const auto held_now = HeldExperts(current.physical[0], 3, m.source);
    EXPECT_TRUE(std::binary_search(held_now.begin(), held_now.end(), m.expert));
    const auto had = HeldExperts(current.physical[0], 3, m.destination);
    EXPECT_FALSE(std::binary_search(had.begin(), had.end(), m.expert));
    EXPECT_TRUE(arrivals.insert({m.destination, m.expert}).second) << "sent twice";
    ++sent[static_cast<size_t>(m.source)];
  }
  // Every expert a rank holds next and did not hold arrives.
  for (int r = 0; r < 4; ++r) {
    const auto had = HeldExperts(current.physical[0], 3, r);
    for (int32_t e : HeldExperts(next.physical[0], 3, r))
      EXPECT_EQ(arrivals.count({r, e}), std::binary_search(had.begin(), had.end(), e) ? 0u : 1u)
          << "rank " << r << " expert " << e;
  }
  // Six moves; an expert with two holders is sent by the one with fewer sends so far (expert 1
  // to rank 2 comes from rank 3, rank 0 having sent expert 2 already).
  EXPECT_EQ(moves.size(), 6u);
  EXPECT_TRUE(arrivals.count({2, 1}));
  for (const ExpertMove& m : moves)
    if (m.destination == 2 && m.expert == 1) {
      EXPECT_EQ(m.source, 3);
    }
  const int most = *std::max_element(sent.begin(), sent.end());
  EXPECT_LE(most, 2 * static_cast<int>(moves.size() + 3) / 4);
}

TEST(PlanExpertMoves, TheSamePlacementMovesNothing) {
  const ExpertPlacement p = Placement({{0, 1, 2, 3, 0, 1}}, 2, 4);
  EXPECT_TRUE(PlanExpertMoves(p, p).empty());
}

struct WireCase {
  std::string name;
  std::string checkpoint;  // under the fixtures
  bool pack;
};

// The first MoE layer of a model (experts start after its dense layers).
int64_t FirstMoeLayer(const ModelConfig& config) {
  int64_t layer = 0;
  while (!config.IsMoeLayer(layer))
    ++layer;
  return layer;
}

class ExpertWireForm : public ::testing::TestWithParam<WireCase> {};

// An expert, packed (panels travel) or not (rows and block scales travel): what arrives is the
// same bytes as what was sent and as a fresh load of the checkpoint, and a changed byte is seen.
// fp8, and an int4 checkpoint's 4-bit blocks (GGML panels with their scales, as a GGUF's travel;
// gguf_parallel_test moves a GGUF's under mpirun).
TEST_P(ExpertWireForm, AnExpertArrivesAsTheSameBytes) {
  const WireCase& c = GetParam();
  WeightLoadOptions options;
  options.pack = c.pack;
  auto model = Model::Load(std::string(testing::kFixturesDir) + "/" + c.checkpoint, options);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ModelConfig& config = model.value()->config();
  const int64_t layer = FirstMoeLayer(config);
  const FeedForwardWeights* held = model.value()->RoutedExpert(layer, 1);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->gate_proj.packed != nullptr, c.pack);
  const std::vector<uint8_t> bytes = SerializeExpert(*held);
  auto arrived = DeserializeExpert(bytes, config.moe_intermediate_size, config.hidden_size);
  ASSERT_TRUE(arrived.ok()) << arrived.status().message();
  EXPECT_TRUE(SameExpertBytes(arrived.value(), *held).ok());
  auto fresh = model.value()->LoadRoutedExpert(layer, 1);
  ASSERT_TRUE(fresh.ok()) << fresh.status().message();
  EXPECT_TRUE(SameExpertBytes(arrived.value(), fresh.value()).ok());
  auto other = model.value()->LoadRoutedExpert(layer, 2);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(SameExpertBytes(arrived.value(), other.value()).ok());

  // One byte changed in the middle of the weights: still a well-formed message, other bytes.
  std::vector<uint8_t> changed = bytes;
  changed[changed.size() / 2] ^= 0x01;
  auto wrong = DeserializeExpert(changed, config.moe_intermediate_size, config.hidden_size);
  if (wrong.ok()) {
    EXPECT_FALSE(SameExpertBytes(wrong.value(), *held).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ExpertWireForm,
                         ::testing::Values(WireCase{"fp8_packed", "tiny-v3-fp8", true},
                                           WireCase{"fp8_rows", "tiny-v3-fp8", false},
                                           WireCase{"awq_int4_panels", "hf-int4/awq", true},
                                           WireCase{"gptq_int4_blocks", "hf-int4/gptq", false}),
                         [](const ::testing::TestParamInfo<WireCase>& info) {
                           return info.param.name;
                         });

// bf16 experts laid out as AMX tiles (PackedMatrix::bf16_pairs, --amx-bf16) travel with their
// layout and arrive in the receiver's: a process that packs columns gets columns, one that packs
// pairs gets pairs, and either way the bytes of a fresh load there.
TEST(ExpertWireForm, Bf16PairsArriveInTheReceiversLayout) {
  for (bool sender_pairs : {true, false}) {
    GlobalBf16Pairs() = sender_pairs;
    auto model = Model::Load(std::string(testing::kFixturesDir) + "/tiny-v3-bf16");
    GlobalBf16Pairs() = false;
    ASSERT_TRUE(model.ok()) << model.status().message();
    const ModelConfig& config = model.value()->config();
    const int64_t layer = FirstMoeLayer(config);
    const FeedForwardWeights* held = model.value()->RoutedExpert(layer, 1);
    ASSERT_NE(held, nullptr);
    ASSERT_NE(held->gate_proj.packed, nullptr);
    EXPECT_EQ(held->gate_proj.packed->bf16_pairs, sender_pairs);
    EXPECT_EQ(held->down_proj.packed->bf16_pairs, sender_pairs);
    const std::vector<uint8_t> bytes = SerializeExpert(*held);
    for (bool receiver_pairs : {true, false}) {
      GlobalBf16Pairs() = receiver_pairs;
      auto arrived = DeserializeExpert(bytes, config.moe_intermediate_size, config.hidden_size);
      auto fresh = model.value()->LoadRoutedExpert(layer, 1);
      GlobalBf16Pairs() = false;
      ASSERT_TRUE(arrived.ok()) << arrived.status().message();
      ASSERT_TRUE(fresh.ok()) << fresh.status().message();
      EXPECT_EQ(arrived.value().up_proj.packed->bf16_pairs, receiver_pairs);
      const Status same = SameExpertBytes(arrived.value(), fresh.value());
      EXPECT_TRUE(same.ok()) << "sent pairs " << sender_pairs << ", received pairs "
                             << receiver_pairs << ": " << same.message();
    }
  }
}

// The GGML block type travels with a quantized expert: one this build does not know, or one whose
// blocks do not fit the expert's columns, is refused by name.
TEST(ExpertWireForm, AnUnknownBlockTypeIsRefused) {
  auto model = Model::Load(std::string(testing::kFixturesDir) + "/hf-int4/awq");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ModelConfig& c = model.value()->config();
  const int64_t layer = FirstMoeLayer(c);
  std::vector<uint8_t> bytes = SerializeExpert(*model.value()->RoutedExpert(layer, 0));
  // gate_proj: magic (4), element type (1), five sizes (40), then the block type.
  const size_t type_at = 4 + 1 + 5 * 8;
  ASSERT_TRUE(DeserializeExpert(bytes, c.moe_intermediate_size, c.hidden_size).ok());
  const std::pair<uint32_t, std::string> cases[] = {
      {0xdeadbeefu, "gate_proj: GGML block type 3735928559 does not fit"},
      {8u, "bytes of panels where"}};  // Q8_0: a byte a code, not four bits
  for (const auto& [type, reason] : cases) {
    std::vector<uint8_t> changed = bytes;
    std::memcpy(changed.data() + type_at, &type, 4);
    auto r = DeserializeExpert(changed, c.moe_intermediate_size, c.hidden_size);
    ASSERT_FALSE(r.ok()) << type;
    EXPECT_NE(r.status().message().find(reason), std::string::npos) << r.status().message();
  }
}

TEST(ExpertWireForm, MalformedMessagesAreRefusedWithTheirReason) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  auto model = Model::Load(fixture.directory);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const ModelConfig& c = model.value()->config();
  const int64_t layer = FirstMoeLayer(c);
  const std::vector<uint8_t> bytes = SerializeExpert(*model.value()->RoutedExpert(layer, 0));
  const int64_t W = c.moe_intermediate_size, D = c.hidden_size;
  auto refused = [&](const std::vector<uint8_t>& message, int64_t w, int64_t d,
                     const std::string& reason) {
    auto r = DeserializeExpert(message, w, d);
    ASSERT_FALSE(r.ok()) << reason;
    EXPECT_NE(r.status().message().find(reason), std::string::npos) << r.status().message();
  };
  refused({}, W, D, "ends at byte 0");
  refused(std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 3), W, D,
          "more were due");
  refused(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1), W, D, "down_proj");
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  refused(longer, W, D, "bytes left");
  refused(bytes, W + 16, D, "where the model's experts are");
  std::vector<uint8_t> not_expert = bytes;
  not_expert[0] ^= 0xff;
  refused(not_expert, W, D, "not an expert's message");
  std::vector<uint8_t> bad_type = bytes;
  bad_type[4] = 0xee;  // gate_proj's element type
  refused(bad_type, W, D, "element type");
  // Every prefix is refused, never read past its end.
  for (size_t n = 0; n < bytes.size(); n += 97) {
    auto r = DeserializeExpert(std::vector<uint8_t>(bytes.begin(), bytes.begin() + n), W, D);
    EXPECT_FALSE(r.ok()) << n;
  }
}

}  // namespace
}  // namespace sy
