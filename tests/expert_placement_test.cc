// Expert load balancing end to end with real MPI processes: the recorded load (counts equal
// across EP sizes, totals = tokens × top-k), `switchyard eplb`, and runs with redundant experts
// and a placement that give the contiguous run's tokens and logits; bad placements refused.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace sy {
namespace {

using testing::RunCommand;

using testing::Mpirun;
using testing::ReadLogits;

// The JSON line `generate --json` prints (stderr went elsewhere).
nlohmann::json GenerateJson(const std::string& output) {
  const size_t start = output.find("{\"");
  EXPECT_NE(start, std::string::npos) << output;
  if (start == std::string::npos) return {};
  return nlohmann::json::parse(output.substr(start, output.find('\n', start) - start));
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(testing::ReadFile(path));
}

const std::string kPrompts =
    " --prompt-tokens '5,6,7,8,9,10;11,12;13,14,15,16' --max-tokens 6"
    " --ignore-eos --kv-dtype f32";

// The load recorded by one process and by four ranks (gathered to rank 0) is the same routing:
// equal counts per layer and expert, every layer's total = tokens × top-k, and the four-rank run
// reports its imbalance.
TEST(ExpertLoadRecording, FourRanksGatherTheSingleProcessCounts) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-bf16";
  const std::string dir = testing::TempDirectory("eplb_record");
  const std::string args =
      " --threads 1 generate --model " + model + kPrompts + " --record-expert-load ";
  std::string one, many;
  ASSERT_EQ(
      RunCommand(std::string(testing::kBinary) + args + dir + "/one.json 2>" + dir + "/one.err",
                 &one),
      0)
      << one << testing::ReadFile(dir + "/one.err");
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + dir +
                           "/many.json --wire-dtype f32 2>" + dir + "/many.err",
                       &many),
            0)
      << many << testing::ReadFile(dir + "/many.err");
  const nlohmann::json a = ReadJson(dir + "/one.json"), b = ReadJson(dir + "/many.json");
  for (int s = 0; s < 3; ++s) {
    const std::string key = "sequence " + std::to_string(s) + ":";
    ASSERT_NE(many.find(key), std::string::npos) << many;
    EXPECT_EQ(one.substr(one.find(key), one.find('\n', one.find(key)) - one.find(key)),
              many.substr(many.find(key), many.find('\n', many.find(key)) - many.find(key)));
  }
  EXPECT_EQ(one.find("expert imbalance"), std::string::npos) << one;  // one rank: no exchanges
  EXPECT_TRUE(a["expert_imbalance"].is_null());
  ASSERT_TRUE(b["expert_imbalance"].is_number()) << many;
  const double imbalance = b["expert_imbalance"].get<double>();
  EXPECT_GE(imbalance, 1.0);
  EXPECT_LE(imbalance, 4.0);  // the busiest of 4 ranks holds at most all of the rows
  EXPECT_NE(many.find(fmt::format("expert imbalance {:.3f}", imbalance)), std::string::npos)
      << many;
  EXPECT_EQ(b["ranks"], 4);
  EXPECT_EQ(a["window"], b["window"]);
  // 3 prompts: 12 prompt tokens, then at least 5 decode steps of 3 tokens.
  EXPECT_GE(a["window"]["tokens"].get<int64_t>(), 12 + 5 * 3);
  EXPECT_GE(a["window"]["steps"].get<int64_t>(), 1 + 5);
  ASSERT_GE(a["layers"].size(), 2u);  // layers 1 and 2 (and the MTP block, never run here)
  EXPECT_EQ(a["layers"].size(), b["layers"].size());
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(a["layers"][l]["counts"], b["layers"][l]["counts"]) << l;
    int64_t total = 0;
    for (const auto& c : a["layers"][l]["counts"])
      total += c.get<int64_t>();
    EXPECT_EQ(total, a["window"]["tokens"].get<int64_t>() * a["top_k"].get<int64_t>()) << l;
  }
}

// A skewed load (made here: experts 0–3 draw most tokens), balanced by the verb for EP4 with
// four redundant experts, then runs with it and without: the same logits as one process.
struct PlacementCase {
  int ranks;
  int64_t redundant;
  bool from_eplb;  // else the default replicas (experts 0, 1, … in the extra slots)
  std::string flags;
};

class ExpertPlacementRuns : public ::testing::TestWithParam<PlacementCase> {};

std::string SkewedLoadJson() {
  nlohmann::json layers = nlohmann::json::array();
  for (int layer : {1, 2, 3}) {
    std::vector<int64_t> counts(16, 10);
    for (int e = 0; e < 4; ++e)
      counts[(e * 5 + layer) % 16] = 400 / (e + 1);
    layers.push_back({{"layer", layer}, {"counts", counts}});
  }
  return nlohmann::json({{"experts", 16}, {"top_k", 4}, {"groups", 4}, {"layers", layers}}).dump();
}

TEST_P(ExpertPlacementRuns, LogitsMatchTheSingleProcessRun) {
  const PlacementCase& c = GetParam();
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  const std::string dir = testing::TempDirectory(
      "eplb_run" + std::to_string(c.ranks) + "_" + std::to_string(c.redundant) +
      (c.from_eplb ? "p" : "d") + std::to_string(c.flags.size()));
  std::string output;
  std::string placement;
  if (c.from_eplb) {
    testing::WriteFile(dir + "/load.json", SkewedLoadJson());
    ASSERT_EQ(
        RunCommand(std::string(testing::kBinary) + " eplb --load " + dir + "/load.json --ep " +
                       std::to_string(c.ranks) + " --num-redundant-experts " +
                       std::to_string(c.redundant) + " --out " + dir + "/placement.json",
                   &output),
        0)
        << output;
    EXPECT_NE(output.find("predicted imbalance"), std::string::npos) << output;
    placement = " --expert-placement " + dir + "/placement.json";
  }
  const std::string args = " --threads 1 --f32-products logits --model " + fixture.directory +
                           " --tokens '" + fixture.tokens_text + "' --decode-from 4";
  ASSERT_EQ(
      RunCommand(std::string(testing::kBinary) + args + " --out " + dir + "/one.bin", &output), 0)
      << output;
  ASSERT_EQ(RunCommand(Mpirun(c.ranks) + testing::kBinary + args + " --out " + dir +
                           "/contiguous.bin --wire-dtype f32 " + c.flags,
                       &output),
            0)
      << output;
  ASSERT_EQ(RunCommand(Mpirun(c.ranks) + testing::kBinary + args + " --out " + dir +
                           "/placed.bin --wire-dtype f32 --num-redundant-experts " +
                           std::to_string(c.redundant) + placement + " " + c.flags,
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("expert slots"), std::string::npos) << output;  // ranks report their share
  const std::vector<float> one = ReadLogits(dir + "/one.bin");
  const std::vector<float> placed = ReadLogits(dir + "/placed.bin");
  auto comparison = testing::CompareLogits(one, placed, fixture.vocab);
  EXPECT_EQ(comparison.argmax_mismatches, 0);
  EXPECT_LE(comparison.max_abs_diff, 1e-4 * comparison.max_abs_reference);
  // Against the contiguous EP run: every expert row is computed by the same per-row arithmetic
  // wherever it lands, and the combine sums in logical-expert order, so the logits are the same
  // bits.
  EXPECT_EQ(ReadLogits(dir + "/contiguous.bin"), placed);
  // And with experts moving between ranks mid-run (each arrival checked against the checkpoint).
  ASSERT_EQ(RunCommand("SWITCHYARD_VERIFY_EXPERT_MOVES=1 " + Mpirun(c.ranks) + testing::kBinary +
                           args + " --out " + dir + "/online.bin --wire-dtype f32 " +
                           "--num-redundant-experts " + std::to_string(c.redundant) + placement +
                           " --eplb-interval 2 --eplb-min-gain -1 " + c.flags,
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("experts moved: "), std::string::npos) << output;
  EXPECT_EQ(ReadLogits(dir + "/contiguous.bin"), ReadLogits(dir + "/online.bin"));
}

INSTANTIATE_TEST_SUITE_P(
    Launches, ExpertPlacementRuns,
    ::testing::Values(PlacementCase{2, 2, false, ""},
                      PlacementCase{4, 4, true, "--overlap microbatch"},
                      PlacementCase{4, 0, true, "--overlap dispatch --tp 2"},
                      PlacementCase{4, 4, true, "--replica-dispatch spread"},
                      PlacementCase{4, 4, true, "--replica-dispatch own-rank"}),
    [](const ::testing::TestParamInfo<PlacementCase>& info) {
      const PlacementCase& c = info.param;
      return "ep" + std::to_string(c.ranks) + "_r" + std::to_string(c.redundant) +
             (c.from_eplb ? "_eplb" : "_default") +
             (c.flags.find("--overlap") != std::string::npos ? "_overlap" : "") +
             (c.flags.find("spread") != std::string::npos ? "_spread" : "") +
             (c.flags.find("own-rank") != std::string::npos ? "_own_rank" : "");
    });

// A skewed workload: the trained default model (Shakespeare) on text unlike its training data,
// greedy, through `generate --json`; the caller adds --max-tokens and what it tests.
std::string SkewedGenerate() {
  return std::string(" --threads 1 generate --model ") + SY_SOURCE_DIR + "/models/default" +
         " --prompt 'for (int i = 0; i < n; ++i) x[i] = 0;'"
         " --prompt '0123456789 0123456789 0123456789'"
         " --prompt '{\"key\": [1, 2, 3]}' --ignore-eos --kv-dtype f32 --json --wire-dtype f32";
}

// Runs on a skewed workload: the load measured under EP4, balanced with four redundant experts,
// then the same generation with the placement — the same tokens, and less imbalance.
TEST(ExpertPlacementRuns, BalancedPlacementLowersTheMeasuredImbalance) {
  const std::string dir = testing::TempDirectory("eplb_skew");
  const std::string args = SkewedGenerate() + " --max-tokens 16";
  std::string before, after, output;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " --record-expert-load " + dir +
                           "/load.json 2>" + dir + "/err",
                       &before),
            0)
      << before << testing::ReadFile(dir + "/err");
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + " eplb --load " + dir +
                           "/load.json --ep 4 --num-redundant-experts 4 --out " + dir + "/p.json",
                       &output),
            0)
      << output;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args +
                           " --num-redundant-experts 4 --expert-placement " + dir + "/p.json 2>" +
                           dir + "/err",
                       &after),
            0)
      << after << testing::ReadFile(dir + "/err");
  const nlohmann::json b = GenerateJson(before), a = GenerateJson(after);
  EXPECT_EQ(b["outputs"], a["outputs"]);
  const double was = b["expert_imbalance"].get<double>(), now = a["expert_imbalance"].get<double>();
  EXPECT_LT(now, was) << output;
}

// With --eplb-interval the recorder is cleared every window; the run's imbalance must still
// cover every window, not only the last. Windows that never move (no placement gains 10) route
// exactly as the static run does, so the sums are the same: integers and quarters, exact in
// doubles whatever the grouping.
TEST(ExpertPlacementRuns, TheRunsImbalanceCoversEveryWindow) {
  const std::string dir = testing::TempDirectory("eplb_windows");
  const std::string args = SkewedGenerate() + " --max-tokens 12 --num-redundant-experts 4";
  std::string whole, windows;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " 2>" + dir + "/err", &whole), 0)
      << whole << testing::ReadFile(dir + "/err");
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args +
                           " --eplb-interval 3 --eplb-min-gain 10 2>" + dir + "/err",
                       &windows),
            0)
      << windows << testing::ReadFile(dir + "/err");
  const std::string said = windows + testing::ReadFile(dir + "/err");
  EXPECT_NE(said.find("experts kept after 3 steps"), std::string::npos) << said;
  const nlohmann::json w = GenerateJson(whole), s = GenerateJson(windows);
  EXPECT_EQ(w["outputs"], s["outputs"]);
  EXPECT_EQ(w["expert_imbalance"].get<double>(), s["expert_imbalance"].get<double>());
}

// Online rebalancing: every two steps rank 0 balances the window's load and the experts each
// rank's new slots need travel from their holders over MPI, on a thread beside the steps, and
// switch layer by layer at step boundaries — the logits stay the contiguous run's bits, greedy
// tokens the single process's, and every moved expert is the checkpoint's bytes (each rank checks
// its arrivals against a fresh load and ends the job on a difference).
TEST(ExpertPlacementRuns, OnlineRebalancingChangesNothingButThePlacement) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  const std::string dir = testing::TempDirectory("eplb_online");
  const std::string args = " --threads 1 --f32-products logits --model " + fixture.directory +
                           " --tokens '" + fixture.tokens_text + "' --decode-from 4" +
                           " --wire-dtype f32 --overlap microbatch";
  std::string output;
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " --out " + dir + "/contiguous.bin",
                       &output),
            0)
      << output;
  ASSERT_EQ(
      RunCommand("SWITCHYARD_VERIFY_EXPERT_MOVES=1 " + Mpirun(4) + testing::kBinary + args +
                     " --out " + dir +
                     "/online.bin --num-redundant-experts 4 --eplb-interval 2 --eplb-min-gain -1",
                 &output),
      0)
      << output;
  EXPECT_NE(output.find("experts rebalanced after 2 steps"), std::string::npos) << output;
  EXPECT_NE(output.find("experts moved: "), std::string::npos) << output;
  EXPECT_EQ(output.find("experts moved: 0 experts"), std::string::npos) << output;
  EXPECT_EQ(ReadLogits(dir + "/contiguous.bin"), ReadLogits(dir + "/online.bin"));
  // Moved inside the window's step instead of beside the steps: the same bits.
  ASSERT_EQ(
      RunCommand("SWITCHYARD_EXPERT_MOVES=inline " + Mpirun(4) + testing::kBinary + args +
                     " --out " + dir +
                     "/inline.bin --num-redundant-experts 4 --eplb-interval 2 --eplb-min-gain -1",
                 &output),
      0)
      << output;
  EXPECT_NE(output.find("experts moved: "), std::string::npos) << output;
  EXPECT_EQ(ReadLogits(dir + "/contiguous.bin"), ReadLogits(dir + "/inline.bin"));
  // A placement must gain at least --eplb-min-gain to be moved to; no placement gains 10.
  ASSERT_EQ(RunCommand(Mpirun(4) + testing::kBinary + args + " --out " + dir +
                           "/kept.bin --num-redundant-experts 4 --eplb-interval 2"
                           " --eplb-min-gain 10",
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("experts kept after 2 steps"), std::string::npos) << output;
  EXPECT_EQ(output.find("experts rebalanced"), std::string::npos) << output;
  EXPECT_EQ(output.find("experts moved: "), std::string::npos) << output;
  EXPECT_EQ(ReadLogits(dir + "/contiguous.bin"), ReadLogits(dir + "/kept.bin"));

  const std::string model = std::string(SY_SOURCE_DIR) + "/models/default";
  const std::string generate =
      " --threads 1 --prefill-gemm own generate --model " + model +
      " --prompt 'for (int i = 0; i < n; ++i)' --prompt '[1, 2, 3]'"
      " --max-tokens 12 --ignore-eos --kv-dtype f32"
      " --speculative mtp --num-speculative-tokens 2";  // MTP's experts move too
  std::string one, many;
  ASSERT_EQ(RunCommand(std::string(testing::kBinary) + generate, &one), 0) << one;
  ASSERT_EQ(
      RunCommand(
          "SWITCHYARD_VERIFY_EXPERT_MOVES=1 " + Mpirun(4) + testing::kBinary + generate +
              " --wire-dtype f32 --eplb-interval 3 --eplb-min-gain -1 --num-redundant-experts 4",
          &many),
      0)
      << many;
  EXPECT_NE(many.find("experts rebalanced after 3 steps"), std::string::npos) << many;
  EXPECT_NE(many.find("experts moved: "), std::string::npos) << many;
  for (const std::string key : {"text 0:", "text 1:"}) {
    ASSERT_NE(many.find(key), std::string::npos) << many;
    EXPECT_EQ(one.substr(one.find(key), one.find('\n', one.find(key)) - one.find(key)),
              many.substr(many.find(key), many.find('\n', many.find(key)) - many.find(key)));
  }
}

// A rank that dies while experts move ends the job: mpirun reports the death and every rank
// exits, none left waiting for the dead rank's experts.
TEST(ExpertPlacementRuns, ARankThatDiesWhileExpertsMoveEndsTheJob) {
  auto fixture = testing::LoadFixture("tiny-v3-fp8");
  const std::string dir = testing::TempDirectory("eplb_dies");
  std::string output;
  const int code = RunCommand(
      "SWITCHYARD_TEST_EXIT_WHILE_MOVING=2 " + Mpirun(4, 120) + testing::kBinary +
          " --threads 1 --f32-products logits --model " + fixture.directory + " --tokens '" +
          fixture.tokens_text + "' --decode-from 4 --wire-dtype f32 --out " + dir +
          "/dies.bin --num-redundant-experts 4 --eplb-interval 2 --eplb-min-gain -1",
      &output);
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(code, 124) << "timed out: a rank waited for the dead one\n" << output;
  EXPECT_NE(output.find("experts rebalanced"), std::string::npos) << output;
}

// Placements that do not fit the run fail on every rank with one clear message.
TEST(ExpertPlacementErrors, BadPlacementsAreRefused) {
  const std::string model = std::string(testing::kFixturesDir) + "/tiny-v3-fp8";  // 16 experts
  const std::string dir = testing::TempDirectory("eplb_errors");
  const std::string run = std::string(testing::kBinary) + " --threads 1 logits --model " + model +
                          " --tokens '1,2' --out /dev/null";
  auto fails = [&](const std::string& command, const std::string& message) {
    std::string output;
    const int status = RunCommand(command, &output);
    EXPECT_NE(status, 0) << command;
    EXPECT_LT(status, 124) << "timed out: " << command;
    EXPECT_NE(output.find(message), std::string::npos) << command << "\n" << output;
  };
  auto placement = [](int ranks, const std::vector<int>& layers, int missing_expert) {
    nlohmann::json out = {{"experts", 16}, {"ranks", ranks}, {"layers", nlohmann::json::array()}};
    for (int layer : layers) {
      nlohmann::json per_rank = nlohmann::json::array();
      for (int r = 0; r < ranks; ++r) {
        std::vector<int> ids;
        for (int e = r * 16 / ranks; e < (r + 1) * 16 / ranks; ++e)
          ids.push_back(e == missing_expert ? 0 : e);
        per_rank.push_back(ids);
      }
      out["layers"].push_back({{"layer", layer}, {"ranks", per_rank}});
    }
    return out.dump();
  };
  testing::WriteFile(dir + "/four.json", placement(4, {1, 2, 3}, -1));
  fails(Mpirun(2) + run + " --expert-placement " + dir + "/four.json",
        "the placement is for 4 ranks, this run has 2");
  testing::WriteFile(dir + "/no_layer.json", placement(2, {1, 3}, -1));
  fails(Mpirun(2) + run + " --expert-placement " + dir + "/no_layer.json",
        "the placement has no layer 2");
  testing::WriteFile(dir + "/orphan.json", placement(2, {1, 2, 3}, 7));
  fails(Mpirun(2) + run + " --expert-placement " + dir + "/orphan.json", "expert 7 has no replica");
  fails(Mpirun(2) + run + " --expert-placement " + dir + "/four.json --num-redundant-experts 2",
        "the placement is for 4 ranks");
  fails(Mpirun(2) + run + " --num-redundant-experts 1",
        "16 routed experts + 1 redundant cannot be spread evenly over 2 ranks");
  fails(run + " --num-redundant-experts 2", "need expert parallelism");
  fails(run + " --eplb-interval 5", "need expert parallelism");
  // The offline verb names what does not fit.
  testing::WriteFile(dir + "/load.json", SkewedLoadJson());
  fails(std::string(testing::kBinary) + " eplb --load " + dir +
            "/load.json --ep 4 --num-redundant-experts 2 --out " + dir + "/p.json",
        "16 experts + 2 redundant cannot be spread evenly over 4 ranks");
  testing::WriteFile(dir + "/bad_load.json", R"({"experts": 16, "top_k": 4, "layers": []})");
  fails(std::string(testing::kBinary) + " eplb --load " + dir + "/bad_load.json --ep 4 --out " +
            dir + "/p.json",
        "'layers' must be a non-empty array");
}

// serve under mpirun with --record-expert-load: after a request, the window's file holds the
// gathered counts and /metrics the imbalance, overall and per MoE layer.
TEST(ExpertLoadRecording, ServeWritesWindowsAndReportsTheImbalance) {
  const std::string model = std::string(SY_SOURCE_DIR) + "/models/default";
  const std::string dir = testing::TempDirectory("eplb_serve");
  // The server on any free port; its "serving … on http://127.0.0.1:PORT" line gives the port.
  testing::WriteFile(
      dir + "/run.sh",
      Mpirun(2) + testing::kBinary + " --threads 1 serve --model " + model +
          " --port 0 --served-model-name default" + " --record-expert-load " + dir +
          "/load.json --expert-load-window 2 > " + dir +
          "/serve.out 2>&1 &\n"
          "server=$!\n"
          "for i in $(seq 600); do grep -q 'serving' " +
          dir + "/serve.out && break; sleep 0.1; done\n" +
          "port=$(sed -n 's|.*http://127.0.0.1:\\([0-9]*\\).*|\\1|p' " + dir +
          "/serve.out | head -1)\n"
          "python3 - \"$port\" > " +
          dir +
          "/metrics.txt <<'PY'\n"
          "import json, sys, urllib.request\n"
          "base = 'http://127.0.0.1:' + sys.argv[1]\n"
          "body = json.dumps({'model': 'default', 'prompt': 'for (int i = 0;', 'max_tokens': 8})\n"
          "req = urllib.request.Request(base + '/v1/completions', body.encode(),\n"
          "                             {'Content-Type': 'application/json'})\n"
          "urllib.request.urlopen(req, timeout=60).read()\n"
          "print(urllib.request.urlopen(base + '/metrics', timeout=60).read().decode())\n"
          "PY\n"
          "kill -TERM $server; wait $server\n");
  std::string output;
  RunCommand("bash " + dir + "/run.sh", &output);
  const std::string metrics = testing::ReadFile(dir + "/metrics.txt");
  ASSERT_NE(metrics.find("switchyard:expert_imbalance{"), std::string::npos)
      << output << testing::ReadFile(dir + "/serve.out") << metrics;
  EXPECT_NE(metrics.find("switchyard:expert_imbalance_layer{"), std::string::npos) << metrics;
  const nlohmann::json load = ReadJson(dir + "/load.json");
  EXPECT_EQ(load["ranks"], 2);
  EXPECT_EQ(load["window"]["steps"], 2);
  EXPECT_TRUE(load["expert_imbalance"].is_number());
  int64_t total = 0;
  for (const auto& c : load["layers"][0]["counts"])
    total += c.get<int64_t>();
  EXPECT_EQ(total, load["window"]["tokens"].get<int64_t>() * load["top_k"].get<int64_t>());
}

}  // namespace
}  // namespace sy
