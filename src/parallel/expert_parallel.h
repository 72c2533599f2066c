// Expert parallelism: routed experts spread over the ranks, tokens sent to their experts and
// back by an all-to-all dispatch and combine, with the Huawei recipe's double routing:
//   init routing (sort slots by expert, model/feed_forward.h) → exchange per-expert counts →
//   exchange rows → re-sort by local expert → grouped experts → undo the re-sort → exchange back
//   → finalize routing (undo the first sort, weighted sum + shared expert).
// Dispatch and combine each have a send half that starts the exchange and a receive half that
// completes it, so a schedule can compute in between (the shared expert, in dispatch overlap).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/expert_placement.h"
#include "model/feed_forward.h"
#include "model/moe_executor.h"
#include "parallel/communicator.h"

namespace sy {

class ExpertDispatcher {
 public:
  // physical_experts: N·S physical experts, S on each rank (rank r holds [r·S, (r+1)·S)); E
  // when there are no redundant experts. hidden: D; wire: kF32, kBF16, or kF8E4M3 (dispatch rows
  // in e4m3 with an f32 scale per 128 values, combine in bf16).
  ExpertDispatcher(Communicator& comm, int64_t physical_experts, int64_t hidden, DType wire);

  int64_t local_experts() const { return local_; }
  int64_t hidden() const { return hidden_; }
  int64_t first_expert() const { return static_cast<int64_t>(comm_.rank()) * local_; }
  // Bytes this rank has sent to other ranks (dispatch and combine), since construction.
  int64_t remote_bytes_sent() const { return remote_bytes_sent_; }

  // routing: this rank's slots sorted by physical expert (expert_offsets [N·S + 1]); x: [tokens,
  // D]. Starts the exchange.
  void DispatchSend(const ExpertRouting& routing, const float* x);
  // Completes it. Returns the received rows [R, D] sorted by local expert, with
  // local_offsets [local_experts + 1] (rows of local expert i are [offsets[i], offsets[i+1])).
  const std::vector<float>& DispatchRecv(std::vector<int64_t>* local_offsets);
  // expert_rows: [R, D] outputs in DispatchRecv's order. Starts sending them home.
  void CombineSend(const float* expert_rows);
  // Completes it: out [slots, D] holds each slot's expert output in the routing's sorted order.
  void CombineRecv(float* out);

 private:
  void Pack(DType format, const float* rows, int64_t count, uint8_t* wire) const;
  void Unpack(DType format, const uint8_t* wire, int64_t count, float* rows) const;

  Communicator& comm_;
  int64_t experts_, local_, hidden_;
  DType wire_, combine_wire_;
  size_t row_bytes_, combine_row_bytes_;
  std::vector<int64_t> send_bytes_, send_offsets_, recv_bytes_, recv_offsets_;
  std::vector<uint8_t> send_buffer_, recv_buffer_;  // dispatch
  std::vector<uint8_t> combine_out_, combine_in_;
  std::vector<int64_t> combine_out_bytes_, combine_out_offsets_, combine_in_bytes_,
      combine_in_offsets_;
  std::vector<float> received_;         // [R, D] sorted by local expert
  std::vector<int64_t> resort_source_;  // sorted row j came from received row resort_source_[j]
  std::vector<int64_t> local_offsets_;
  int64_t slots_ = 0;
  int64_t remote_bytes_sent_ = 0;
  std::unique_ptr<Communicator::Exchange> pending_;
};

// none: dispatch, experts, combine, then the shared expert. dispatch: the shared expert runs
// between dispatch send and receive. microbatch: the step runs in the five-stage two-micro-batch
// schedule (model/decoder_schedule.h, ForwardOptions::micro_batches), which drives this
// executor through Begin/Middle/End; a whole-layer Run then behaves as dispatch overlap.
enum class OverlapMode { kNone, kDispatch, kMicrobatch };

// Which replica of a logical expert a routed slot goes to (with a placement that has them).
// own-rank: the replica on the token's rank where there is one (no bytes on the wire for it),
// else one spread by token. spread: always spread by token over every replica, so each replica
// gets an even share of its expert's load from every rank — the split EPLB's balance assumes
// (plan/eplb.h); own-rank loads a replica with its whole rank's share, which differs by rank
// when the ranks serve different requests. SGLang calls these "static" and "dynamic".
// balanced: per exchange, each slot whose expert has several replicas goes to the replica on
// the rank this rank has so far sent the fewest rows (counting its single-replica slots first):
// from the rank's own routing only, so no extra communication, and a step's busiest rank sits
// closer to the mean than an even share per replica puts it.
enum class ReplicaDispatch { kOwnRank, kSpread, kBalanced };

// Runs MoE layers expert-parallel over `comm`. Each rank must hold the experts of its slots —
// [rank·E/N, (rank+1)·E/N) without a placement, else those the placement gives it in each layer
// (WeightLoadOptions) — and calls Run (or Begin, Middle, End) for every MoE layer of every step,
// with zero tokens when it has no work.
//
// With a placement, each routed slot goes to one replica of its logical expert (ReplicaDispatch):
// the one on this rank if there is one, else replica (token + rank) mod replicas — deterministic,
// and spread evenly — or the least-sent-to rank's (kBalanced). The weighted sum still adds a
// token's experts in ascending logical order, so outputs do not depend on the placement.
class ExpertParallelMoe final : public MoeExecutor {
 public:
  // placement: null for the contiguous one; else checked against the model (CheckPlacement).
  ExpertParallelMoe(Communicator& comm, const ModelConfig& config, DType wire, OverlapMode overlap,
                    const ExpertPlacement* placement = nullptr,
                    ReplicaDispatch replicas = ReplicaDispatch::kBalanced);
  void Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
           int64_t tokens, float* out) override;
  void Begin(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
             int64_t tokens, int slot) override;
  void Middle(int slot) override;
  void End(int slot, float* out) override;
  // Bytes sent to other ranks by dispatch and combine so far.
  int64_t remote_bytes_sent() const;
  // A new placement with the same slots per rank (online rebalancing), from the next layer on:
  // only between steps, on every rank alike.
  void SetPlacement(const ExpertPlacement& placement);

 private:
  // A layer's placement as dispatch uses it.
  struct LayerRoute {
    std::vector<int32_t> slots;                  // physical → logical [N·S]
    std::vector<std::vector<int32_t>> replicas;  // logical → its physical experts, ascending
    std::vector<int32_t> own;                    // logical → its replica on this rank, or -1
  };
  // One micro-batch's MoE layer between Begin and End.
  struct InFlight {
    explicit InFlight(ExpertDispatcher d) : dispatcher(std::move(d)) {}
    ExpertDispatcher dispatcher;
    // Slots in the order they were dispatched (by physical expert), with their logical ids and
    // weights: what FinalizeRouting needs.
    ExpertRouting routing;
    const LayerRoute* route = nullptr;  // null: the contiguous placement
    int64_t layer = 0;
    const ModelConfig* config = nullptr;
    const MoeWeights* weights = nullptr;
    const float* x = nullptr;
    int64_t tokens = 0;
    std::vector<float> shared;  // the shared expert's output, once computed
    bool shared_done = false;
    std::vector<float> expert_out;
  };
  void Start(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
             int64_t tokens, int slot, bool shared_now);
  // Re-sorts `routing` by the physical expert chosen for each slot.
  void ToPhysical(const LayerRoute& route, ExpertRouting& routing) const;
  void RunShared(InFlight& s) const;
  void RunLocalExperts(const MoeWeights& weights, const LayerRoute* route,
                       const std::vector<float>& rows, const std::vector<int64_t>& local_offsets,
                       float* out) const;

  std::vector<InFlight> slots_;
  OverlapMode overlap_;
  ReplicaDispatch replica_dispatch_;
  int rank_ = 0;
  int ranks_ = 1;
  std::vector<int64_t> route_layers_;  // ascending, parallel to routes_
  std::vector<LayerRoute> routes_;
};

}  // namespace sy
