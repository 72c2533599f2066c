#include "route/queue_estimate.h"

namespace sy::route {

void QueueEstimate::Routed(const std::string& id, int64_t tokens) {
  Request& r = requests_[id];
  ours_ -= Weight(r);
  r = Request{};
  r.estimate = tokens;
  ours_ += Weight(r);
}

void QueueEstimate::Ended(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.ended) return;
  ours_ -= Weight(it->second);
  it->second.ended = true;
  // An answer to a probe asked from now on may still list it (the engine publishes its queue
  // after the step that sent the last token); the first that does not lets it go.
  it->second.ended_after = asked_;
}

void QueueEstimate::Answered(uint64_t probe, int64_t queued_tokens,
                             const std::vector<std::pair<std::string, int64_t>>& requests) {
  std::unordered_map<std::string, int64_t> listed;  // one id may be several sequences (beams)
  for (const auto& [id, tokens] : requests)
    listed[id] += tokens;
  int64_t mine = 0;
  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& r = it->second;
    ours_ -= Weight(r);
    auto found = listed.find(it->first);
    if (found != listed.end()) {
      r.reported = found->second;
      r.listed_once = true;
      mine += found->second;
    } else {
      r.reported = -1;
      if (r.ended && probe > r.ended_after) {
        it = requests_.erase(it);
        continue;
      }
    }
    ours_ += Weight(r);
    ++it;
  }
  others_ = queued_tokens - mine;
}

void QueueEstimate::Clear() {
  requests_.clear();
  others_ = 0;
  ours_ = 0;
}

}  // namespace sy::route
