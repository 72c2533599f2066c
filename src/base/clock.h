#pragma once

#include <chrono>

namespace sy {

// Seconds on a monotonic clock, for measuring intervals.
inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace sy
