// Wall time per stage of a forward step, for `switchyard bench layer`. A profile is installed
// for the calling thread; stages called while none is installed cost one branch.
#pragma once

#include <array>

#include "base/clock.h"

namespace sy {

enum class Stage { kAttention, kGemm, kGroupedGemm, kRouter, kDispatch, kCombine, kOther, kCount };

struct StageTimes {
  std::array<double, static_cast<size_t>(Stage::kCount)> seconds{};
  double& operator[](Stage s) { return seconds[static_cast<size_t>(s)]; }
  double operator[](Stage s) const { return seconds[static_cast<size_t>(s)]; }
};

inline StageTimes*& CurrentStageTimes() {
  thread_local StageTimes* current = nullptr;
  return current;
}

// Adds the time until it goes out of scope to `stage`, unless nested in another stage scope.
class ScopedStage {
 public:
  explicit ScopedStage(Stage stage) : stage_(stage) {
    if (CurrentStageTimes() != nullptr && Depth()++ == 0) start_ = NowSeconds();
  }
  ~ScopedStage() {
    if (CurrentStageTimes() != nullptr && --Depth() == 0)
      (*CurrentStageTimes())[stage_] += NowSeconds() - start_;
  }
  ScopedStage(const ScopedStage&) = delete;
  ScopedStage& operator=(const ScopedStage&) = delete;

 private:
  static int& Depth() {
    thread_local int depth = 0;
    return depth;
  }
  Stage stage_;
  double start_ = 0;
};

}  // namespace sy
