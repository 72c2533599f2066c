#include "engine/cache_events.h"

#include <chrono>

namespace sy {

void CacheEventLog::Record(uint64_t hash, bool stored) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stored) {
      cached_.insert(hash);
    } else {
      cached_.erase(hash);
    }
    recent_.push_back({hash, stored});
    ++sequence_;
    if (recent_.size() > 2 * kKept) {  // drop the older half at once: amortized O(1)
      recent_.erase(recent_.begin(), recent_.begin() + static_cast<std::ptrdiff_t>(kKept));
      first_kept_ += kKept;
    }
  }
  arrived_.notify_all();
}

void CacheEventLog::Replace(const std::vector<uint64_t>& hashes) {
  const std::unordered_set<uint64_t> target(hashes.begin(), hashes.end());
  std::vector<uint64_t> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint64_t h : cached_)
      if (!target.count(h)) gone.push_back(h);
  }
  for (uint64_t h : gone)
    Record(h, false);
  for (uint64_t h : hashes)
    Record(h, true);
}

std::pair<uint64_t, std::vector<uint64_t>> CacheEventLog::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {sequence_, std::vector<uint64_t>(cached_.begin(), cached_.end())};
}

std::vector<CacheEventLog::Event> CacheEventLog::Since(uint64_t after, int wait_ms,
                                                       bool* lost) const {
  std::unique_lock<std::mutex> lock(mutex_);
  *lost = false;
  arrived_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return sequence_ > after; });
  if (sequence_ <= after) return {};
  if (after + 1 < first_kept_) {
    *lost = true;
    return {};
  }
  return std::vector<Event>(recent_.begin() + static_cast<std::ptrdiff_t>(after + 1 - first_kept_),
                            recent_.end());
}

uint64_t CacheEventLog::sequence() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sequence_;
}

}  // namespace sy
