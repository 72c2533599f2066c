// Serving under mpirun: every DP group is an engine instance with its own scheduler and cache;
// rank 0 serves HTTP and spreads requests over the groups (least outstanding tokens); all ranks
// step together, as expert parallelism needs (a group with nothing to do steps an empty batch).
//
// Each iteration of the lockstep loop, on every rank:
//   1. rank 0 broadcasts what arrived — new requests with their group, transfers for a group
//      to wait for or drop, aborts, stop (a JSON document);
//   2. the ranks of the named group queue the request in their engine (all TP ranks of a group
//      make the same scheduling decisions from the same inputs, seeds included);
//   3. if any rank has work, every rank runs one engine step;
//   4. each group's first rank sends the step's events (tokens, text, finishes), its metrics and
//      the transfers that arrived to rank 0, which hands the events to the waiting streams.
//
// Disaggregation (serve --role prefill|decode under mpirun): each DP group moves its own
// requests' rows on its first rank, so rows never pass through rank 0 nor reach another group.
// Decode: the first rank listens (its own UCX listener, the address its gRPC Health reports).
// Step 1 announces a request to its group; the first rank waits for the rows beside the steps
// and reports their arrival in step 4; the next step 1 admits the request, and the first rank
// sends the rows to the group's other TP ranks, point to point. Prefill: the first rank sends
// the rows as its engine computes them (its TP ranks drop their copies); its step 4 reports a
// request handed on once the last rows have left.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "parallel/communicator.h"
#include "transfer/kv_transfer.h"

namespace sy::serve {

class ClusterServing : public RequestFrontend {
 public:
  // `engine`: this rank's; DP groups of `tp` consecutive ranks; `max_waiting`: requests queued
  // over all groups before new ones are refused.
  ClusterServing(Engine& engine, Communicator& world, int tp, int64_t max_waiting);

  // Rank 0's side, called by the HTTP server's threads.
  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request, SubmitError* error) override;
  Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAll(std::vector<EngineRequest> requests,
                                                                SubmitError* error) override;
  void Abort(const std::string& id) override;
  EngineMetrics Metrics() const override;
  void Stop(bool drain) override;

  // One DP group as a frontend of its own (the gRPC instance API serves each on its port).
  int groups() const { return groups_; }
  Result<std::shared_ptr<RequestStream>> SubmitTo(int group, EngineRequest request,
                                                  SubmitError* error);
  // All or none (RequestFrontend::SubmitAll); group -1: each where the load is least.
  Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAllTo(
      int group, std::vector<EngineRequest> requests, SubmitError* error);
  EngineMetrics GroupMetrics(int group) const;
  // Rank 0's copy of the group's prefix-cache events, fed by the lockstep gather.
  const CacheEventLog* GroupCacheEvents(int group) const {
    return group_cache_[static_cast<size_t>(group)].get();
  }

  // A decode job: every rank calls this before Run, collectively; `own` is this rank's receiver
  // where it is its group's first rank (null elsewhere), the rows' shape is the cache's, and a
  // transfer may take `timeout_seconds`.
  void ReceiveOnGroupLeaders(transfer::Receiver* own, int64_t layers, int64_t row_bytes,
                             double timeout_seconds);
  // A request whose rows (and first token) group `group` receives under `token` before it is
  // admitted. Its stream ends with kTransferFailedReason if the transfer fails.
  Result<std::shared_ptr<RequestStream>> SubmitReceivingTo(int group, EngineRequest request,
                                                           uint64_t token, SubmitError* error);
  // A prefill job: the same for sending (`own`: this rank's sender on a group's first rank).
  void SendFromGroupLeaders(transfer::Sender* own, double timeout_seconds);
  // A request whose rows group `group` sends to the receiver at `send_to` under `token`. Its
  // stream ends "transferred" once they have all left, or with kTransferFailedReason.
  Result<std::shared_ptr<RequestStream>> SubmitSendingTo(int group, EngineRequest request,
                                                         const std::string& send_to, uint64_t token,
                                                         SubmitError* error);
  // Rank 0: what the groups' senders or receivers have moved, summed (for /metrics).
  transfer::TransferStats Transfers() const;

  // The lockstep loop, on every rank; returns on every rank once a stop has been broadcast and
  // no rank has work left.
  void Run();

 private:
  struct Pending {
    EngineRequest request;
    int group = 0;
    bool rows_at_leader = false;  // received by the group's first rank under `token`
    std::string send_to;          // where the group's first rank sends its rows under `token`
    uint64_t token = 0;
  };
  // Rank 0: a request waiting for its group's first rank to receive its rows.
  struct Receiving {
    EngineRequest request;
    int group = 0;
    uint64_t token = 0;
    bool announced = false;  // broadcast to the group
  };
  // A group's first rank: one attempt's transfer (by its token: a redone attempt has another),
  // waited for on a thread of its own.
  struct Arrival {
    std::string id;
    uint64_t sequence = 0;  // the order the waits began in
    std::thread waiter;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    bool done = false, reported = false;
    Result<transfer::Received> received = Status::Error("not yet received");
  };
  std::vector<uint8_t> TakeControl(bool any_work);
  void DeliverEvents(const std::vector<uint8_t>& gathered);
  // A group's first rank: starts waiting for a request's rows; what finished waiting, for the
  // step's report; the rows of an admitted request (sent on to the group's other TP ranks).
  void StartReceiving(const std::string& id, uint64_t token);
  struct ArrivalReport {
    std::string id;
    uint64_t token = 0;
    bool ok = false;
    int32_t first_token = 0;
    std::string error;
  };
  std::vector<ArrivalReport> FinishedArrivals();
  std::shared_ptr<ImportedRows> TakeArrival(uint64_t token);
  // Every rank of the group, for a request admitted with its rows at the first rank: those
  // rows, sent to the others (null if it has none: the request is then computed again).
  std::shared_ptr<ImportedRows> RowsFromLeader(uint64_t token);
  void DropArrival(uint64_t token);
  void StopReceiving();
  // Rank 0, under mutex_: refuses `count` more requests when stopping or when the queue is full.
  Status CheckRoomLocked(int64_t count, SubmitError* error) const;
  // Rank 0, under mutex_: ends a request that never reached its engine.
  void EndUnadmitted(const std::string& id, RequestEvent event);
  Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAllTo(
      int group, std::vector<EngineRequest> requests, SubmitError* error,
      const std::string& send_to, uint64_t token);
  // A group's first rank, at a request's finish: a prefilled request's "transferred" stands once
  // its rows have all left; else it becomes kTransferFailedReason.
  void FinishTransfer(const std::string& id, RequestEvent* finish);

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
  std::vector<std::unique_ptr<CacheEventLog>> group_cache_;
  uint64_t cache_reported_ = 0;  // leader: the last cache event sent to rank 0

  // Every rank: the streams of requests this rank's engine runs.
  std::map<std::string, std::shared_ptr<RequestStream>> local_;

  // Disaggregated jobs. Rank 0: requests whose rows are on their way in, and what each group's
  // sender or receiver has moved.
  bool receives_ = false, sends_ = false;
  std::map<std::string, Receiving> receiving_;
  std::vector<transfer::TransferStats> group_transfers_;
  // A group's first rank in a prefill job: its sender, and its requests' transfers.
  transfer::Sender* sender_ = nullptr;
  std::map<std::string, std::shared_ptr<transfer::Outgoing>> outgoing_;
  // A group's first rank: its receiver, and the transfers it waits for or holds.
  transfer::Receiver* receiver_ = nullptr;
  std::unique_ptr<Communicator> rows_comm_;  // the group's first rank to its TP ranks
  int64_t layers_ = 0, row_bytes_ = 0;
  double transfer_timeout_ = 600;
  std::mutex arrivals_mutex_;
  std::condition_variable arrival_ended_;
  std::map<uint64_t, Arrival> arrivals_;
  uint64_t arrivals_started_ = 0;
  // Rank 0: transfers whose first rank must stop waiting or drop the rows (by token).
  std::vector<uint64_t> drops_;
};

}  // namespace sy::serve

namespace sy::serve {

// DP group g of a ClusterServing, as a RequestFrontend: what `serve --grpc-port P` serves on port
// P + g under mpirun, so a router places requests on a group of its choosing.
class GroupFrontend : public RequestFrontend {
 public:
  GroupFrontend(ClusterServing& cluster, int group) : cluster_(cluster), group_(group) {}
  Result<std::shared_ptr<RequestStream>> Submit(EngineRequest request,
                                                SubmitError* error) override {
    return cluster_.SubmitTo(group_, std::move(request), error);
  }
  Result<std::vector<std::shared_ptr<RequestStream>>> SubmitAll(std::vector<EngineRequest> requests,
                                                                SubmitError* error) override {
    return cluster_.SubmitAllTo(group_, std::move(requests), error);
  }
  void Abort(const std::string& id) override { cluster_.Abort(id); }
  EngineMetrics Metrics() const override { return cluster_.GroupMetrics(group_); }
  void Stop(bool) override {}  // the job stops as a whole (SIGTERM to rank 0)
  const CacheEventLog* cache_events() const override { return cluster_.GroupCacheEvents(group_); }

 private:
  ClusterServing& cluster_;
  int group_;
};

}  // namespace sy::serve
