// The switchyard binary as a user runs it: outputs and one-line errors with a non-zero exit.
#include <gtest/gtest.h>

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu/isa_level.h"
#include "test_support.h"
#include "tokenizer/text_codec.h"

namespace sy {
namespace {

using testing::RunCommand;

std::string Binary() {
  return testing::kBinary;
}

// The text after `prefix` on its line of `text` ("" where absent).
std::string LineAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  return at == std::string::npos
             ? std::string()
             : text.substr(at + prefix.size(), text.find('\n', at) - at - prefix.size());
}

// `generate` (a command line up to --prompt-tokens) gives prompt 8,9 the same greedy tokens
// second in a batch of three as alone.
void ExpectBatchInvariantGeneration(const std::string& generate) {
  std::string batched, single;
  ASSERT_EQ(RunCommand(generate + "'5,6,7;8,9;10,11,12,13'", &batched), 0) << batched;
  ASSERT_EQ(RunCommand(generate + "'8,9'", &single), 0) << single;
  EXPECT_FALSE(LineAfter(single, "sequence 0:").empty()) << single;
  EXPECT_EQ(LineAfter(batched, "sequence 1:"), LineAfter(single, "sequence 0:"));
}

TEST(CliTest, LogitsDecodeFromMatchesTheReference) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  std::string out = testing::TempDirectory("cli_logits") + "/logits.bin";
  std::string output;
  int status =
      RunCommand(Binary() + " --threads 2 --f32-products logits --model " + fixture.directory +
                     " --tokens '" + fixture.tokens_text + "' --out " + out + " --decode-from 4",
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
  std::string second = LineAfter(batched, "sequence 1:");
  EXPECT_EQ(std::count(second.begin(), second.end(), ' '), 6) << batched;
  EXPECT_EQ(second, LineAfter(single, "sequence 0:"));
  EXPECT_NE(batched.find("tok/s"), std::string::npos);
}

// An fp8 latent cache under speculative decoding: drafts' rows are written, verified and rolled
// back like any others, so greedy tokens are plain decoding's on the same cache (the default
// model, which has an MTP layer). And `--kv-dtype` says what it takes.
TEST(CliTest, SpeculativeDecodingOnAnFp8CacheGivesPlainDecodingsTokens) {
  const std::string generate = Binary() +
                               " generate --kv-dtype fp8 --prompt 'ROMEO: But soft' --prompt "
                               "'To be, or not to be' --max-tokens 24 --ignore-eos";
  std::string plain;
  ASSERT_EQ(RunCommand(generate, &plain), 0) << plain;
  for (const char* drafter : {" --speculative mtp", " --speculative ngram"}) {
    std::string drafted;
    ASSERT_EQ(RunCommand(generate + drafter, &drafted), 0) << drafted;
    EXPECT_EQ(LineAfter(drafted, "sequence 0:"), LineAfter(plain, "sequence 0:")) << drafter;
    EXPECT_EQ(LineAfter(drafted, "sequence 1:"), LineAfter(plain, "sequence 1:")) << drafter;
  }
  std::string bad;
  EXPECT_NE(RunCommand(Binary() + " generate --kv-dtype fp4 --prompt x --max-tokens 1", &bad), 0);
  EXPECT_NE(bad.find("fp8"), std::string::npos) << bad;
}

// `generate --warmup N` runs the batch N times untimed first: the measured run prints the same
// tokens, and the recorded expert load is the measured run's alone (warm-up routing cleared).
TEST(CliTest, GenerateWarmupKeepsTheOutputAndTheLoadOfTheMeasuredRun) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  const std::string dir = testing::TempDirectory("cli_warmup");
  const std::string generate = Binary() + " --threads 2 generate --model " + model +
                               " --prompt-tokens '5,6,7;8,9' --max-tokens 5 --ignore-eos" +
                               " --record-expert-load " + dir;
  std::string cold, warm;
  ASSERT_EQ(RunCommand(generate + "/cold.json", &cold), 0) << cold;
  ASSERT_EQ(RunCommand(generate + "/warm.json --warmup 2", &warm), 0) << warm;
  for (const char* key : {"sequence 0:", "sequence 1:"}) {
    EXPECT_FALSE(LineAfter(cold, key).empty()) << cold;
    EXPECT_EQ(LineAfter(cold, key), LineAfter(warm, key)) << warm;
  }
  const auto a = nlohmann::json::parse(testing::ReadFile(dir + "/cold.json"));
  const auto b = nlohmann::json::parse(testing::ReadFile(dir + "/warm.json"));
  ASSERT_TRUE(a.contains("window")) << a.dump();
  EXPECT_GT(a["window"]["tokens"].get<int64_t>(), 0);
  EXPECT_EQ(a["window"], b["window"]);
  std::string refused;
  EXPECT_NE(RunCommand(generate + "/x.json --warmup -1", &refused), 0) << refused;
}

// `bench decode`: a row per batch against the bandwidth bound, then memory and the load: its
// seconds, the checkpoint's bytes over them, and that rate against the read bandwidth of the run.
TEST(CliTest, BenchDecodeReportsTheLoad) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  std::string out;
  ASSERT_EQ(RunCommand(Binary() + " --threads 1 bench decode --model " + model +
                           " --batches 1 --steps 2 --prompt-len 3",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("resident after load"), std::string::npos) << out;
  const size_t at = out.find("load: ");
  ASSERT_NE(at, std::string::npos) << out;
  std::istringstream line(out.substr(at + 6));
  double seconds = -1, gbps = -1, ratio = -1;
  std::string unit, rate_unit, of, checkpoint;
  ASSERT_TRUE(line >> seconds >> unit >> gbps >> rate_unit >> of >> checkpoint) << out;
  char paren = 0;
  ASSERT_TRUE(line >> paren >> ratio) << out;
  EXPECT_EQ(paren, '(') << out;
  EXPECT_GT(seconds, 0) << out;
  EXPECT_EQ(rate_unit, "GB/s") << out;
  EXPECT_GT(gbps, 0) << out;
  EXPECT_GT(ratio, 0) << out;
}

// `bench decode --against`: both checkpoints in one process, a row per batch with both rates, the
// paired ratio and its quartiles over the asked steps; a missing checkpoint is named.
TEST(CliTest, BenchDecodeAgainstPairsTheSteps) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  std::string out;
  ASSERT_EQ(RunCommand(Binary() + " --threads 1 bench decode --model " + model + " --against " +
                           model + " --batches 1,2 --steps 5 --prompt-len 3",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("B/A median"), std::string::npos) << out;
  for (const char* batch : {"1", "2"}) {
    std::istringstream rows(out);
    std::string row;
    bool found = false;
    while (std::getline(rows, row)) {
      std::istringstream fields(row);
      std::string b, dots;
      double a_rate = 0, b_rate = 0, median = 0, q1 = 0, q3 = 0;
      int64_t pairs = 0;
      if (!(fields >> b >> a_rate >> b_rate >> median >> q1 >> dots >> q3 >> pairs) || b != batch)
        continue;
      found = true;
      EXPECT_GT(a_rate, 0) << row;
      EXPECT_GT(b_rate, 0) << row;
      EXPECT_LE(q1, median) << row;
      EXPECT_LE(median, q3) << row;
      EXPECT_GT(q1, 0) << row;
      EXPECT_EQ(pairs, 5) << row;
    }
    EXPECT_TRUE(found) << "no row for batch " << batch << ":\n" << out;
  }
  EXPECT_NE(RunCommand(Binary() + " bench decode --model " + model +
                           " --against /nonexistent/checkpoint --batches 1 --steps 2",
                       &out),
            0);
  EXPECT_NE(out.find("/nonexistent/checkpoint"), std::string::npos) << out;
}

// --int8-products: lossy, so held to the reference loosely, but still batch-invariant.
TEST(CliTest, Int8ProductsStayNearTheReferenceAndBatchInvariant) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  std::string out = testing::TempDirectory("cli_int8") + "/logits.bin";
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " --int8-products logits --model " + fixture.directory +
                           " --tokens '" + fixture.tokens_text + "' --out " + out,
                       &output),
            0)
      << output;
  std::string bytes = testing::ReadFile(out);
  std::vector<float> logits(bytes.size() / 4);
  std::memcpy(logits.data(), bytes.data(), bytes.size());
  auto comparison = testing::CompareLogits(fixture.logits, logits, fixture.vocab);
  // Most rows stay within a few percent (7-bit weights, 8-bit activations over three random
  // layers); a few move more where the perturbation flips one of the router's near-tied experts.
  std::vector<double> rows = comparison.row_max_diff;
  std::sort(rows.begin(), rows.end());
  EXPECT_LE(rows[rows.size() / 2], 0.08 * comparison.max_abs_reference);
  EXPECT_LE(comparison.RowsOver(0.1), static_cast<int64_t>(rows.size()) / 5);
  EXPECT_GT(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference);  // int8 really ran
  EXPECT_LE(comparison.argmax_mismatches, comparison.argmax_checked / 8);

  ExpectBatchInvariantGeneration(Binary() + " --int8-products generate --model " +
                                 fixture.directory +
                                 " --max-tokens 8 --ignore-eos --prompt-tokens ");
}

// `bench kernels --amx-only` where no AMX tiles may run (capped below native here, so on every
// CPU): a clear error before anything is measured.
TEST(CliTest, BenchKernelsAmxOnlyNeedsTheTiles) {
  std::string output;
  EXPECT_NE(RunCommand("SWITCHYARD_AMX_EMULATE=0 " + Binary() +
                           " --max-isa avx512 bench kernels --quick --amx-only 2>&1",
                       &output),
            0);
  EXPECT_NE(output.find("--amx-only: this process cannot use AMX tiles"), std::string::npos)
      << output;
  EXPECT_EQ(output.find("machine:"), std::string::npos) << output;
}

// The AMX kernels through the binary, on the emulator where the CPU has no AMX tiles
// (SWITCHYARD_AMX_EMULATE=1). int8 products give the vector kernels' logits bit for bit (a
// 40-token prompt: the products of its prefill take AMX from one tile of rows up);
// --amx-bf16 stays at the bf16 bar, prefill and decode steps (MLA on tiles), and keeps greedy
// tokens batch-invariant; where no AMX runs
// at all, --amx-bf16 says it has no effect.
TEST(CliTest, AmxKernelsThroughTheBinary) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  std::string tokens;
  for (int i = 0; i < 40; ++i)
    tokens += (i ? "," : "") + std::to_string(3 + i * 37 % 900);
  const std::string dir = testing::TempDirectory("cli_amx");
  auto logits = [&](const std::string& env, const std::string& flags, const std::string& name,
                    const std::string& token_text = "", const std::string& after = "") {
    std::string output;
    const std::string out = dir + "/" + name + ".bin";
    EXPECT_EQ(
        RunCommand(env + " " + Binary() + " " + flags + " logits --model " + fixture.directory +
                       " --tokens '" + (token_text.empty() ? tokens : token_text) + "' --out " +
                       out + " " + after + " 2>&1",
                   &output),
        0)
        << output;
    return testing::ReadFile(out);
  };
  // The vector kernels: --max-isa avx512, or the lesser level the suite runs this under.
  const char* level = std::getenv("SWITCHYARD_MAX_ISA");
  const std::string no_amx =
      level != nullptr && *level && std::string(level) != "native" ? level : "avx512";
  const std::string vector_kernels =
      logits("SWITCHYARD_AMX_EMULATE=0", "--max-isa " + no_amx + " --int8-products", "v");
  // (--no-amx-bf16: on a CPU with AMX the bf16 matrices kept exact would take its bf16 tiles.)
  const std::string amx = logits("SWITCHYARD_AMX_EMULATE=1", "--int8-products --no-amx-bf16", "a");
  ASSERT_FALSE(amx.empty());
  EXPECT_TRUE(amx == vector_kernels) << "the AMX int8 kernel changed the logits";
  const std::string f32 = logits("", "--f32-products", "f");
  const std::string bf16 = logits("SWITCHYARD_AMX_EMULATE=1", "--amx-bf16", "b");
  ASSERT_EQ(bf16.size(), f32.size());
  EXPECT_TRUE(bf16 != f32) << "activations rounded to bf16: the AMX kernel did not run";
  std::vector<float> reference(f32.size() / 4), got(reference.size());
  std::memcpy(reference.data(), f32.data(), f32.size());
  std::memcpy(got.data(), bf16.data(), bf16.size());
  auto comparison = testing::CompareLogits(reference, got, fixture.vocab);
  EXPECT_EQ(comparison.argmax_mismatches, 0);
  const int64_t rows = static_cast<int64_t>(comparison.row_max_diff.size());
  EXPECT_LE(comparison.RowsOver(1e-2), std::max<int64_t>(2, rows / 20));

  // Decode steps from the fifth position: absorbed attention on AMX tiles (heads as tile rows),
  // against transformers at the same bar.
  const std::string decoded = logits("SWITCHYARD_AMX_EMULATE=1", "--amx-bf16", "d",
                                     fixture.tokens_text, "--decode-from 4 --kv-dtype bf16");
  std::vector<float> decoded_logits(decoded.size() / 4);
  std::memcpy(decoded_logits.data(), decoded.data(), decoded.size());
  auto decode_comparison = testing::CompareLogits(fixture.logits, decoded_logits, fixture.vocab);
  EXPECT_EQ(decode_comparison.argmax_mismatches, 0);
  EXPECT_LE(decode_comparison.RowsOver(1e-2),
            std::max<int64_t>(2, static_cast<int64_t>(decode_comparison.row_max_diff.size()) / 20));

  ExpectBatchInvariantGeneration("SWITCHYARD_AMX_EMULATE=1 " + Binary() +
                                 " --amx-bf16 generate --model " + fixture.directory +
                                 " --max-tokens 8 --ignore-eos --prompt-tokens ");

  std::string output;
  ASSERT_EQ(RunCommand("SWITCHYARD_AMX_EMULATE=0 " + Binary() +
                           " --max-isa avx512 --amx-bf16 logits --model " + fixture.directory +
                           " --tokens '5,6' --out " + dir + "/n.bin 2>&1",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("--amx-bf16 has no effect here"), std::string::npos) << output;
}

// bf16 weights laid out as AMX tiles at load (PackedMatrix::bf16_pairs), through the binary:
// with --amx-bf16 on the emulator, at the bf16 bar against transformers in prefill and in decode
// steps, greedy tokens batch-invariant. Without a flag they take the tiles only where this CPU
// has them (the default), and --no-amx-bf16 keeps the dot kernel's logits.
TEST(CliTest, Bf16WeightsOnAmxTilesThroughTheBinary) {
  auto fixture = testing::LoadFixture("tiny-v3-bf16");
  const std::string dir = testing::TempDirectory("cli_amx_pairs");
  auto logits = [&](const std::string& env, const std::string& flags, const std::string& name,
                    const std::string& after = "") {
    std::string output;
    const std::string out = dir + "/" + name + ".bin";
    EXPECT_EQ(RunCommand(env + " " + Binary() + " " + flags + " logits --model " +
                             fixture.directory + " --tokens '" + fixture.tokens_text + "' --out " +
                             out + " " + after + " 2>&1",
                         &output),
              0)
        << output;
    const std::string bytes = testing::ReadFile(out);
    std::vector<float> values(bytes.size() / 4);
    std::memcpy(values.data(), bytes.data(), values.size() * 4);
    return values;
  };
  auto at_the_bar = [&](const std::vector<float>& got, const char* what) {
    ASSERT_EQ(got.size(), fixture.logits.size()) << what;
    auto comparison = testing::CompareLogits(fixture.logits, got, fixture.vocab);
    EXPECT_EQ(comparison.argmax_mismatches, 0) << what;
    EXPECT_LE(comparison.RowsOver(1e-2),
              std::max<int64_t>(2, static_cast<int64_t>(comparison.row_max_diff.size()) / 20))
        << what;
  };
  const auto tiles = logits("SWITCHYARD_AMX_EMULATE=1", "--amx-bf16", "t");
  at_the_bar(tiles, "prefill");
  at_the_bar(
      logits("SWITCHYARD_AMX_EMULATE=1", "--amx-bf16", "d", "--decode-from 4 --kv-dtype bf16"),
      "decode steps");
  const auto dot = logits("SWITCHYARD_AMX_EMULATE=1", "--no-amx-bf16", "n");
  EXPECT_TRUE(dot != tiles) << "--amx-bf16 did not change the logits: its kernel did not run";
  // Without AMX at all: --max-isa avx512, or the lesser level the suite runs this under.
  const char* level = std::getenv("SWITCHYARD_MAX_ISA");
  const std::string no_amx =
      level != nullptr && *level && std::string(level) != "native" ? level : "avx512";
  EXPECT_TRUE(logits("SWITCHYARD_AMX_EMULATE=0", "--max-isa " + no_amx, "v") == dot);
  const auto plain = logits("SWITCHYARD_AMX_EMULATE=0", "", "p");
  if (kernels::AmxAllowed()) {
    at_the_bar(plain, "default, on this CPU's tiles");
    EXPECT_TRUE(plain != dot) << "the default did not take this CPU's AMX tiles";
  } else {
    EXPECT_TRUE(plain == dot) << "the default took AMX tiles on a CPU without them";
  }
  ExpectBatchInvariantGeneration("SWITCHYARD_AMX_EMULATE=1 " + Binary() +
                                 " --amx-bf16 generate --model " + fixture.directory +
                                 " --max-tokens 8 --ignore-eos --prompt-tokens ");
}

// --prefill-gemm through the binary: a 300-token prompt (every product 300 rows) through oneDNN's
// matmul stays as close to the f32 reference (--f32-products, our kernels) as our own kernels do,
// and really ran elsewhere than our kernels. Where oneDNN runs bf16 it rounds the weights to bf16
// as well as the activations (fp8 × its block scale does not fit 8 bits), two roundings of the
// same size where ours has one: about √2 times our error in RMS, bounded here at 3x. Where it runs
// f32 both errors are f32 rounding; the floor (1e-4 of the logits' RMS) covers that.
TEST(CliTest, PrefillProductsThroughOnednnKeepTheLogits) {
  std::string tokens;
  for (int i = 0; i < 300; ++i)
    tokens += (i ? "," : "") + std::to_string(3 + i * 37 % 2000);
  const std::string dir = testing::TempDirectory("cli_prefill_gemm");
  std::vector<float> logits[3];
  const char* modes[3] = {"--f32-products --prefill-gemm own", "--prefill-gemm own",
                          "--prefill-gemm onednn"};
  for (int i = 0; i < 3; ++i) {
    const std::string out = dir + "/" + std::to_string(i) + ".bin";
    std::string output;
    ASSERT_EQ(RunCommand(Binary() + " " + modes[i] + " logits --tokens '" + tokens + "' --out " +
                             out + " 2>&1",
                         &output),
              0)
        << output;
    const std::string bytes = testing::ReadFile(out);
    logits[i].resize(bytes.size() / 4);
    std::memcpy(logits[i].data(), bytes.data(), bytes.size());
    ASSERT_EQ(logits[i].size(), logits[0].size());
  }
  ASSERT_FALSE(logits[0].empty());
  auto rms = [](const std::vector<float>& a, const std::vector<float>* b) {
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = a[i] - (b ? (*b)[i] : 0.0f);
      sum += d * d;
    }
    return std::sqrt(sum / static_cast<double>(a.size()));
  };
  const double scale = rms(logits[0], nullptr);
  const double own_error = rms(logits[1], &logits[0]), onednn_error = rms(logits[2], &logits[0]);
  EXPECT_LT(onednn_error, 3 * own_error + 1e-4 * scale)
      << "ours " << own_error << ", oneDNN " << onednn_error << ", logits' RMS " << scale;
  EXPECT_GT(rms(logits[2], &logits[1]), 0.0)
      << "the oneDNN run gave our kernels' bits: it did not run";
}

// The accuracy bar of --int8-products, on the trained default model and held-out text: what
// `bench accuracy` reports must stay close to the exact products.
TEST(CliTest, Int8ProductsKeepTheDefaultModelsQuality) {
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " bench accuracy --json 2>&1", &output), 0) << output;
  auto report = nlohmann::json::parse(output.substr(output.find('{')), nullptr, false);
  ASSERT_FALSE(report.is_discarded()) << output;
  EXPECT_GT(report["predictions"].get<int64_t>(), 5000);
  const double exact = report["exact_perplexity"].get<double>();
  const double int8 = report["int8_perplexity"].get<double>();
  EXPECT_GT(exact, 1.0);
  EXPECT_LT(std::fabs(int8 / exact - 1), 0.01) << output;             // measured: -0.10%
  EXPECT_LT(report["mean_kl"].get<double>(), 0.01) << output;         // measured: 0.0019 nats
  EXPECT_GT(report["top1_agreement"].get<double>(), 0.95) << output;  // measured: 97.1%
  EXPECT_GT(report["mean_kl"].get<double>(), 0.0) << output;          // the int8 model really ran
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
      {"quantize --model /nonexistent --out " + out, "/nonexistent"},
      {"quantize --model " + model + " --out " + out, model + "/tokenizer.json"},
      {"quantize --model " + std::string(SY_SOURCE_DIR) + "/models/default --out /nonexistent/x",
       "/nonexistent/x"},
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

// `generate --chat --chat-template`: a template that writes BOS and the message's text makes the
// chat prompt the plain prompt, so both generate the same tokens; a template file works the
// same; a missing file or a template that does not parse is one line naming the problem.
TEST(CliTest, GenerateWithAChatTemplateOfOurOwn) {
  const std::string model = std::string(SY_SOURCE_DIR) + "/models/default";
  const std::string generate = Binary() + " generate --model " + model + " --max-tokens 6 ";
  const std::string template_text =
      "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
  const std::string file = testing::TempDirectory("cli_chat_template") + "/plain.jinja";
  std::ofstream(file) << template_text;
  std::string plain, chat, from_file;
  ASSERT_EQ(RunCommand(generate + "--prompt 'ROMEO: But soft'", &plain), 0) << plain;
  ASSERT_EQ(RunCommand(fmt::format("{}--chat --chat-template '{}' --prompt 'ROMEO: But soft'",
                                   generate, template_text),
                       &chat),
            0)
      << chat;
  ASSERT_EQ(RunCommand(fmt::format("{}--chat --chat-template {} --prompt 'ROMEO: But soft'",
                                   generate, file),
                       &from_file),
            0)
      << from_file;
  EXPECT_FALSE(LineAfter(plain, "sequence 0:").empty()) << plain;
  EXPECT_EQ(LineAfter(chat, "sequence 0:"), LineAfter(plain, "sequence 0:"));
  EXPECT_EQ(LineAfter(from_file, "sequence 0:"), LineAfter(plain, "sequence 0:"));
  // The default model's own (DeepSeek-V3's) template gives another prompt.
  std::string own;
  ASSERT_EQ(RunCommand(generate + "--chat --prompt 'ROMEO: But soft'", &own), 0) << own;
  EXPECT_NE(LineAfter(own, "sequence 0:"), LineAfter(plain, "sequence 0:"));
  for (const auto& [arguments, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--chat --chat-template /nonexistent.jinja --prompt x", "no such file"},
           {"--chat --chat-template '{% if %}' --prompt x", "line 1"},
       }) {
    std::string output;
    const int status = RunCommand(generate + arguments, &output);
    EXPECT_NE(status, 0) << arguments;
    EXPECT_LT(status, 128) << output;
    EXPECT_NE(output.find(expected), std::string::npos) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}

// `bench chat-template` without the transformers side: a row per template, the DeepSeek one with
// a native figure, the other without; a missing reference Python is said, not fatal.
TEST(CliTest, BenchChatTemplateReportsEachTemplate) {
  const std::string fixtures = testing::kFixturesDir;
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " bench chat-template --repetitions 1 --hf-python '' " +
                           "--templates " + fixtures + "/tokenizer/templates/deepseek-v3.jinja " +
                           fixtures + "/jinja/templates/qwen3-0.6b.jinja",
                       &output),
            0)
      << output;
  const std::string deepseek = LineAfter(output, "deepseek-v3.jinja");
  const std::string qwen = LineAfter(output, "qwen3-0.6b.jinja");
  std::istringstream d(deepseek), q(qwen);
  std::string renders, parse, interpreted, native;
  d >> renders >> parse >> interpreted >> native;
  EXPECT_GT(std::stoi(renders), 40) << output;
  EXPECT_GT(std::stod(native), 0) << output;
  q >> renders >> parse >> interpreted >> native;
  EXPECT_GT(std::stoi(renders), 30) << output;
  EXPECT_GT(std::stod(interpreted), 0) << output;
  EXPECT_EQ(native, "-") << output;
  EXPECT_NE(output.find("no transformers column: no --hf-python given"), std::string::npos)
      << output;
}

// `bench tokenizer` on a tiktoken checkpoint (Kimi K2's class) without the tiktoken side: the
// corpus row counts the tokens tiktoken gives the corpus (the fixture's expected ids).
TEST(CliTest, BenchTokenizerTakesATiktokenCheckpoint) {
  const std::string fixtures = testing::kFixturesDir;
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " bench tokenizer --repetitions 1 --hf-python '' --tokenizer " +
                           fixtures + "/tiktoken",
                       &output),
            0)
      << output;
  std::istringstream expected(testing::ReadFile(fixtures + "/tiktoken/expected.jsonl"));
  std::istringstream corpus(testing::ReadFile(fixtures + "/tokenizer/corpus.jsonl"));
  int64_t tokens = 0;
  std::string line, unused;
  while (std::getline(corpus, unused) && std::getline(expected, line))
    tokens += static_cast<int64_t>(nlohmann::json::parse(line)["ids"].size());
  std::istringstream row(LineAfter(output, "corpus       switchyard"));
  double megabytes = 0;
  int64_t counted = 0;
  row >> megabytes >> counted;
  EXPECT_EQ(counted, tokens) << output;
  EXPECT_NE(output.find("no reference row: no --hf-python given"), std::string::npos) << output;
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

// quantize writes a GGUF that the other verbs load (gguf_export_test checks its bytes against
// the gguf-py converter's): the default model in Q4_K_M generates.
TEST(CliTest, QuantizeWritesAGgufTheVerbsLoad) {
  const std::string dir = testing::TempDirectory("cli_quantize");
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " quantize --model " + SY_SOURCE_DIR +
                           "/models/default --to q4_k_m --out " + dir + "/m.gguf",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("wrote " + dir + "/m.gguf (q4_k_m)"), std::string::npos) << output;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           "/m.gguf --prompt 'ROMEO:' --max-tokens 4 --ignore-eos",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("generated 4 tokens"), std::string::npos) << output;
}

// A checkpoint whose chat templates sit in transformers' files (chat_template.jinja, and a named
// tool_use one in additional_chat_templates/) keeps both in the GGUF, and serving it renders with
// them as with the checkpoint.
TEST(CliTest, QuantizeKeepsTheCheckpointsChatTemplateFiles) {
  const std::string dir = testing::TempDirectory("cli_quantize_templates");
  const std::string model = dir + "/model";
  std::filesystem::create_directories(model + "/additional_chat_templates");
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "generation_config.json"})
    std::filesystem::create_symlink(std::string(SY_SOURCE_DIR) + "/models/default/" + name,
                                    model + "/" + name);
  std::ofstream(model + "/chat_template.jinja")
      << "{% for m in messages %}[{{ m.content }}]{% endfor %}";
  std::ofstream(model + "/additional_chat_templates/tool_use.jinja")
      << "{{ tools | length }} tools{% for m in messages %}<{{ m.content }}>{% endfor %}";
  std::string output;
  ASSERT_EQ(
      RunCommand(Binary() + " quantize --model " + model + " --to q8_0 --out " + dir + "/m.gguf",
                 &output),
      0)
      << output;
  auto from_gguf = TextCodec::Load(dir + "/m.gguf");
  auto from_checkpoint = TextCodec::Load(model);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  ASSERT_TRUE(from_checkpoint.ok()) << from_checkpoint.status().message();
  EXPECT_EQ(from_gguf->config.chat_template, from_checkpoint->config.chat_template);
  EXPECT_EQ(from_gguf->config.chat_template,
            "{% for m in messages %}[{{ m.content }}]{% endfor %}");
  EXPECT_EQ(from_gguf->config.tool_use_chat_template,
            from_checkpoint->config.tool_use_chat_template);
  EXPECT_TRUE(from_gguf->tool_use_chat.has_value());
  // The int4 export copies them, the named ones' folder too.
  ASSERT_EQ(
      RunCommand(Binary() + " quantize --model " + model + " --to awq-int4 --out " + dir + "/awq",
                 &output),
      0)
      << output;
  auto from_awq = TextCodec::Load(dir + "/awq");
  ASSERT_TRUE(from_awq.ok()) << from_awq.status().message();
  EXPECT_EQ(from_awq->config.chat_template, from_checkpoint->config.chat_template);
  EXPECT_EQ(from_awq->config.tool_use_chat_template,
            from_checkpoint->config.tool_use_chat_template);
}

// DeepSeek-V3.2 has no GGUF form (llama.cpp's deepseek2 has no place for the indexer): a named
// error that points to int4; the int4 export keeps the indexer's layers dense and says so.
TEST(CliTest, QuantizeKeepsDeepSeekV32sIndexer) {
  const std::string dir = testing::TempDirectory("cli_quantize_v32");
  const std::string model = std::string(SY_FIXTURES_DIR) + "/tiny-v32-bf16";
  std::string output;
  EXPECT_NE(
      RunCommand(Binary() + " quantize --model " + model + " --to q4_k_m --out " + dir + "/m.gguf",
                 &output),
      0);
  EXPECT_NE(output.find("model_type deepseek_v32"), std::string::npos) << output;
  EXPECT_NE(output.find("--to awq-int4"), std::string::npos) << output;
  ASSERT_EQ(
      RunCommand(Binary() + " quantize --model " + model + " --to awq-int4 --out " + dir + "/awq",
                 &output),
      0)
      << output;
  const std::string config = testing::ReadFile(dir + "/awq/config.json");
  for (const char* module : {"indexer.wq_b", "indexer.wk", "indexer.weights_proj"})
    EXPECT_NE(config.find(std::string("\"") + module + "\""), std::string::npos) << module;
}

// A model where only some layers of a kind fit int4 groups of 128 (tiny-v3-bf16: the experts'
// down_proj is 64 wide, the dense one 512): the unquantized ones are listed by full name, so
// every format loads (a short "down_proj" took in the quantized ones too, which then were
// "missing").
TEST(CliTest, QuantizeListsPartlyQuantizedKindsByModule) {
  const std::string dir = testing::TempDirectory("cli_quantize_partial");
  const std::string model = std::string(SY_FIXTURES_DIR) + "/tiny-v3-bf16";
  for (const char* to : {"awq-int4", "gptq-int4", "ct-w4a16", "ct-w4a16-asym"}) {
    std::string output;
    ASSERT_EQ(RunCommand(Binary() + " quantize --model " + model + " --to " + to + " --out " + dir +
                             "/" + to,
                         &output),
              0)
        << output;
    const std::string config = testing::ReadFile(dir + "/" + to + "/config.json");
    EXPECT_NE(config.find("model.layers.1.mlp.experts.0.down_proj"), std::string::npos) << to;
    EXPECT_EQ(config.find("\"down_proj\""), std::string::npos) << to;
    ASSERT_EQ(RunCommand(Binary() + " logits --model " + dir + "/" + to + " --tokens 1,2,3 --out " +
                             dir + "/" + to + ".bin",
                         &output),
              0)
        << to << ": " << output;
  }
}

// init-model --index-topk writes a DeepSeek-V3.2 model (an indexer in every layer) that loads and
// generates, its queries past the 16th key attending sparsely.
TEST(CliTest, InitModelWritesADeepSeekV32Model) {
  const std::string dir = testing::TempDirectory("cli_init_v32");
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " init-model --out " + dir + " --index-topk 16", &output), 0)
      << output;
  const std::string config = testing::ReadFile(dir + "/config.json");
  EXPECT_NE(config.find("\"deepseek_v32\""), std::string::npos) << config;
  EXPECT_NE(config.find("\"index_topk\": 16"), std::string::npos) << config;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           " --prompt 'ROMEO: But soft, what light through yonder window breaks?'"
                           " --max-tokens 8 --ignore-eos",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("generated 8 tokens"), std::string::npos) << output;
}

// quantize --to awq-int4 writes a checkpoint directory the verbs load (int4_export_test checks
// its codes through the int4 loader).
TEST(CliTest, QuantizeWritesAnAwqCheckpointTheVerbsLoad) {
  const std::string dir = testing::TempDirectory("cli_quantize_awq");
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " quantize --model " + SY_SOURCE_DIR +
                           "/models/default --to awq-int4 --out " + dir + "/awq",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("wrote " + dir + "/awq (awq-int4)"), std::string::npos) << output;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           "/awq --prompt 'ROMEO:' --max-tokens 4 --ignore-eos",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("generated 4 tokens"), std::string::npos) << output;
  // Again into the same directory: refused, the checkpoint kept.
  EXPECT_NE(RunCommand(Binary() + " quantize --model " + SY_SOURCE_DIR +
                           "/models/default --to awq-int4 --out " + dir + "/awq",
                       &output),
            0);
  EXPECT_NE(output.find("not an empty directory"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/awq/model.safetensors"));
}

// quantize --calibrate runs the model on a text first (plain, or .jsonl of {"text": ...}), then
// writes the checkpoint; the calibration's bad calls are errors naming what is wrong.
TEST(CliTest, QuantizeCalibratesOnATextFirst) {
  const std::string dir = testing::TempDirectory("cli_quantize_calibrate");
  testing::WriteFile(dir + "/text.txt",
                     "ROMEO: But soft, what light through yonder window breaks?\n"
                     "It is the east, and Juliet is the sun.\n");
  const std::string quantize =
      Binary() + " quantize --model " + SY_SOURCE_DIR + "/models/default --to ct-w4a16 ";
  std::string output;
  ASSERT_EQ(RunCommand(quantize + "--out " + dir + "/a --calibrate " + dir +
                           "/text.txt --calibrate-length 8",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("linear layers measured"), std::string::npos) << output;
  ASSERT_EQ(RunCommand(quantize + "--out " + dir + "/b --calibrate-tokens 300 --calibrate " +
                           SY_SOURCE_DIR + "/configs/bench/heldout-prompts.jsonl",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("calibrated on 300 tokens"), std::string::npos) << output;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           "/a --prompt 'ROMEO:' --max-tokens 4 --ignore-eos",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("generated 4 tokens"), std::string::npos) << output;

  EXPECT_NE(
      RunCommand(quantize + "--out " + dir + "/c --calibrate " + dir + "/missing.txt", &output), 0);
  EXPECT_NE(output.find(dir + "/missing.txt: cannot open"), std::string::npos) << output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/c"));
  EXPECT_NE(RunCommand(Binary() + " quantize --model " + SY_SOURCE_DIR +
                           "/models/default --to q8_0 --out " + dir + "/d.gguf --calibrate " + dir +
                           "/text.txt",
                       &output),
            0);
  EXPECT_NE(output.find("--calibrate: for the int4 formats"), std::string::npos) << output;
}

// Writes `lines` to a file and runs `command < file`.
int RunWithInput(const std::string& command, const std::string& input, std::string* output) {
  const std::string path = testing::TempDirectory("cli_stdin") + "/in.jsonl";
  std::ofstream(path, std::ios::binary) << input;
  return RunCommand("(" + command + " < " + path + ")", output);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

TEST(CliTest, TokenizeMatchesHuggingFaceAndDecodesBack) {
  const std::string fixtures = std::string(testing::kFixturesDir) + "/tokenizer";
  std::ifstream corpus(fixtures + "/corpus.jsonl"),
      expected(fixtures + "/deepseek-v3/expected.jsonl");
  std::string input, decode_input;
  std::vector<std::vector<int32_t>> want;
  std::vector<std::string> texts;
  for (std::string c, e; std::getline(corpus, c) && std::getline(expected, e);) {
    auto text = nlohmann::json::parse(c)["text"];
    auto ids = nlohmann::json::parse(e)["ids"];
    input += nlohmann::json{{"text", text}}.dump() + "\n";
    decode_input += nlohmann::json{{"ids", ids}}.dump() + "\n";
    want.push_back(ids.get<std::vector<int32_t>>());
    texts.push_back(nlohmann::json::parse(e)["decoded"]);
  }
  ASSERT_GT(want.size(), 100u);
  std::string output;
  ASSERT_EQ(
      RunWithInput(Binary() + " tokenize --tokenizer " + fixtures + "/deepseek-v3", input, &output),
      0)
      << output.substr(0, 500);
  auto lines = Lines(output);
  ASSERT_EQ(lines.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(nlohmann::json::parse(lines[i])["ids"].get<std::vector<int32_t>>(), want[i]) << i;
  ASSERT_EQ(RunWithInput(Binary() + " tokenize --decode --tokenizer " + fixtures +
                             "/deepseek-v3/tokenizer.json",
                         decode_input, &output),
            0);
  lines = Lines(output);
  ASSERT_EQ(lines.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(nlohmann::json::parse(lines[i])["text"].get<std::string>(), texts[i]) << i;
}

TEST(CliTest, TokenizeNamesBadLinesAndKeepsGoing) {
  std::string output;
  const std::string tokenizer =
      " tokenize --tokenizer " + std::string(testing::kFixturesDir) + "/tokenizer/deepseek-v3";
  int status =
      RunWithInput(Binary() + tokenizer + " 2>/dev/null",
                   "{\"text\": \"a\"}\n{\"txt\": 1}\nnot json\n{\"text\": \"b\"}\n", &output);
  EXPECT_EQ(status, 1);
  auto lines = Lines(output);
  ASSERT_EQ(lines.size(), 4u) << output;
  EXPECT_TRUE(nlohmann::json::parse(lines[0]).contains("ids"));
  EXPECT_NE(lines[1].find("line 2"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("line 3"), std::string::npos) << lines[2];
  EXPECT_TRUE(nlohmann::json::parse(lines[3]).contains("ids"));
  status = RunWithInput(Binary() + tokenizer + " --decode 2>/dev/null",
                        "{\"ids\": [1, -1]}\n{\"ids\": [999999999]}\n", &output);
  EXPECT_EQ(status, 1);
  lines = Lines(output);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("ids[1]"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("ids[0]"), std::string::npos) << lines[1];
}

// N-gram speculative decoding from the command line, on the trained default model (whose greedy
// output repeats itself): the same tokens as plain decoding, drafts proposed and some kept, in
// switchyard's options and in vLLM's --speculative-config alike; bad combinations are refused by
// name.
TEST(CliTest, NgramSpeculationGivesThePlainTokens) {
  const std::string base = Binary() +
                           " generate --prompt 'ROMEO: But soft, what light' --prompt "
                           "'KING HENRY: Now, lords' --max-tokens 40 --ignore-eos --json";
  std::string output;
  ASSERT_EQ(RunCommand(base, &output), 0) << output;
  const auto plain = nlohmann::json::parse(output);
  for (const std::string& flags :
       {std::string(" --speculative ngram --num-speculative-tokens 3 --prompt-lookup-max 3"),
        std::string(" --speculative ngram --num-speculative-tokens 3 --prompt-lookup-drafts fixed"),
        std::string(" --speculative-config '{\"method\": \"ngram\", "
                    "\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 3}'")}) {
    SCOPED_TRACE(flags);
    ASSERT_EQ(RunCommand(base + flags, &output), 0) << output;
    const auto drafted = nlohmann::json::parse(output);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_EQ(drafted["outputs"][i]["token_ids"], plain["outputs"][i]["token_ids"]);
    const auto& speculative = drafted["speculative"];
    EXPECT_EQ(speculative["method"], "ngram");
    EXPECT_EQ(speculative["num_speculative_tokens"], 3);
    EXPECT_GT(speculative["draft_tokens"].get<int64_t>(), 0);
    EXPECT_GT(speculative["accepted_tokens"].get<int64_t>(), 0);
    EXPECT_LE(speculative["accepted_per_position"].size(), 3u);
  }
  const std::vector<std::pair<std::string, std::string>> refused = {
      {" --speculative ngram --prompt-lookup-min 4 --prompt-lookup-max 2",
       "the minimum 4 exceeds the maximum 2"},
      {" --prompt-lookup-max 3", "need --speculative"},
      {" --prompt-lookup-drafts fixed", "need --speculative"},
      {" --speculative mtp --prompt-lookup-max 3", "only for --speculative ngram"},
      {" --speculative-config '{\"method\": \"eagle\"}'", "method \"eagle\" is not supported"},
      {" --speculative-config '{\"method\": \"ngram\", \"draft_model\": 1}'",
       "\"draft_model\" is not supported"},
      {" --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 9}'",
       "num_speculative_tokens 9 is not in [1, 8]"},
      {" --speculative-config '{\"num_speculative_tokens\": 2}'", "no method"},
      {" --speculative-config '[1]'", "not a JSON object"},
      {" --speculative ngram --speculative-config '{\"method\": \"ngram\"}'", "alone"},
  };
  for (const auto& [flags, message] : refused) {
    EXPECT_NE(RunCommand(base + flags, &output), 0) << flags;
    EXPECT_NE(output.find(message), std::string::npos) << flags << ": " << output;
  }
}

// `run-batch` (vLLM's): a file of batch requests to both endpoints, run without a server, every
// line's result written in the input's order — the completion's text the one `generate` gives
// (greedy, the same prompt), a refused line with its error; the exit code says a line failed;
// a malformed file fails naming its line and writes nothing.
TEST(CliTest, RunBatchWritesEveryLinesResultInOrder) {
  const std::string dir = testing::TempDirectory("cli_run_batch");
  const std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl";
  {
    std::ofstream f(in);
    f << R"({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": )"
         R"({"model": "default", "messages": [{"role": "user", "content": "Who art thou?"}], )"
         R"("max_tokens": 5, "temperature": 0}})"
      << "\n"
      << R"({"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": )"
         R"({"model": "default", "prompt": "ROMEO: But soft", "max_tokens": 6, )"
         R"("temperature": 0, "ignore_eos": true}})"
      << "\n\n"
      << R"({"custom_id": "bad", "method": "POST", "url": "/v1/completions", "body": )"
         R"({"model": "default", "prompt": "x", "top_p": 7}})"
      << "\n";
  }
  std::string output;
  EXPECT_EQ(RunCommand(Binary() + " run-batch -i " + in + " -o " + out, &output), 1) << output;
  EXPECT_NE(output.find("3 requests, 2 completed, 1 failed"), std::string::npos) << output;
  std::ifstream f(out);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);)
    lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["custom_id"], "chat");
  EXPECT_EQ(lines[0]["response"]["body"]["object"], "chat.completion");
  EXPECT_EQ(lines[0]["response"]["body"]["usage"]["completion_tokens"], 5);
  EXPECT_EQ(lines[1]["custom_id"], "text");
  EXPECT_EQ(lines[1]["response"]["status_code"], 200);
  std::string generated;
  ASSERT_EQ(RunCommand(Binary() + " generate --prompt 'ROMEO: But soft' --max-tokens 6 "
                                  "--ignore-eos --json",
                       &generated),
            0)
      << generated;
  EXPECT_EQ(lines[1]["response"]["body"]["choices"][0]["text"],
            nlohmann::json::parse(generated)["outputs"][0]["text"]);
  EXPECT_EQ(lines[2]["custom_id"], "bad");
  EXPECT_EQ(lines[2]["response"]["status_code"], 400);
  EXPECT_EQ(lines[2]["response"]["body"]["error"]["param"], "top_p");
  // A custom_id twice: the batch fails before anything runs, naming the input's line.
  {
    std::ofstream g(in);
    g << R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}})"
      << "\n"
      << R"({"custom_id": "z", "method": "POST", "url": "/v1/chat/completions", "body": {}})"
      << "\n"
      << R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "y"}})"
      << "\n";
  }
  std::filesystem::remove(out);
  EXPECT_NE(RunCommand(Binary() + " run-batch -i " + in + " -o " + out, &output), 0);
  EXPECT_NE(output.find("line 3: custom_id \"a\""), std::string::npos) << output;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(CliTest, TextPromptsGenerateTheSameTokensAsTheirIds) {
  std::string dir = testing::TempDirectory("cli_text") + "/m";
  std::string output;
  ASSERT_EQ(RunCommand(Binary() + " init-model --out " + dir, &output), 0) << output;
  ASSERT_EQ(RunWithInput(Binary() + " tokenize --model " + dir,
                         "{\"text\": \"ROMEO: But soft, what light\"}\n", &output),
            0)
      << output;
  auto ids = nlohmann::json::parse(output)["ids"].get<std::vector<int32_t>>();
  std::string id_list = "0";  // the default tokenizer's config asks for BOS
  for (int32_t id : ids)
    id_list += "," + std::to_string(id);
  std::string from_text, from_ids;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           " --prompt 'ROMEO: But soft, what light' --prompt 'x' --max-tokens 5 "
                           "--ignore-eos --json",
                       &from_text),
            0)
      << from_text;
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir + " --prompt-tokens '" + id_list +
                           "' --max-tokens 5 --ignore-eos --json",
                       &from_ids),
            0)
      << from_ids;
  auto text_report = nlohmann::json::parse(from_text);
  auto ids_report = nlohmann::json::parse(from_ids);
  ASSERT_EQ(text_report["outputs"].size(), 2u);
  EXPECT_EQ(text_report["outputs"][0]["prompt"], "ROMEO: But soft, what light");
  EXPECT_EQ(text_report["outputs"][0]["token_ids"], ids_report["outputs"][0]["token_ids"]);
  EXPECT_EQ(text_report["outputs"][0]["text"], ids_report["outputs"][0]["text"]);
  EXPECT_EQ(text_report["outputs"][0]["token_ids"].size(), 5u);
  EXPECT_TRUE(text_report["speculative"].is_null());
  // The chat form renders the template (BOS, user tag, assistant tag) before generating.
  ASSERT_EQ(RunCommand(Binary() + " generate --model " + dir +
                           " --chat --prompt 'Who art thou?' --max-tokens 2 --ignore-eos --json",
                       &output),
            0)
      << output;
  EXPECT_EQ(nlohmann::json::parse(output)["outputs"][0]["token_ids"].size(), 2u);
}

TEST(CliTest, VerbsWithoutModelUseTheEmbeddedDefault) {
  std::string output;
  ASSERT_EQ(RunWithInput(Binary() + " tokenize", "{\"text\": \"Good morrow\"}\n", &output), 0)
      << output;
  EXPECT_NE(output.find("\"ids\""), std::string::npos);
  ASSERT_EQ(RunCommand(Binary() + " generate --prompt 'Good morrow' --max-tokens 2 2>&1", &output),
            0)
      << output;
  EXPECT_NE(output.find("text 0:"), std::string::npos) << output;
}

TEST(CliTest, TextBadInputIsOneLine) {
  std::string fixture = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";
  std::vector<BadCall> calls = {
      {"generate --model " + fixture + " --prompt hi", "tokenizer.json"},
      {"generate --prompt hi --prompt-tokens 1", "either"},
      {"generate --prompt-tokens 1 --chat", "--chat"},
      {"generate --model " + fixture + " --prompt-tokens 1,2 --max-tokens 100000000", "context"},
      {"tokenize --tokenizer /nonexistent/tok.json", "/nonexistent"},
      {"logits --model " + fixture + " --tokens 1,2 --out /tmp", "is a directory"},
      {"logits --model " + fixture + " --tokens 1,2 --out /nonexistent/x.bin", "cannot create"},
  };
  for (const auto& call : calls) {
    std::string output;
    int status = RunCommand(Binary() + " " + call.arguments + " </dev/null", &output);
    EXPECT_NE(status, 0) << call.arguments;
    EXPECT_LT(status, 128) << "crashed: " << call.arguments << "\n" << output;
    EXPECT_NE(output.find(call.expected), std::string::npos) << call.arguments << "\n" << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}

TEST(CliTest, MoreThreadsThanCoresIsRefusedAtOnce) {
  std::string output;
  int status = RunCommand(Binary() + " --threads 100000 generate --prompt-tokens 1", &output);
  EXPECT_NE(status, 0);
  EXPECT_LT(status, 128);
  EXPECT_NE(output.find("--threads"), std::string::npos) << output;
}

}  // namespace
}  // namespace sy
