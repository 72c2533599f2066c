// switchyard: one binary, a few verbs (docs/architecture.md).
#include <CLI/CLI.hpp>

#include "base/allocator.h"
#include "base/thread_pool.h"
#include "cli/verbs.h"

int main(int argc, char** argv) {
  sy::KeepFreedMemoryInHeap();
  CLI::App app{
      "switchyard: a wide-expert-parallel inference engine for DeepSeek-V3-class MoE models"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "Worker threads (0: one per core)")
      ->check(CLI::NonNegativeNumber);
  app.parse_complete_callback([&] { sy::ThreadPool::ConfigureGlobal(threads); });
  sy::AddLogitsVerb(app);
  sy::AddGenerateVerb(app);
  sy::AddInitModelVerb(app);
  sy::AddPlanVerb(app);
  sy::AddBenchVerb(app);
  sy::AddTokenizeVerb(app);
  sy::AddServeVerb(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
