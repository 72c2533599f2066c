// Serving under mpirun: every DP group is an engine instance with its own scheduler and cache;
// rank 0 serves HTTP and spreads requests over the groups (least outstanding tokens); all ranks
// step together, as expert parallelism needs (a group with nothing to do steps an empty batch).
//
// Each iteration of the lockstep loop, on every rank:
//   1. rank 0 broadcasts what arrived — new requests with their group, aborts, stop;
//   2. the ranks of the named group queue the request in their engine (all TP ranks of a group
//      make the same scheduling decisions from the same inputs, seeds included);
//   3. if any rank has work, every rank runs one engine step;
//   4. each group's first rank sends the step's events (tokens, text, finishes) and its metrics
//      to rank 0, which hands them to the waiting HTTP streams.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "engine/engine.h"
#include "parallel/communicator.h"

namespace sy::serve {

class ClusterServing : public RequestFrontend {
 public:
  // `engine`: this rank's; DP groups of `tp` consecutive ranks; `max_waiting`: requests queued
  // over all groups before new ones are refused.
  ClusterServing(Engine& engine, Communicator& world, int tp, int64_t max_waiting);

  // Rank 0's side, called by the HTTP server's threads.
  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request, SubmitError* error) override;
  void Abort(const std::string& id) override;
  EngineMetrics Metrics() const override;
  void Stop(bool drain) override;

  // The lockstep loop, on every rank; returns on every rank once a stop has been broadcast and
  // no rank has work left.
  void Run();

 private:
  struct Pending {
    EngineRequest request;
    int group = 0;
  };
  std::vector<uint8_t> TakeControl(bool any_work);
  void DeliverEvents(const std::vector<uint8_t>& gathered);

  Engine& engine_;
  Communicator& world_;
  int tp_ = 1, groups_ = 1, group_ = 0;
  int64_t max_waiting_ = 4096;
  bool leader_ = false;  // first rank of its group: reports the group's events

  // Rank 0: requests accepted and not yet broadcast, streams awaiting events.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<std::string> aborts_;
  bool stop_ = false, drain_ = true, stopped_ = false;
  std::condition_variable stopped_cv_;
  struct Tracked {
    std::shared_ptr<RequestStream> stream;
    int group = 0;
    int64_t outstanding = 0;  // prompt + max_tokens, for least-loaded placement
  };
  std::map<std::string, Tracked> tracked_;
  std::vector<int64_t> group_load_;
  std::vector<EngineMetrics> group_metrics_;

  // Every rank: the streams of requests this rank's engine runs.
  std::map<std::string, std::shared_ptr<RequestStream>> local_;
};

}  // namespace sy::serve
