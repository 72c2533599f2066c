// The switchyard binary as a user runs it: outputs and one-line errors with a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "test_support.h"

namespace sy {
namespace {

using testing::RunCommand;

std::string Binary() {
  return testing::kBinary;
}

TEST(CliTest, LogitsDecodeFromMatchesTheReference) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  std::string out = testing::TempDirectory("cli_logits") + "/logits.bin";
  std::string output;
  int status =
      RunCommand(Binary() + " --threads 2 logits --model " + fixture.directory + " --tokens '" +
                     fixture.tokens_text + "' --out " + out + " --decode-from 4",
                 &output);
  ASSERT_EQ(status, 0) << output;
  std::string bytes = testing::ReadFile(out);
  std::vector<float> logits(bytes.size() / 4);
  std::memcpy(logits.data(), bytes.data(), bytes.size());
  auto comparison = testing::CompareLogits(fixture.logits, logits, fixture.vocab);
  EXPECT_LE(comparison.max_abs_diff, 1e-2 * comparison.max_abs_reference);
  EXPECT_EQ(comparison.argmax_mismatches, 0);
}

TEST(CliTest, GenerateIsDeterministicAndBatchInvariant) {
  std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  std::string batched, single;
  ASSERT_EQ(
      RunCommand(Binary() + " generate --model " + model +
                     " --prompt-tokens '5,6,7;8,9' --max-tokens 6 --ignore-eos --kv-dtype f32",
                 &batched),
      0)
      << batched;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + model +
                           " --prompt-tokens '8,9' --max-tokens 6 --ignore-eos --kv-dtype f32",
                       &single),
            0)
      << single;
  auto line = [](const std::string& text, const std::string& prefix) {
    size_t at = text.find(prefix);
    return at == std::string::npos
               ? std::string()
               : text.substr(at + prefix.size(), text.find('\n', at) - at - prefix.size());
  };
  std::string second = line(batched, "sequence 1:");
  EXPECT_EQ(std::count(second.begin(), second.end(), ' '), 6) << batched;
  EXPECT_EQ(second, line(single, "sequence 0:"));
  EXPECT_NE(batched.find("tok/s"), std::string::npos);
}

struct BadCall {
  std::string arguments;
  std::string expected;
};

TEST(CliTest, BadInputGivesOneLineAndNonZeroExit) {
  std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";
  std::string out = testing::TempDirectory("cli_bad") + "/x.bin";
  std::vector<BadCall> calls = {
      {"logits --model " + model + " --tokens '1,2;3,1000' --out " + out, "token id 1000"},
      {"logits --model " + model + " --tokens '1,2;;3' --out " + out, "sequence 1 is empty"},
      {"logits --model " + model + " --tokens '1,x' --out " + out, "'x' in sequence 0"},
      {"logits --model " + model + " --tokens '' --out " + out, "empty"},
      {"logits --model /nonexistent --tokens '1' --out " + out, "/nonexistent"},
      {"generate --model " + model + " --prompt-tokens '1,-2'", "'-2'"},
      {"generate --model " + model + " --prompt-tokens '4096'", "token id 4096"},
  };
  for (const auto& call : calls) {
    std::string output;
    int status = RunCommand(Binary() + " " + call.arguments, &output);
    EXPECT_NE(status, 0) << call.arguments;
    EXPECT_LT(status, 128) << "crashed: " << call.arguments << "\n" << output;
    EXPECT_NE(output.find(call.expected), std::string::npos) << call.arguments << "\n" << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}

TEST(CliTest, InitModelWritesALoadableDefault) {
  std::string dir = testing::TempDirectory("cli_init");
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " init-model --out " + dir + "/m", &output), 0) << output;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           "/m --prompt-tokens '1,2,3' --max-tokens 3 --ignore-eos",
                       &output),
            0)
      << output;
  // Deterministic: a second generation writes the same bytes.
  ASSERT_EQ(RunCommand(Binary() + " init-model --out " + dir + "/n", &output), 0) << output;
  EXPECT_EQ(testing::ReadFile(dir + "/m/model.safetensors"),
            testing::ReadFile(dir + "/n/model.safetensors"));
}

}  // namespace
}  // namespace sy
