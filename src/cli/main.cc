// switchyard: one binary, a few verbs (docs/architecture.md).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <thread>

#include "base/allocator.h"
#include "base/thread_pool.h"
#include "cli/verbs.h"

int main(int argc, char** argv) {
  sy::KeepFreedMemoryInHeap();
  CLI::App app{
      "switchyard: a wide-expert-parallel inference engine for DeepSeek-V3-class MoE models"};
  app.require_subcommand(1);
  int threads = 0;
  // The pool's workers spin briefly between tasks: more workers than cores only makes them
  // wait on each other, so more than the machine has is refused rather than left to crawl.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--threads", threads,
                 fmt::format("Worker threads (0: one per core; at most {}, the cores here)", cores))
      ->check(CLI::Range(0, cores));
  app.parse_complete_callback([&] { sy::ThreadPool::ConfigureGlobal(threads); });
  sy::AddLogitsVerb(app);
  sy::AddGenerateVerb(app);
  sy::AddInitModelVerb(app);
  sy::AddPlanVerb(app);
  sy::AddBenchVerb(app);
  sy::AddTokenizeVerb(app);
  sy::AddServeVerb(app);
  sy::AddRouteVerb(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
