// Expert parallelism with real MPI processes (mpirun --oversubscribe): every EP size, wire
// format and overlap mode must reproduce the single-process logits and tokens, and bad launches
// must fail loudly on every rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>

#include "base/clock.h"
#include "test_support.h"

namespace sy {
namespace {

using testing::RunCommand;

using testing::Mpirun;
using testing::ReadLogits;

struct EpCase {
  int ranks;
  std::string wire;
  std::string overlap;
  int decode_from;  // -1: prefill only
  int tp = 1;
  std::string split = "heads";  // attention under TP: heads | sp-tp-sp
  std::string progress = "on";  // the communication progress thread
};

void PrintTo(const EpCase& c, std::ostream* os) {
  *os << c.ranks << " ranks, TP " << c.tp << " (" << c.split << "), " << c.wire << " wire, overlap "
      << c.overlap << ", decode from " << c.decode_from << ", progress thread " << c.progress;
}

// generate's "sequence s: ids…" lines of two runs are equal for s < count.
void ExpectSameSequenceLines(const std::string& one, const std::string& many, int count) {
  for (int s = 0; s < count; ++s) {
    const std::string key = "sequence " + std::to_string(s) + ":";
    auto line = [&](const std::string& text) {
      return text.substr(text.find(key), text.find('\n', text.find(key)) - text.find(key));
    };
    ASSERT_NE(many.find(key), std::string::npos) << many;
    EXPECT_EQ(line(one), line(many));
  }
}

class ExpertParallelTest : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallelTest, LogitsMatchTheSingleProcessRun) {
  const EpCase& c = GetParam();
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  const std::string dir = testing::TempDirectory(
      "ep_" + std::to_string(c.ranks) + "tp" + std::to_string(c.tp) + c.wire + c.overlap +
      std::to_string(c.decode_from) + c.split + c.progress);
  const std::string decode =
      c.decode_from < 0 ? "" : " --decode-from " + std::to_string(c.decode_from);
  // With f32 rows on the wire the bar is exact arithmetic, so products keep f32 activations too:
  // rounding them to bf16 (the default kernel) turns the TP split's 1e-7 differences in o_proj's
  // sums into bf16 rounding flips. bf16 and fp8 wires run the default kernel.
  const std::string products = c.wire == "f32" ? " --f32-products" : "";
  const std::string args = products + " logits --model " + fixture.directory + " --tokens '" +
                           fixture.tokens_text + "'" + decode;
  std::string output;
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + " --threads 1" + args + " --out " + dir +
                           "/one.bin",
                       &output),
            0)
      << output;
  ASSERT_EQ(RunCommand(Mpirun(c.ranks) + testing::kBinary + " --threads 1" + args + " --out " +
                           dir + "/many.bin --wire-dtype " + c.wire + " --overlap " + c.overlap +
                           " --tp " + std::to_string(c.tp) + " --attention-split " + c.split +
                           " --progress-thread " + c.progress,
                       &output),
            0)
      << output;
  if (c.ranks > 1) {  // each rank reports its share and memory
    EXPECT_NE(output.find("rank " + std::to_string(c.ranks - 1) + " of " + std::to_string(c.ranks)),
              std::string::npos)
        << output;
  }
  auto comparison = testing::CompareLogits(ReadLogits(dir + "/one.bin"),
                                           ReadLogits(dir + "/many.bin"), fixture.vocab);
  if (c.wire == "f32") {
    // Exact rows on the wire: the bar, 1e-4 · max|logit|, and the same argmax.
    EXPECT_EQ(comparison.argmax_mismatches, 0);
    EXPECT_LE(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference);
  } else if (c.wire == "fp8") {
    // e4m3 dispatch rows (3 mantissa bits, a scale per 128 values) move every expert input by up
    // to ~3%: logits land 1.5–3% of max|logit| off here. Nearly every row must stay within 5e-2
    // and pick the same token.
    const int64_t rows = static_cast<int64_t>(comparison.row_max_diff.size());
    EXPECT_LE(comparison.RowsOver(5e-2), rows / 10) << "of " << rows;
    EXPECT_LE(comparison.argmax_mismatches, rows / 10) << "of " << rows;
  } else {
    // bf16 rows round every expert input and output (~0.2% per row here); a rounded row can flip a
    // near-tie expert choice in a later layer. Nearly every row must still meet 1e-2.
    const int64_t rows = static_cast<int64_t>(comparison.row_max_diff.size());
    EXPECT_LE(comparison.RowsOver(1e-2), rows / 10) << "of " << rows;
  }
}

std::string EpCaseName(const ::testing::TestParamInfo<EpCase>& info) {
  const EpCase& c = info.param;
  std::string split = c.split == "sp-tp-sp" ? "_sptpsp" : "";
  return "ep" + std::to_string(c.ranks) + "_tp" + std::to_string(c.tp) + split + "_" + c.wire +
         "_" + c.overlap + "_" +
         (c.decode_from < 0 ? std::string("prefill") : "decode" + std::to_string(c.decode_from)) +
         (c.progress == "on" ? "" : "_no_progress_thread");
}

INSTANTIATE_TEST_SUITE_P(
    Launches, ExpertParallelTest,
    ::testing::Values(EpCase{1, "f32", "none", 5}, EpCase{2, "f32", "none", -1},
                      EpCase{2, "f32", "dispatch", 5}, EpCase{4, "f32", "none", 5},
                      EpCase{4, "f32", "dispatch", -1}, EpCase{2, "f32", "microbatch", 5},
                      EpCase{2, "f32", "none", 5, 2}, EpCase{4, "f32", "microbatch", 5, 2},
                      EpCase{4, "f32", "dispatch", -1, 4}, EpCase{4, "f32", "microbatch", -1},
                      EpCase{2, "bf16", "none", 5}, EpCase{4, "bf16", "dispatch", 3},
                      EpCase{2, "fp8", "dispatch", -1}, EpCase{4, "fp8", "microbatch", 5},
                      // The five-stage schedule in one process (local experts), with bf16 rows,
                      // and with exchanges progressed only inside Wait().
                      EpCase{1, "f32", "microbatch", 5}, EpCase{4, "bf16", "microbatch", -1},
                      EpCase{2, "f32", "microbatch", -1, 1, "heads", "off"},
                      // SP-TP-SP attention: token shards, q/latent/output exchanges.
                      EpCase{2, "f32", "none", -1, 2, "sp-tp-sp"},
                      EpCase{4, "f32", "microbatch", 5, 2, "sp-tp-sp"},
                      EpCase{4, "f32", "dispatch", 3, 4, "sp-tp-sp"}),
    EpCaseName);

// Every conformance fixture (V3 bf16, V3 fp8, V3 with q_proj and f16, V2's softmax gate, V3.2's
// DSA) under four ranks in the five-stage schedule, prefill then decode: EP4, and EP4 with SP-TP-SP
// pairs where the heads split in two — against the single-process logits and against HF's.
class ExpertParallelFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelFixtures, EveryFixtureMatchesTheSingleProcessRun) {
  auto fixture = testing::LoadFixture(GetParam());
  const std::string dir = testing::TempDirectory("ep_fixture_" + GetParam());
  // f32 everywhere (cache, wire, products): the single-process and HF bars are exact arithmetic.
  const std::string args = " --threads 1 --f32-products logits --model " + fixture.directory +
                           " --tokens '" + fixture.tokens_text + "' --decode-from 3 --kv-dtype f32";
  std::string output;
  ASSERT_EQ(
      RunCommand(std::string(testing::kBinary) + args + " --out " + dir + "/one.bin", &output), 0)
      << output;
  const std::string config = testing::ReadFile(fixture.directory + "/config.json");
  const bool even_heads = config.find("\"num_attention_heads\": 3") == std::string::npos;
  std::vector<std::string> launches = {" --overlap microbatch"};
  if (even_heads) launches.push_back(" --overlap microbatch --tp 2 --attention-split sp-tp-sp");
  // DSA: heads split over a TP pair, each rank choosing the same keys with the whole indexer.
  if (config.find("\"index_topk\"") != std::string::npos) launches.push_back(" --tp 2");
  for (const std::string& flags : launches) {
    ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " --out " + dir +
                             "/many.bin --wire-dtype f32" + flags,
                         &output),
              0)
        << flags << "\n"
        << output;
    const std::vector<float> many = ReadLogits(dir + "/many.bin");
    auto parity = testing::CompareLogits(ReadLogits(dir + "/one.bin"), many, fixture.vocab);
    EXPECT_EQ(parity.argmax_mismatches, 0) << flags;
    EXPECT_LE(parity.max_abs_diff, 1e-4 * parity.max_abs_reference) << flags;
    auto reference = testing::CompareLogits(fixture.logits, many, fixture.vocab);
    EXPECT_EQ(reference.argmax_mismatches, 0) << flags;
    EXPECT_LE(reference.max_abs_diff, 1e-4 * reference.max_abs_reference) << flags;
  }
  EXPECT_TRUE(even_heads || GetParam() == "tiny-v3-qproj-f16");  // the one with 3 heads
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExpertParallelFixtures,
                         ::testing::ValuesIn(testing::FixtureNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// Four ranks and three sequences of different lengths: one DP group has no sequence at all, and
// the others finish at different steps; every rank must keep stepping until all are done —
// also in the two-micro-batch schedule, and with SP-TP-SP groups.
class ExpertParallelGenerate : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelGenerate, TokensMatchWithIdleAndEarlyFinishingRanks) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  const std::string args = " --threads 1 generate --model " + model +
                           " --prompt-tokens '5,6,7;8,9;10,11,12,13' --max-tokens 6 --kv-dtype f32";
  std::string one, many;
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + args + " --ignore-eos", &one), 0) << one;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " --ignore-eos --wire-dtype f32 " +
                           GetParam(),
                       &many),
            0)
      << many;
  ExpectSameSequenceLines(one, many, 3);
}

INSTANTIATE_TEST_SUITE_P(
    Launches, ExpertParallelGenerate,
    ::testing::Values("", "--overlap microbatch",
                      "--tp 2 --attention-split sp-tp-sp --overlap microbatch"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      return info.index == 0   ? std::string("ep4")
             : info.index == 1 ? std::string("ep4_microbatch")
                               : std::string("ep4_tp2_sptpsp_microbatch");
    });

// An fp8 latent cache under EP4 with SP-TP-SP attention groups of two: each rank's rows are
// rounded as the single process rounds them, so the tokens are the single process's.
TEST(ExpertParallelFp8Cache, TokensMatchTheSingleProcessRun) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  const std::string args = " --threads 1 generate --model " + model +
                           " --prompt-tokens '5,6,7;8,9;10,11,12,13' --max-tokens 6 --kv-dtype fp8"
                           " --ignore-eos";
  std::string one, many;
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + args, &one), 0) << one;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args +
                           " --wire-dtype f32 --tp 2 --attention-split sp-tp-sp",
                       &many),
            0)
      << many;
  ExpectSameSequenceLines(one, many, 3);
}

// --int8-products under EP4: a row's int8 products do not depend on the rows beside it, so the
// experts' rows computed on other ranks (exchanged in f32) give the single process's tokens.
TEST(ExpertParallelInt8, TokensMatchTheSingleProcessRun) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";
  const std::string args = " --threads 1 --int8-products generate --model " + model +
                           " --prompt-tokens '5,6,7;8,9;10,11,12,13' --max-tokens 6 --kv-dtype f32"
                           " --ignore-eos";
  std::string one, many;
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + args, &one), 0) << one;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " --wire-dtype f32", &many), 0)
      << many;
  ExpectSameSequenceLines(one, many, 3);
}

// Speculative decoding under mpirun, on the trained default model: four ranks (one DP group
// idle, the others finishing apart), drafts verified and the MTP block's experts exchanged like
// any MoE layer's (n-gram drafts: verification steps of different lengths on the ranks) — greedy
// tokens equal the single process's plain decoding.
class ExpertParallelMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelMtp, GreedyTokensEqualPlainDecodingInOneProcess) {
  const std::string model = std::string(SY_SOURCE_DIR) + "/models/default";
  const std::string args = " --threads 1 generate --model " + model +
                           " --prompt 'ROMEO: But soft' --prompt 'KING HENRY: Now, lords'"
                           " --prompt 'To be, or not to be' --max-tokens 16 --kv-dtype f32"
                           " --ignore-eos";
  std::string one, many;
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + args, &one), 0) << one;
  ASSERT_EQ(
      RunCommand(Mpirun(4) + testing::kBinary + args + " --wire-dtype f32 " + GetParam(), &many), 0)
      << many;
  ExpectSameSequenceLines(one, many, 3);
  EXPECT_NE(many.find("draft tokens accepted"), std::string::npos) << many;
}

INSTANTIATE_TEST_SUITE_P(Launches, ExpertParallelMtp,
                         ::testing::Values("--speculative mtp",
                                           "--speculative mtp --num-speculative-tokens 2 "
                                           "--overlap microbatch",
                                           "--speculative mtp --tp 2 --overlap microbatch",
                                           "--speculative ngram --num-speculative-tokens 3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.index == 0   ? std::string("ep4_k1")
                                  : info.index == 1 ? std::string("ep4_k2_microbatch")
                                  : info.index == 2 ? std::string("ep4_tp2_microbatch")
                                                    : std::string("ep4_ngram_k3");
                         });

TEST(ExpertParallelErrors, ExpertsThatDoNotDivideFailOnEveryRank) {
  std::string output;
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";  // 16 experts
  int status = RunCommand(Mpirun(3) + testing::kBinary + " --threads 1 logits --model " + model +
                              " --tokens '1,2' --out /dev/null",
                          &output);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("16 routed experts cannot be spread evenly over 3 ranks"),
            std::string::npos)
      << output;
}

TEST(ExpertParallelErrors, DifferentCheckpointsOrFlagsFailLoudly) {
  std::string output;
  const std::string fp8 = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";
  const std::string bf16 = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  const std::string run =
      std::string(testing::kBinary) + " --threads 1 logits --tokens '1,2' --out /dev/null --model ";
  int status = RunCommand(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun "
      "--oversubscribe -np 1 " +
          run + fp8 + " : -np 1 " + run + bf16,
      &output);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("differ from rank 0"), std::string::npos) << output;
  status = RunCommand(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun "
      "--oversubscribe -np 1 " +
          run + fp8 + " --wire-dtype f32 : -np 1 " + run + fp8,
      &output);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("differ from rank 0"), std::string::npos) << output;
}

TEST(ExpertParallelErrors, BadTokenFailsEveryRankWithOneMessage) {
  std::string output;
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";
  int status = RunCommand(Mpirun(2) + testing::kBinary + " --threads 1 logits --model " + model +
                              " --tokens '1,2;3,1000' --out /dev/null",
                          &output);
  EXPECT_NE(status, 0);
  EXPECT_LT(status, 124);  // failed, not timed out
  EXPECT_NE(output.find("token id 1000"), std::string::npos) << output;
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// Several machines, emulated: network namespaces joined by shaped veth links
// (scripts/netns-cluster.sh), mpirun starting one daemon per host through `ip netns exec`, rows
// crossing real TCP connections. The parity bar is the same as on one host.
TEST(ExpertParallelMultiHost, LogitsMatchAcrossEmulatedHosts) {
  const std::string scripts = std::string(SY_SOURCE_DIR) + "/scripts/netns-cluster.sh";
  std::string output;
  if (RunCommand(scripts + " up 4", &output) != 0)
    GTEST_SKIP() << "cannot create network namespaces: " << output;
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  const std::string dir = testing::TempDirectory("multihost");
  const std::string args = " --threads 1 logits --model " + fixture.directory + " --tokens '" +
                           fixture.tokens_text + "' --decode-from 4";
  ASSERT_EQ(
      RunCommand(std::string(testing::kBinary) + args + " --out " + dir + "/one.bin", &output), 0)
      << output;
  // Two hosts with dispatch overlap; four in the two-micro-batch schedule with SP-TP-SP pairs.
  for (int hosts : {2, 4}) {
    const std::string out = dir + "/hosts" + std::to_string(hosts) + ".bin";
    const std::string mode = hosts == 2 ? " --overlap dispatch"
                                        : " --overlap microbatch --tp 2 --attention-split sp-tp-sp";
    int status =
        RunCommand("timeout 300 " + scripts + " mpirun " + std::to_string(hosts) + " " +
                       testing::kBinary + args + " --out " + out + " --wire-dtype f32" + mode,
                   &output);
    EXPECT_EQ(status, 0) << output;
    if (status != 0) continue;
    auto comparison =
        testing::CompareLogits(ReadLogits(dir + "/one.bin"), ReadLogits(out), fixture.vocab);
    EXPECT_EQ(comparison.argmax_mismatches, 0) << hosts;
    EXPECT_LE(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference) << hosts;
  }
  RunCommand(scripts + " down 4", &output);
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

// A rank that dies mid-run must end the whole job with an error in bounded time, not leave its
// peers waiting forever in an exchange.
TEST(ExpertParallelErrors, ADeadRankEndsTheJob) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  const std::string dir = testing::TempDirectory("dead_rank");
  // A uniquely named link to the binary, so the ranks (and only they) can be found and killed.
  const std::string binary = dir + "/switchyard-dies-" + std::to_string(::getpid());
  std::string output;
  ASSERT_EQ(RunCommand("ln -sf " + std::string(testing::kBinary) + " " + binary, &output), 0)
      << output;
  const std::string script = dir + "/run.sh";
  testing::WriteFile(script,
                     "(" + Mpirun(2) + binary + " --threads 1 generate --model " + model +
                         " --prompt-tokens '5,6,7;8,9,10;11,12;13' --max-tokens 100000 --ignore-eos"
                         " > /dev/null 2>&1; echo exit=$?) &\n"
                         "sleep 4\n"
                         "pkill -9 -n -f -- '^" +
                         binary +
                         " '\n"
                         "wait\n");
  const double start = NowSeconds();
  RunCommand("bash " + script, &output);
  const double elapsed = NowSeconds() - start;
  EXPECT_NE(output.find("exit="), std::string::npos) << output;
  EXPECT_EQ(output.find("exit=0\n"), std::string::npos) << output;
  EXPECT_EQ(output.find("exit=124"), std::string::npos)
      << "timed out instead of failing: " << output;
  EXPECT_LT(elapsed, 120) << output;
}

}  // namespace
}  // namespace sy

namespace sy {
namespace {

TEST(ExpertParallelErrors, TensorParallelSizesMustDivide) {
  std::string output;
  const std::string model =
      std::string(testing::kFixturesDir) + "/tiny-v3-fp8";  // 4 heads, 16 experts
  const std::string run = std::string(testing::kBinary) + " --threads 1 logits --model " + model +
                          " --tokens '1,2' --out /dev/null";
  EXPECT_NE(RunCommand(Mpirun(4) + run + " --tp 3", &output), 0);
  EXPECT_NE(output.find("--tp 3 does not divide the 4 ranks"), std::string::npos) << output;
  EXPECT_NE(RunCommand(Mpirun(8) + run + " --tp 8", &output), 0);
  EXPECT_NE(output.find("4 attention heads cannot be split over 8"), std::string::npos) << output;
}

}  // namespace
}  // namespace sy
