#include "bench/mtp_bench.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "parallel/batch_decode.h"

namespace sy::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<std::vector<std::vector<int32_t>>> LoadPrompts(const std::string& path,
                                                      const TextCodec& codec) {
  std::ifstream in(path);
  if (!in) return Status::Errorf("{}: cannot open the prompts file", path);
  std::vector<std::vector<int32_t>> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto parsed = nlohmann::json::parse(line, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("text") ||
        !parsed["text"].is_string())
      return Status::Errorf("{}:{}: expected a JSON object with a \"text\" string", path, number);
    auto ids = codec.EncodePrompt(parsed["text"].get<std::string>());
    if (!ids.ok()) return Status::Errorf("{}:{}: {}", path, number, ids.status().message());
    prompts.push_back(std::move(ids).value());
  }
  if (prompts.empty()) return Status::Errorf("{}: no prompts", path);
  return prompts;
}

Result<MtpBenchReport> BenchMtp(const ParallelRun& run, const TextCodec& codec,
                                const MtpBenchOptions& options) {
  SY_ASSIGN_OR_RETURN(auto pool, LoadPrompts(options.prompts, codec));
  const ModelConfig& config = run.model->config();
  for (const auto& p : pool)
    if (static_cast<int64_t>(p.size()) + options.max_tokens > config.max_position_embeddings)
      return Status::Errorf("a prompt of {} tokens + {} to generate exceeds the context of {}",
                            p.size(), options.max_tokens, config.max_position_embeddings);
  if (options.drafter == Drafter::kMtp && !run.model->has_mtp())
    return Status::Error("the checkpoint has no MTP module (--speculative ngram needs none)");
  Communicator& comm = *run.comm;
  MtpBenchReport report;
  report.prompts = static_cast<int64_t>(pool.size());
  int64_t total = 0;
  for (const auto& p : pool)
    total += static_cast<int64_t>(p.size());
  report.mean_prompt_tokens = total / report.prompts;
  report.max_tokens = options.max_tokens;
  report.repeats = options.repeats;
  report.drafter = options.drafter;
  report.ngram = options.ngram;
  std::vector<int64_t> ks = {0};
  ks.insert(ks.end(), options.draft_counts.begin(), options.draft_counts.end());
  for (int64_t batch : options.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < batch; ++i)
      prompts.push_back(pool[static_cast<size_t>(i) % pool.size()]);
    std::vector<std::vector<int32_t>> plain_tokens;
    double plain_median = 0;
    // Repeats interleave the K values so drift on a shared machine spreads over all of them.
    std::vector<std::vector<double>> rates(ks.size());
    std::vector<BatchDecodeResult> last(ks.size());
    for (int r = 0; r < options.repeats; ++r) {
      for (size_t i = 0; i < ks.size(); ++i) {
        BatchDecodeOptions decode;
        decode.max_tokens = options.max_tokens;
        decode.ignore_eos = true;  // every run generates the same number of tokens
        decode.speculative_tokens = ks[i];
        decode.drafter = options.drafter;
        decode.ngram = options.ngram;
        decode.kv_dtype = options.kv_dtype;
        BatchDecodeResult result = BatchDecode(run, prompts, decode);
        const int64_t decoded = comm.AllReduceSum(result.decoded_tokens);
        // The slowest rank's decode time (whole microseconds: the collectives carry integers).
        const double seconds =
            comm.AllReduceMax(static_cast<int64_t>(result.decode_seconds * 1e6)) * 1e-6;
        rates[i].push_back(decoded / std::max(seconds, 1e-9));
        last[i] = std::move(result);
      }
    }
    for (size_t i = 0; i < ks.size(); ++i) {
      MtpBenchRow row;
      row.batch = batch;
      row.draft_tokens = ks[i];
      row.median_tokens_per_second = Median(rates[i]);
      row.min_tokens_per_second = *std::min_element(rates[i].begin(), rates[i].end());
      row.max_tokens_per_second = *std::max_element(rates[i].begin(), rates[i].end());
      const BatchDecodeResult& result = last[i];
      const int64_t steps = comm.AllReduceSum(result.sequence_steps);
      const int64_t decoded = comm.AllReduceSum(result.decoded_tokens);
      const int64_t drafts = comm.AllReduceSum(result.draft_tokens);
      const int64_t kept = comm.AllReduceSum(result.accepted_tokens);
      row.tokens_per_step = steps > 0 ? double(decoded) / steps : 0;
      row.acceptance = drafts > 0 ? double(kept) / drafts : 0;
      row.drafts_per_step = steps > 0 ? double(drafts) / steps : 0;
      for (int64_t j = 0; j < ks[i]; ++j) {
        const int64_t at = comm.AllReduceSum(result.accepted_per_position[static_cast<size_t>(j)]);
        const int64_t of = comm.AllReduceSum(result.drafted_per_position[static_cast<size_t>(j)]);
        row.acceptance_per_position.push_back(of > 0 ? double(at) / of : 0);
      }
      auto gathered = GatherSequencesToRoot(run, result.generated);
      if (i == 0) {
        plain_tokens = gathered;
        plain_median = row.median_tokens_per_second;
      }
      row.same_tokens = gathered == plain_tokens;
      row.speedup = row.median_tokens_per_second / std::max(plain_median, 1e-9);
      report.rows.push_back(row);
    }
  }
  return report;
}

namespace {

std::string DrafterName(const MtpBenchReport& report) {
  return report.drafter == Drafter::kMtp
             ? "MTP"
             : fmt::format("n-gram (prompt lookup {}..{}, drafts {})", report.ngram.min_n,
                           report.ngram.max_n, report.ngram.drafts_by_match ? "by match" : "fixed");
}

}  // namespace

std::string MtpReportTable(const MtpBenchReport& report) {
  std::string out = fmt::format(
      "{} speculative decoding, greedy: {} prompts (mean {} tokens), {} tokens each, "
      "median of {} runs; speed-up against plain decoding (K = 0) of the same batch, same run\n",
      DrafterName(report), report.prompts, report.mean_prompt_tokens, report.max_tokens,
      report.repeats);
  out += fmt::format("{:>5} {:>2} {:>12} {:>21} {:>8} {:>11} {:>10} {:>11} {:>6}  {}\n", "batch",
                     "K", "decode tok/s", "(min .. max)", "speed-up", "drafts/step", "acceptance",
                     "tokens/step", "same", "acceptance by position");
  for (const auto& r : report.rows) {
    std::string positions;
    for (double a : r.acceptance_per_position)
      positions += fmt::format("{}{:.3f}", positions.empty() ? "" : " ", a);
    out += fmt::format(
        "{:>5} {:>2} {:>12.1f} {:>21} {:>7.2f}x {:>11.2f} {:>10} {:>11.2f} {:>6}  {}\n", r.batch,
        r.draft_tokens, r.median_tokens_per_second,
        fmt::format("({:.1f} .. {:.1f})", r.min_tokens_per_second, r.max_tokens_per_second),
        r.speedup, r.drafts_per_step,
        r.draft_tokens > 0 ? fmt::format("{:.3f}", r.acceptance) : "-", r.tokens_per_step,
        r.same_tokens ? "yes" : "NO", positions);
  }
  return out;
}

std::string MtpReportJson(const MtpBenchReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.rows)
    rows.push_back({{"batch", r.batch},
                    {"num_speculative_tokens", r.draft_tokens},
                    {"decode_tokens_per_second", r.median_tokens_per_second},
                    {"min_tokens_per_second", r.min_tokens_per_second},
                    {"max_tokens_per_second", r.max_tokens_per_second},
                    {"speedup", r.speedup},
                    {"acceptance_rate", r.acceptance},
                    {"acceptance_per_position", r.acceptance_per_position},
                    {"tokens_per_step", r.tokens_per_step},
                    {"drafts_per_step", r.drafts_per_step},
                    {"same_tokens", r.same_tokens}});
  return nlohmann::json(
             {{"drafter", report.drafter == Drafter::kMtp ? "mtp" : "ngram"},
              {"prompt_lookup_min", report.ngram.min_n},
              {"prompt_lookup_max", report.ngram.max_n},
              {"prompt_lookup_drafts", report.ngram.drafts_by_match ? "by-match" : "fixed"},
              {"prompts", report.prompts},
              {"mean_prompt_tokens", report.mean_prompt_tokens},
              {"max_tokens", report.max_tokens},
              {"repeats", report.repeats},
              {"rows", rows}})
      .dump();
}

}  // namespace sy::bench
