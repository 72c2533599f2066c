// The work queued on one instance as the router sees it, in tokens (prompt tokens to compute,
// tokens to generate): what the instance's last Load answer said, corrected request by request
// for what the router has done since.
//
// The answer lists the requests it counts, by id, with their tokens. That makes the correction
// exact where counting by probe epochs could only guess: a request routed while a Load was on
// the wire was in its answer or not depending on which reached the instance first (counted
// twice when it was), and one whose stream had ended could still be in the instance's last
// snapshot. Either way a finished request weighed on its instance until the next probe, and
// cache-aware routing sent the next question on a document away from the instance holding it.
//
// The router's own requests count, each: the instance's figure while the last answer lists it;
// the router's estimate until an answer does (still on the wire, or between arrival and the
// engine's next step); nothing once an answer has listed it and a later one no longer does (the
// instance finished it), or once the router has seen its stream end. Everything else in the
// answer is other clients' work and counts as the instance said.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sy::route {

class QueueEstimate {
 public:
  // A request routed to the instance, with the tokens the router expects it to add. An id
  // routed again (a failover back to the same instance) starts over.
  void Routed(const std::string& id, int64_t tokens);
  // The router has seen the request's stream end (finished, failed or cancelled). Idempotent.
  void Ended(const std::string& id);
  // A Load probe goes out: its number, for Answered.
  uint64_t Asked() { return ++asked_; }
  // Probe `probe`'s answer: the instance's queued tokens, and the requests they count.
  void Answered(uint64_t probe, int64_t queued_tokens,
                const std::vector<std::pair<std::string, int64_t>>& requests);
  // The instance failed or restarted: nothing it said holds.
  void Clear();

  int64_t Queued() const { return std::max<int64_t>(0, others_) + ours_; }
  // Requests tracked (those live, and those ended that an answer may still list).
  size_t tracked() const { return requests_.size(); }

 private:
  struct Request {
    int64_t estimate = 0;
    int64_t reported = -1;  // in the last answer; -1: not listed there
    bool listed_once = false;
    bool ended = false;
    uint64_t ended_after = 0;  // probes asked when it ended
  };
  static int64_t Weight(const Request& r) {
    if (r.ended) return 0;
    if (r.reported >= 0) return r.reported;
    return r.listed_once ? 0 : r.estimate;
  }

  std::unordered_map<std::string, Request> requests_;
  int64_t others_ = 0;  // the last answer's tokens less the router's requests it listed
  int64_t ours_ = 0;    // sum of Weight over requests_
  uint64_t asked_ = 0;
};

}  // namespace sy::route
