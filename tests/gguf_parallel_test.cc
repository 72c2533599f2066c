// A GGUF under tensor parallelism over heads, with real MPI processes (mpirun --oversubscribe):
// a TP2 group's logits against the single process's on the same file. The head shards keep the
// file's blocks (model/weights.h ShardAttentionHeads; gguf_model_test checks which), so both
// runs multiply the same blocks by the same int8-quantized activation rows; what differs is the
// order of o_proj's sums (each rank sums its heads' blocks, then the all-reduce adds the two
// partial sums), about 1e-7 of a row. Rounded into the next layer's int8 activations, such a
// difference can move one code by one step, so the bar is 1e-3 · max|logit|, not bits — against
// the ~1e-2 that the activations' own quantization moves the logits
// (GgufModelTest.NativeProductsStayNearTheDequantizedOnes) — and the same argmax.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.h"

namespace sy {
namespace {

using testing::Mpirun;
using testing::ReadLogits;
using testing::RunCommand;

const std::string kModels = SY_GGUF_MODELS_DIR;

struct GgufTpCase {
  std::string name;
  std::string file;
  std::string launch;
  bool decoded_shard;  // o_proj's head shard cuts the type's blocks: decoded to f32, and said
};

void PrintTo(const GgufTpCase& c, std::ostream* os) {
  *os << c.file << " " << c.launch;
}

class GgufTensorParallel : public ::testing::TestWithParam<GgufTpCase> {};

TEST_P(GgufTensorParallel, LogitsMatchTheSingleProcessRun) {
  const GgufTpCase& c = GetParam();
  std::string tokens =
      testing::ReadFile(std::string(testing::kFixturesDir) + "/default-model/tokens.txt");
  while (!tokens.empty() && (tokens.back() == '\n' || tokens.back() == ' '))
    tokens.pop_back();
  const std::string dir = testing::TempDirectory("gguf_tp_" + c.name);
  const std::string args = std::string(testing::kBinary) + " --threads 1 logits --model " +
                           kModels + "/" + c.file + " --tokens '" + tokens +
                           "' --decode-from 3 --kv-dtype f32";
  std::string output;
  ASSERT_EQ(RunCommand(args + " --out " + dir + "/one.bin", &output), 0) << output;
  ASSERT_EQ(
      RunCommand(Mpirun(2) + args + " --out " + dir + "/many.bin --wire-dtype f32 " + c.launch,
                 &output),
      0)
      << output;
  EXPECT_EQ(output.find("decoded to f32") != std::string::npos, c.decoded_shard) << output;
  const int64_t vocab = 4096;  // the default model's
  const std::vector<float> one = ReadLogits(dir + "/one.bin"), many = ReadLogits(dir + "/many.bin");
  auto comparison = testing::CompareLogits(one, many, vocab);
  if (!c.decoded_shard) {
    EXPECT_GT(comparison.argmax_checked, 0);
    EXPECT_EQ(comparison.argmax_mismatches, 0);
    EXPECT_LE(comparison.max_abs_diff, 1e-3 * comparison.max_abs_reference);
  } else {
    // f32 products in that o_proj where the single process quantizes its activations: the bars
    // of native against dequantized products (GgufModelTest.NativeQuantizedProductsMatchThe-
    // DequantizedPath, decode steps): 6e-2 · max|logit| on 95% of rows, top-1 where the margin
    // is clear of twice that.
    const auto clear = testing::CompareLogits(
        one, many, vocab, static_cast<float>(0.12 * comparison.max_abs_reference));
    EXPECT_EQ(clear.argmax_mismatches, 0);
    EXPECT_LE(comparison.RowsOver(6e-2), static_cast<int64_t>(comparison.row_max_diff.size()) / 20);
  }
  std::printf("%s %s: max |Δ| %.3g of max |logit| %.3g (%.2g)\n", c.file.c_str(), c.launch.c_str(),
              comparison.max_abs_diff, comparison.max_abs_reference,
              comparison.max_abs_diff / comparison.max_abs_reference);
}

INSTANTIATE_TEST_SUITE_P(
    Launches, GgufTensorParallel,
    ::testing::Values(GgufTpCase{"q8_0_tp2", "default-q8_0.gguf", "--tp 2", false},
                      GgufTpCase{"q8_0_tp2_microbatch", "default-q8_0.gguf",
                                 "--tp 2 --overlap microbatch", false},
                      // Q6_K's 256-column o_proj blocks across the 128-column shard: f32 there
                      // (exact products where the single process quantizes the activations).
                      GgufTpCase{"q4_k_mix_tp2", "default-q4_k_mix.gguf", "--tp 2", true}),
    [](const ::testing::TestParamInfo<GgufTpCase>& info) { return info.param.name; });

// Online rebalancing on a GGUF under EP4: experts travel as their GGML panels (Q4_K, Q6_K and
// Q8_0 codes with every scale), each arrival is checked against a fresh read of the file
// (SWITCHYARD_VERIFY_EXPERT_MOVES), and the logits are the contiguous EP run's bits: a row's
// products do not depend on which rank holds the expert, and the combine sums in expert order.
TEST(GgufExpertParallel, OnlineRebalancingMovesTheFilesBlocks) {
  std::string tokens =
      testing::ReadFile(std::string(testing::kFixturesDir) + "/default-model/tokens.txt");
  while (!tokens.empty() && (tokens.back() == '\n' || tokens.back() == ' '))
    tokens.pop_back();
  const std::string dir = testing::TempDirectory("gguf_eplb");
  const std::string args = std::string(testing::kBinary) + " --threads 1 logits --model " +
                           kModels + "/default-q4_k_mix.gguf --tokens '" + tokens +
                           "' --decode-from 3 --kv-dtype f32 --wire-dtype f32";
  std::string output;
  ASSERT_EQ(RunCommand(Mpirun(4) + args + " --out " + dir + "/contiguous.bin", &output), 0)
      << output;
  ASSERT_EQ(RunCommand("SWITCHYARD_VERIFY_EXPERT_MOVES=1 " + Mpirun(4) + args + " --out " + dir +
                           "/online.bin --num-redundant-experts 4 --eplb-interval 2",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("experts moved: "), std::string::npos) << output;
  EXPECT_EQ(output.find("experts moved: 0 experts"), std::string::npos) << output;
  const std::vector<float> contiguous = ReadLogits(dir + "/contiguous.bin");
  EXPECT_FALSE(contiguous.empty());
  EXPECT_EQ(contiguous, ReadLogits(dir + "/online.bin"));
}

}  // namespace
}  // namespace sy
