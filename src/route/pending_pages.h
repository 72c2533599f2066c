// Pages a router has sent to an instance that its mirror of the instance's prefix cache does
// not hold yet: a burst of requests sharing a prefix follows the first request to its instance
// instead of racing its prefill elsewhere. A page is held while any request routed there with it
// is in flight, then for a grace period in which its stored event is still on the way. (A fixed
// 5 s from routing forgot a long prompt's pages while a CPU was still computing them, and the
// next request on the document went elsewhere to compute it again.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace sy::route {

class PendingPages {
 public:
  static constexpr double kGraceSeconds = 5;

  // A request routed with these page hashes.
  void Hold(const std::vector<uint64_t>& hashes, double now) {
    if (pages_.size() > kMaxPages)  // drop the released and expired
      for (auto it = pages_.begin(); it != pages_.end();)
        it = it->second.flights == 0 && it->second.until < now ? pages_.erase(it) : std::next(it);
    for (uint64_t h : hashes)
      ++pages_[h].flights;
  }
  // That request's stream ended. Pages forgotten since (Clear) stay forgotten.
  void Release(const std::vector<uint64_t>& hashes, double now) {
    for (uint64_t h : hashes) {
      auto it = pages_.find(h);
      if (it == pages_.end() || it->second.flights == 0) continue;
      --it->second.flights;
      it->second.until = std::max(it->second.until, now + kGraceSeconds);
    }
  }
  bool Holds(uint64_t hash, double now) const {
    auto it = pages_.find(hash);
    return it != pages_.end() && (it->second.flights > 0 || it->second.until >= now);
  }
  void Clear() { pages_.clear(); }  // the instance failed
  size_t size() const { return pages_.size(); }

 private:
  static constexpr size_t kMaxPages = 65536;
  struct Page {
    int64_t flights = 0;  // requests in flight with this page
    double until = 0;     // held until then after the last of them ended
  };
  std::unordered_map<uint64_t, Page> pages_;
};

}  // namespace sy::route
