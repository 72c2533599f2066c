// One line per model-loading stage on stderr ("switchyard: loading M: GGUF dequantized, 70
// tensors, 53.1 MB (0.41 s)"), so a load of hundreds of GB shows where its minutes go. Printed
// where stderr is a terminal, or anywhere with SWITCHYARD_LOAD_PROGRESS=1 (logs of a service):
// many scripts and tests read a verb's stderr merged with its output, so a non-terminal stays
// quiet unless asked.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace sy {

class LoadProgress {
 public:
  explicit LoadProgress(std::string model);
  // Reports a finished stage with the time since the previous one.
  void Stage(std::string_view what);
  // The last line: the whole load's time.
  void Done();
  bool enabled() const { return enabled_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string model_;
  bool enabled_ = false;
  Clock::time_point start_, last_;
};

}  // namespace sy
