// The prefix cache's changes as a numbered event stream: every full page the engine caches
// (stored) or drops (evicted), by its chain hash (PagePool::ChainHash). A router subscribes
// (gRPC CacheEvents) and mirrors each instance's cache exactly: a snapshot of the cached set at
// sequence number s, then the events s + 1, s + 2, … The step loop appends; readers copy under
// the lock and never touch the step loop's structures.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

namespace sy {

class CacheEventLog {
 public:
  struct Event {
    uint64_t hash = 0;
    bool stored = true;  // false: evicted
  };

  void Record(uint64_t hash, bool stored);
  // Makes the cached set `hashes`, recording the difference as events (a copy that lost track).
  void Replace(const std::vector<uint64_t>& hashes);

  // The cached set and the sequence number it reflects.
  std::pair<uint64_t, std::vector<uint64_t>> Snapshot() const;
  // Events after `after` (their first sequence number is after + 1), waiting up to `wait_ms`
  // for some to arrive. Empty when none came, or when the log no longer holds them (the caller
  // then takes a snapshot again: *lost is set).
  std::vector<Event> Since(uint64_t after, int wait_ms, bool* lost) const;
  uint64_t sequence() const;

 private:
  static constexpr size_t kKept = 1 << 16;  // events kept for readers that fall behind
  mutable std::mutex mutex_;
  mutable std::condition_variable arrived_;
  std::unordered_set<uint64_t> cached_;
  std::vector<Event> recent_;  // events first_kept_ … sequence_
  uint64_t first_kept_ = 1, sequence_ = 0;
};

}  // namespace sy
