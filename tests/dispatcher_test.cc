// The dispatcher in one process (the in-process communicator): rows reach their experts grouped
// by local expert and come back to their slots, exactly in f32, within bf16 rounding in bf16,
// and within e4m3's rounding of each 128-value block's scale in fp8.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/feed_forward.h"
#include "parallel/communicator.h"
#include "parallel/expert_parallel.h"

namespace sy {
namespace {

constexpr int64_t kExperts = 8, kTopK = 2, kTokens = 5, kHidden = 300;  // 300: a partial block

ExpertRouting RandomRouting(std::mt19937& rng) {
  ExpertRouting routing;
  routing.tokens = kTokens;
  routing.top_k = kTopK;
  for (int64_t t = 0; t < kTokens; ++t) {
    const int32_t first = static_cast<int32_t>(rng() % kExperts);
    routing.expert_ids.push_back(first);
    routing.expert_ids.push_back((first + 1 + static_cast<int32_t>(rng() % (kExperts - 1))) %
                                 kExperts);
    routing.weights.insert(routing.weights.end(), {0.5f, 0.5f});
  }
  SortByExpert(routing, kExperts);
  return routing;
}

class DispatcherTest : public ::testing::TestWithParam<DType> {};

TEST_P(DispatcherTest, RowsReachTheirExpertsAndComeBack) {
  const DType wire = GetParam();
  Communicator& comm = WorldCommunicator();
  ASSERT_EQ(comm.size(), 1);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  ExpertRouting routing = RandomRouting(rng);
  std::vector<float> x(static_cast<size_t>(kTokens * kHidden));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = normal(rng) * (i % kHidden < 128 ? 100.0f : 0.01f);  // blocks of different scale
  ExpertDispatcher dispatcher(comm, kExperts, kHidden, wire);
  dispatcher.DispatchSend(routing, x.data());
  std::vector<int64_t> offsets;
  const std::vector<float> rows = dispatcher.DispatchRecv(&offsets);
  ASSERT_EQ(offsets.size(), static_cast<size_t>(kExperts + 1));
  ASSERT_EQ(offsets.back(), kTokens * kTopK);

  // Per-element bound of the wire format, relative to the value or its block's scale.
  auto bound = [&](const float* source_row, int64_t i, DType format) {
    const float v = std::fabs(source_row[i]);
    if (format == DType::kF32) return 0.0f;
    if (format == DType::kBF16) return v * std::ldexp(1.0f, -8);
    float amax = 0;
    for (int64_t j = i / 128 * 128; j < std::min<int64_t>(kHidden, i / 128 * 128 + 128); ++j)
      amax = std::max(amax, std::fabs(source_row[j]));
    const float scale = amax / 448.0f;
    return std::max(v * std::ldexp(1.0f, -4), scale * std::ldexp(1.0f, -10));
  };
  // Expert e's rows are its slots' tokens, in sorted-slot order.
  for (int64_t e = 0; e < kExperts; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const int64_t slot = routing.sorted_slots[r];
      EXPECT_EQ(routing.expert_ids[slot], e);
      const float* source = x.data() + (slot / kTopK) * kHidden;
      for (int64_t i = 0; i < kHidden; ++i)
        ASSERT_LE(std::fabs(rows[r * kHidden + i] - source[i]), bound(source, i, wire))
            << "row " << r << " value " << i;
    }
  }
  // Back home: the expert "output" is its input doubled; combine travels in bf16 under fp8.
  std::vector<float> doubled(rows.size()), back(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    doubled[i] = 2 * rows[i];
  dispatcher.CombineSend(doubled.data());
  dispatcher.CombineRecv(back.data());
  const DType combine = wire == DType::kF8E4M3 ? DType::kBF16 : wire;
  for (int64_t r = 0; r < kTokens * kTopK; ++r)
    for (int64_t i = 0; i < kHidden; ++i)
      ASSERT_LE(std::fabs(back[r * kHidden + i] - doubled[r * kHidden + i]),
                bound(doubled.data() + r * kHidden, i, combine))
          << "slot " << r << " value " << i;
}

INSTANTIATE_TEST_SUITE_P(Wires, DispatcherTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF8E4M3),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param)) == "F8_E4M3"
                                      ? std::string("fp8")
                                      : std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace sy
