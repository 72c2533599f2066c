#include "model/load_progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace sy {

LoadProgress::LoadProgress(std::string model) : model_(std::move(model)) {
  const char* flag = std::getenv("SWITCHYARD_LOAD_PROGRESS");
  enabled_ = flag != nullptr ? std::strcmp(flag, "0") != 0 : ::isatty(STDERR_FILENO) == 1;
  start_ = last_ = Clock::now();
}

void LoadProgress::Stage(std::string_view what) {
  const auto now = Clock::now();
  if (enabled_)
    fmt::print(stderr, "switchyard: loading {}: {} ({:.2f} s)\n", model_, what,
               std::chrono::duration<double>(now - last_).count());
  last_ = now;
}

void LoadProgress::Done() {
  if (enabled_)
    fmt::print(stderr, "switchyard: loaded {} in {:.2f} s\n", model_,
               std::chrono::duration<double>(Clock::now() - start_).count());
}

}  // namespace sy
