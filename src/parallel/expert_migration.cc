#include "parallel/expert_migration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "model/expert_wire.h"

namespace sy {

std::vector<ExpertMove> PlanExpertMoves(const ExpertPlacement& current,
                                        const ExpertPlacement& next) {
  std::vector<ExpertMove> moves;
  const int ranks = current.ranks;
  for (size_t l = 0; l < next.layers.size(); ++l) {
    const std::vector<int32_t>* now = current.Layer(next.layers[l]);
    if (now == nullptr) continue;
    std::vector<std::vector<int>> holders(static_cast<size_t>(current.experts));
    for (int r = 0; r < ranks; ++r)
      for (int32_t e : HeldExperts(*now, current.slots_per_rank, r))
        holders[static_cast<size_t>(e)].push_back(r);
    std::vector<int64_t> assigned(static_cast<size_t>(ranks), 0);
    for (int d = 0; d < ranks; ++d) {
      const std::vector<int32_t> had = HeldExperts(*now, current.slots_per_rank, d);
      for (int32_t e : HeldExperts(next.physical[l], next.slots_per_rank, d)) {
        if (std::binary_search(had.begin(), had.end(), e)) continue;
        const std::vector<int>& from = holders[static_cast<size_t>(e)];
        if (from.empty()) continue;  // CheckPlacement guarantees a replica; nothing to move from
        int source = from.front();
        for (int r : from)
          if (assigned[static_cast<size_t>(r)] < assigned[static_cast<size_t>(source)]) source = r;
        ++assigned[static_cast<size_t>(source)];
        moves.push_back({l, e, source, d});
      }
    }
  }
  return moves;
}

ExpertMigration::ExpertMigration(Communicator& comm, Model& model, ExpertParallelMoe& moe,
                                 ExpertPlacement& placement, ExpertPlacement next, Options options)
    : comm_(comm),
      mover_comm_(comm.Duplicate()),  // collective: every rank starts the move together
      model_(model),
      moe_(moe),
      placement_(placement),
      next_(std::move(next)),
      options_(options),
      moves_(PlanExpertMoves(placement, next_)),
      layers_(next_.layers.size()),
      arrivals_(layers_) {
  start_ = last_step_ = options_.step_began != std::chrono::steady_clock::time_point{}
                            ? options_.step_began
                            : std::chrono::steady_clock::now();
  if (options_.background && mover_comm_->threaded()) {
    thread_ = std::thread([this] { MoveLayers(); });
  } else {
    finishing_ = true;  // inline, every layer moves now: nothing switches until it returns
    MoveLayers();
  }
}

ExpertMigration::~ExpertMigration() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finishing_ = true;
  }
  switched_changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ExpertMigration::MoveLayers() {
  for (size_t l = 0; l < layers_; ++l) {
    {
      // Double-buffered: at most staged_layers layers' arrivals wait beside the experts in use.
      // At the end of the run the bound is lifted: every peer moves every layer, so none may
      // stop early and leave a peer waiting for its message.
      std::unique_lock<std::mutex> lock(mutex_);
      switched_changed_.wait(lock, [&] {
        return finishing_ || l < switched_ + std::max<size_t>(1, options_.staged_layers);
      });
    }
    MoveLayer(l);
  }
}

void ExpertMigration::MoveLayer(size_t l) {
  const int rank = mover_comm_->rank();
  const int64_t layer = next_.layers[l];
  const ModelConfig& c = model_.config();
  std::vector<Communicator::Message> sends, receives;
  std::vector<int32_t> received_experts;
  Status status = Status::Ok();
  for (const ExpertMove& move : moves_) {
    if (move.layer_index != l) continue;
    // One tag per (destination, expert) within the layer: a rank never sends one expert twice
    // to the same destination, and layers move one after another.
    const int tag = static_cast<int>(move.expert);
    if (move.source == rank) {
      const FeedForwardWeights* expert = model_.RoutedExpert(layer, move.expert);
      Communicator::Message message{move.destination, tag, {}};
      if (expert != nullptr) {
        message.bytes = SerializeExpert(*expert);
      } else if (status.ok()) {
        status = Status::Errorf("layer {}: expert {} should be here to send", layer, move.expert);
      }
      sends.push_back(std::move(message));  // an empty message still reaches its receiver
    }
    if (move.destination == rank) {
      receives.push_back({move.source, tag, {}});
      received_experts.push_back(move.expert);
    }
  }
  // A test hook: this rank dies in the middle of the move, as a crashed host would.
  if (const char* dies = std::getenv("SWITCHYARD_TEST_EXIT_WHILE_MOVING");
      dies != nullptr && std::atoi(dies) == rank && l + 1 == std::min<size_t>(2, layers_))
    std::_Exit(9);
  mover_comm_->SendReceive(sends, receives);
  std::map<int32_t, FeedForwardWeights> arrived;
  int64_t sent_bytes = 0, received_bytes = 0;
  for (const auto& m : sends)
    sent_bytes += static_cast<int64_t>(m.bytes.size());
  for (size_t i = 0; i < receives.size() && status.ok(); ++i) {
    received_bytes += static_cast<int64_t>(receives[i].bytes.size());
    auto expert = DeserializeExpert(receives[i].bytes, c.moe_intermediate_size, c.hidden_size);
    if (!expert.ok()) {
      status = Status::Errorf("layer {}, expert {} from rank {}: {}", layer, received_experts[i],
                              receives[i].peer, expert.status().message());
      break;
    }
    if (expert.value().gate_proj.packed == nullptr)
      model_.PackArrivedExpert(expert.value());  // rows travel only where the model packs none
    if (options_.verify) {
      auto fresh = model_.LoadRoutedExpert(layer, received_experts[i]);
      Status same = fresh.ok() ? SameExpertBytes(expert.value(), fresh.value()) : fresh.status();
      if (!same.ok())
        status = Status::Errorf("layer {}, expert {}: not the checkpoint's bytes: {}", layer,
                                received_experts[i], same.message());
    }
    arrived.emplace(received_experts[i], std::move(expert).value());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!status.ok() && failure_.ok()) failure_ = status;
  arrivals_[l] = std::move(arrived);
  report_.bytes_sent += sent_bytes;
  report_.bytes_received += received_bytes;
  report_.experts_received += static_cast<int64_t>(received_experts.size());
  ++arrived_;
}

bool ExpertMigration::OnStepBegin() {
  const auto now = std::chrono::steady_clock::now();
  size_t arrived;
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    report_.longest_step_seconds = std::max(
        report_.longest_step_seconds, std::chrono::duration<double>(now - last_step_).count());
    ++report_.steps;
    arrived = arrived_;
    failed = !failure_.ok();
  }
  last_step_ = now;
  if (comm_.AllReduceMax(failed ? 1 : 0) != 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_.Abort(failed ? "moving experts: " + failure_.message()
                       : "a peer rank failed to receive its moved experts",
                1);
  }
  // The layers every rank has: the fewest any rank has (a maximum of negatives).
  const size_t ready = static_cast<size_t>(-comm_.AllReduceMax(-static_cast<int64_t>(arrived)));
  for (size_t l = switched_; l < ready; ++l)
    SwitchLayer(l);
  if (ready > switched_) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      switched_ = ready;
      if (done()) report_.seconds = std::chrono::duration<double>(now - start_).count();
    }
    switched_changed_.notify_all();
    moe_.SetPlacement(placement_);
  }
  if (done() && thread_.joinable()) thread_.join();
  return done();
}

void ExpertMigration::SwitchLayer(size_t l) {
  std::map<int32_t, FeedForwardWeights> arrived;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    arrived = std::move(arrivals_[l]);
  }
  const int64_t layer = next_.layers[l];
  const std::vector<int32_t> held =
      HeldExperts(next_.physical[l], next_.slots_per_rank, comm_.rank());
  Status installed = model_.InstallRoutedExperts(layer, held, std::move(arrived));
  if (!installed.ok()) comm_.Abort("switching moved experts: " + installed.message(), 1);
  // The placement names this layer by index into its own layers; both list the same ones.
  for (size_t i = 0; i < placement_.layers.size(); ++i)
    if (placement_.layers[i] == layer) placement_.physical[i] = next_.physical[l];
}

ExpertMigration::Report ExpertMigration::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return report_;
}

}  // namespace sy
