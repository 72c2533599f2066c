#include "bench/beam_bench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/mtp_bench.h"
#include "engine/beam_search.h"
#include "engine/engine.h"

namespace sy::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waits for every stream to finish; false when one ended other than by length.
bool WaitAll(const std::vector<std::shared_ptr<RequestStream>>& streams, std::string* why) {
  std::mutex mutex;
  std::condition_variable wake;
  uint64_t pokes = 0, seen = 0;
  for (const auto& s : streams)
    s->SetNotifier([&] {
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++pokes;
      }
      wake.notify_all();
    });
  std::vector<bool> done(streams.size(), false);
  bool ok = true;
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (done[i]) continue;
      std::vector<RequestEvent> events;
      done[i] = streams[i]->Drain(&events);
      for (const RequestEvent& e : events)
        if (e.finish_reason && *e.finish_reason != "length") {
          ok = false;
          *why = fmt::format("{} {}", *e.finish_reason, e.error);
        }
      all = all && done[i];
    }
    if (all) break;
    std::unique_lock<std::mutex> lock(mutex);
    wake.wait(lock, [&] { return pokes != seen; });
    seen = pokes;
  }
  for (const auto& s : streams)
    s->SetNotifier(nullptr);
  return ok;
}

}  // namespace

Result<BeamBenchReport> BenchBeamSearch(const ParallelRun& run, const TextCodec& codec,
                                        const BeamBenchOptions& options) {
  if (run.comm->size() > 1) return Status::Error("bench beam-search runs in one process");
  SY_ASSIGN_OR_RETURN(auto pool, LoadPrompts(options.prompts, codec));
  const Model& model = *run.model;
  BeamBenchReport report;
  report.searches = options.searches;
  report.max_tokens = options.max_tokens;
  report.repeats = options.repeats;
  int64_t total = 0, longest = 0;
  for (int64_t i = 0; i < options.searches; ++i) {
    const auto& p = pool[static_cast<size_t>(i) % pool.size()];
    total += static_cast<int64_t>(p.size()) + 1;
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()) + 1);
  }
  report.mean_prompt_tokens = total / options.searches;
  const int64_t widest = *std::max_element(options.widths.begin(), options.widths.end());
  if (longest + options.max_tokens > model.config().max_position_embeddings)
    return Status::Errorf("a prompt of {} tokens + {} to generate exceeds the context of {}",
                          longest, options.max_tokens, model.config().max_position_embeddings);
  // Room for every sequence of the widest case twice over (a step's requests beside the pages
  // the cache keeps).
  const int64_t cache_tokens = 2 * options.searches * widest * (longest + options.max_tokens + 16);
  LatentCache cache = model.NewCache(cache_tokens, 1, options.kv_dtype);
  report.page_size = cache.page_size();
  EngineConfig config;
  config.max_num_seqs = std::max<int64_t>(256, options.searches * widest);
  config.keep_partial_pages = options.keep_partial_pages;
  config.wait_for_shared_pages = options.wait_for_shared_pages;
  report.keep_partial_pages = options.keep_partial_pages;
  report.wait_for_shared_pages = options.wait_for_shared_pages;
  Engine engine(model, cache, *codec.tokenizer, run.Options(), config);
  BeamSearchFrontend beams(engine, *codec.tokenizer, engine.limits());
  engine.Start();

  // Each run's prompts start with a token of their own after BOS, so no run finds another's
  // pages in the prefix cache.
  int32_t salt = 100;
  auto prompts = [&] {
    std::vector<std::vector<int32_t>> out;
    for (int64_t i = 0; i < options.searches; ++i) {
      std::vector<int32_t> p = pool[static_cast<size_t>(i) % pool.size()];
      p.insert(p.begin() + (p.empty() ? 0 : 1), salt);
      out.push_back(std::move(p));
    }
    ++salt;
    return out;
  };
  int64_t id = 0;
  for (int64_t width : options.widths) {
    std::vector<double> beam_rates, sample_rates;
    int64_t computed = 0, looked_up = 0, hits = 0, steps = 0;
    for (int r = 0; r < options.repeats; ++r) {
      for (bool search : {true, false}) {
        std::vector<EngineRequest> requests;
        for (const auto& p : prompts())
          for (int64_t k = 0; k < width; ++k) {
            EngineRequest request{fmt::format("bench-{}", id++), p, {}};
            request.params.max_tokens = options.max_tokens;
            request.params.ignore_eos = true;
            if (search) {
              request.params.beam_width = width;
            } else {
              request.params.seed = static_cast<uint64_t>(id);
            }
            requests.push_back(std::move(request));
          }
        const EngineMetrics before = engine.Metrics();
        const auto start = std::chrono::steady_clock::now();
        SubmitError why = SubmitError::kNone;
        auto streams = beams.SubmitAll(std::move(requests), &why);
        if (!streams.ok()) return streams.status();
        std::string failure;
        if (!WaitAll(*streams, &failure))
          return Status::Errorf("width {}: a {} ended: {}", width,
                                search ? "beam search" : "sample", failure);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double rate = static_cast<double>(options.searches * width * options.max_tokens) /
                            std::max(seconds, 1e-9);
        (search ? beam_rates : sample_rates).push_back(rate);
        if (!search) continue;
        const EngineMetrics after = engine.Metrics();
        const int64_t queried =
            after.prefix_cache_queries_total - before.prefix_cache_queries_total;
        const int64_t found = after.prefix_cache_hits_total - before.prefix_cache_hits_total;
        computed += after.prompt_tokens_total - before.prompt_tokens_total - found;
        looked_up += queried;
        hits += found;
        steps += after.steps_total - before.steps_total;
      }
    }
    BeamBenchRow row;
    row.width = width;
    row.beam_tokens_per_second = Median(beam_rates);
    row.sample_tokens_per_second = Median(sample_rates);
    row.ratio = row.beam_tokens_per_second / std::max(row.sample_tokens_per_second, 1e-9);
    const double outputs =
        static_cast<double>(options.repeats * options.searches * width * options.max_tokens);
    row.computed_per_output = static_cast<double>(computed) / outputs;
    row.cache_share = looked_up > 0 ? static_cast<double>(hits) / looked_up : 0;
    row.steps_per_token =
        static_cast<double>(steps) / static_cast<double>(options.repeats * options.max_tokens);
    report.rows.push_back(row);
  }
  beams.Stop(/*drain=*/false);
  return report;
}

std::string BeamReportTable(const BeamBenchReport& report) {
  std::string out = fmt::format(
      "Beam search against sampling n = W: {} prompts at once (mean {} tokens), {} tokens per "
      "sequence (ignore_eos), median of {} runs, page size {}, partial pages {}, shared pages {}\n",
      report.searches, report.mean_prompt_tokens, report.max_tokens, report.repeats,
      report.page_size, report.keep_partial_pages ? "kept" : "recomputed",
      report.wait_for_shared_pages ? "waited for" : "computed by each");
  out += fmt::format("{:>5} {:>15} {:>17} {:>8} {:>20} {:>12} {:>15}\n", "width", "beam out tok/s",
                     "sample out tok/s", "ratio", "computed per output", "cache share",
                     "steps per token");
  for (const auto& r : report.rows)
    out += fmt::format("{:>5} {:>15.1f} {:>17.1f} {:>7.2f}x {:>20.2f} {:>12.3f} {:>15.2f}\n",
                       r.width, r.beam_tokens_per_second, r.sample_tokens_per_second, r.ratio,
                       r.computed_per_output, r.cache_share, r.steps_per_token);
  return out;
}

std::string BeamReportJson(const BeamBenchReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : report.rows)
    rows.push_back({{"width", r.width},
                    {"beam_output_tokens_per_second", r.beam_tokens_per_second},
                    {"sample_output_tokens_per_second", r.sample_tokens_per_second},
                    {"ratio", r.ratio},
                    {"computed_prompt_tokens_per_output_token", r.computed_per_output},
                    {"prefix_cache_share", r.cache_share},
                    {"steps_per_token", r.steps_per_token}});
  return nlohmann::json({{"searches", report.searches},
                         {"mean_prompt_tokens", report.mean_prompt_tokens},
                         {"max_tokens", report.max_tokens},
                         {"repeats", report.repeats},
                         {"page_size", report.page_size},
                         {"keep_partial_pages", report.keep_partial_pages},
                         {"wait_for_shared_pages", report.wait_for_shared_pages},
                         {"rows", rows}})
      .dump();
}

}  // namespace sy::bench
