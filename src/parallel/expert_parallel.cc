#include "parallel/expert_parallel.h"

#include <cstring>

#include "base/stage_timer.h"
#include "kernels/cpu/grouped_ffn.h"

namespace sy {

ExpertDispatcher::ExpertDispatcher(Communicator& comm, int64_t experts, int64_t hidden, DType wire)
    : comm_(comm),
      experts_(experts),
      local_(experts / comm.size()),
      hidden_(hidden),
      wire_(wire),
      row_bytes_(static_cast<size_t>(hidden) * DTypeSize(wire)) {
  const size_t n = static_cast<size_t>(comm.size());
  send_bytes_.assign(n, 0);
  send_offsets_.assign(n, 0);
  recv_bytes_.assign(n, 0);
  recv_offsets_.assign(n, 0);
}

void ExpertDispatcher::Pack(const float* rows, int64_t count, uint8_t* wire) const {
  const int64_t values = count * hidden_;
  if (wire_ == DType::kF32) {
    std::memcpy(wire, rows, static_cast<size_t>(values) * 4);
    return;
  }
  for (int64_t i = 0; i < values; ++i) {
    const uint16_t bits = F32ToBF16(rows[i]);
    std::memcpy(wire + 2 * i, &bits, 2);
  }
}

void ExpertDispatcher::Unpack(const uint8_t* wire, int64_t count, float* rows) const {
  const int64_t values = count * hidden_;
  if (wire_ == DType::kF32) {
    std::memcpy(rows, wire, static_cast<size_t>(values) * 4);
    return;
  }
  for (int64_t i = 0; i < values; ++i) {
    uint16_t bits;
    std::memcpy(&bits, wire + 2 * i, 2);
    rows[i] = BF16ToF32(bits);
  }
}

void ExpertDispatcher::DispatchSend(const ExpertRouting& routing, const float* x) {
  ScopedStage stage(Stage::kDispatch);
  const int ranks = comm_.size();
  slots_ = static_cast<int64_t>(routing.sorted_slots.size());
  // Counts per destination rank and per its local expert; exchange them first.
  std::vector<int64_t> counts_out(static_cast<size_t>(experts_)),
      counts_in(static_cast<size_t>(experts_));
  for (int64_t e = 0; e < experts_; ++e)
    counts_out[e] = routing.expert_offsets[e + 1] - routing.expert_offsets[e];
  comm_.AllToAll(counts_out.data(), counts_in.data(), local_);
  // Rows in sorted order are already grouped by destination rank.
  send_buffer_.resize(static_cast<size_t>(slots_) * row_bytes_);
  for (int64_t i = 0; i < slots_; ++i)
    Pack(x + (routing.sorted_slots[i] / routing.top_k) * hidden_, 1,
         send_buffer_.data() + i * row_bytes_);
  int64_t received_rows = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t rows_out =
        routing.expert_offsets[(r + 1) * local_] - routing.expert_offsets[r * local_];
    send_offsets_[r] = routing.expert_offsets[r * local_] * static_cast<int64_t>(row_bytes_);
    send_bytes_[r] = rows_out * static_cast<int64_t>(row_bytes_);
    int64_t rows_in = 0;
    for (int64_t i = 0; i < local_; ++i)
      rows_in += counts_in[r * local_ + i];
    recv_offsets_[r] = received_rows * static_cast<int64_t>(row_bytes_);
    recv_bytes_[r] = rows_in * static_cast<int64_t>(row_bytes_);
    received_rows += rows_in;
  }
  // The re-routing sort by local expert, computed now from the counts: for each local expert,
  // its rows from source 0, then source 1, ...
  local_offsets_.assign(static_cast<size_t>(local_ + 1), 0);
  resort_source_.resize(static_cast<size_t>(received_rows));
  std::vector<int64_t> source_start(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    source_start[r] = recv_offsets_[r] / static_cast<int64_t>(row_bytes_);
  int64_t next = 0;
  for (int64_t i = 0; i < local_; ++i) {
    for (int r = 0; r < ranks; ++r) {
      int64_t before = 0;  // rows of this source for local experts < i
      for (int64_t j = 0; j < i; ++j)
        before += counts_in[r * local_ + j];
      for (int64_t k = 0; k < counts_in[r * local_ + i]; ++k)
        resort_source_[next++] = source_start[r] + before + k;
    }
    local_offsets_[i + 1] = next;
  }
  recv_buffer_.resize(static_cast<size_t>(received_rows) * row_bytes_);
  pending_ = comm_.StartAllToAllV(send_buffer_.data(), send_bytes_, send_offsets_,
                                  recv_buffer_.data(), recv_bytes_, recv_offsets_);
}

const std::vector<float>& ExpertDispatcher::DispatchRecv(std::vector<int64_t>* local_offsets) {
  ScopedStage stage(Stage::kDispatch);
  pending_->Wait();
  pending_.reset();
  const int64_t rows = static_cast<int64_t>(resort_source_.size());
  received_.resize(static_cast<size_t>(rows * hidden_));
  for (int64_t j = 0; j < rows; ++j)
    Unpack(recv_buffer_.data() + resort_source_[j] * row_bytes_, 1, received_.data() + j * hidden_);
  *local_offsets = local_offsets_;
  return received_;
}

void ExpertDispatcher::CombineSend(const float* expert_rows) {
  ScopedStage stage(Stage::kCombine);
  // Undo the re-routing sort into the arrival order, then send each source its rows back.
  const int64_t rows = static_cast<int64_t>(resort_source_.size());
  for (int64_t j = 0; j < rows; ++j)
    Pack(expert_rows + j * hidden_, 1, recv_buffer_.data() + resort_source_[j] * row_bytes_);
  pending_ = comm_.StartAllToAllV(recv_buffer_.data(), recv_bytes_, recv_offsets_,
                                  send_buffer_.data(), send_bytes_, send_offsets_);
}

void ExpertDispatcher::CombineRecv(float* out) {
  ScopedStage stage(Stage::kCombine);
  pending_->Wait();
  pending_.reset();
  Unpack(send_buffer_.data(), slots_, out);  // back in this rank's sorted-slot order
}

ExpertParallelMoe::ExpertParallelMoe(Communicator& comm, const ModelConfig& config, DType wire,
                                     OverlapMode overlap)
    : dispatcher_(comm, config.n_routed_experts, config.hidden_size, wire),
      second_(comm, config.n_routed_experts, config.hidden_size, wire),
      overlap_(overlap) {}

void ExpertParallelMoe::RunLocalExperts(const MoeWeights& w, const std::vector<float>& rows,
                                        const std::vector<int64_t>& local_offsets,
                                        float* out) const {
  ScopedStage stage(Stage::kGroupedGemm);
  const int64_t D = dispatcher_.hidden(), first = dispatcher_.first_expert(),
                local = dispatcher_.local_experts();
  const int64_t received = local_offsets.back();
  std::vector<kernels::ExpertPanels> panels(static_cast<size_t>(local));
  bool packed = true;
  for (int64_t i = 0; i < local; ++i) {
    const FeedForwardWeights& ff = w.experts[first + i];
    packed = packed && ff.gate_proj.packed && ff.up_proj.packed && ff.down_proj.packed;
    if (packed)
      panels[i] = {ff.gate_proj.packed.get(), ff.up_proj.packed.get(), ff.down_proj.packed.get()};
  }
  if (received > 0 && packed) {
    kernels::GroupedExpertFfn(rows.data(), local_offsets, panels, D, out);
    return;
  }
  for (int64_t i = 0; i < local; ++i) {
    const int64_t begin = local_offsets[i], end = local_offsets[i + 1];
    if (begin < end)
      FeedForward(w.experts[first + i], rows.data() + begin * D, end - begin, out + begin * D);
  }
}

void ExpertParallelMoe::RunMicrobatched(const ModelConfig& c, const MoeWeights& w, const float* x,
                                        int64_t tokens, float* out) {
  const int64_t D = c.hidden_size;
  const int64_t half[2] = {tokens / 2, tokens - tokens / 2};
  const float* inputs[2] = {x, x + half[0] * D};
  ExpertDispatcher* exchange[2] = {&dispatcher_, &second_};
  ExpertRouting routing[2] = {RouteTokens(c, w, inputs[0], half[0]),
                              RouteTokens(c, w, inputs[1], half[1])};
  std::vector<float> shared[2], expert_out[2], expert_rows[2];
  auto run_shared = [&](int h) {
    if (w.shared_experts.empty() || half[h] == 0) return;
    shared[h].resize(static_cast<size_t>(half[h] * D));
    FeedForward(w.shared_experts, inputs[h], half[h], shared[h].data());
  };
  // Every rank starts the exchanges in the same order: A's dispatch, B's dispatch, A's combine,
  // B's combine. A's rows travel while B's shared expert runs, and the other way round.
  exchange[0]->DispatchSend(routing[0], inputs[0]);
  exchange[1]->DispatchSend(routing[1], inputs[1]);
  run_shared(0);
  for (int h = 0; h < 2; ++h) {
    std::vector<int64_t> offsets;
    const std::vector<float>& rows = exchange[h]->DispatchRecv(&offsets);
    expert_out[h].resize(static_cast<size_t>(offsets.back() * D));
    RunLocalExperts(w, rows, offsets, expert_out[h].data());
    exchange[h]->CombineSend(expert_out[h].data());
    if (h == 0) run_shared(1);
  }
  for (int h = 0; h < 2; ++h) {
    expert_rows[h].resize(static_cast<size_t>(half[h] * routing[h].top_k * D));
    exchange[h]->CombineRecv(expert_rows[h].data());
    if (half[h] > 0)
      FinalizeRouting(routing[h], expert_rows[h].data(),
                      shared[h].empty() ? nullptr : shared[h].data(), D,
                      out + (h == 0 ? 0 : half[0] * D));
  }
}

void ExpertParallelMoe::Run(const ModelConfig& c, const MoeWeights& w, int64_t layer,
                            const float* x, int64_t tokens, float* out) {
  if (overlap_ == OverlapMode::kMicrobatch) {
    RunMicrobatched(c, w, x, tokens, out);
    return;
  }
  const int64_t D = c.hidden_size;
  ExpertRouting routing = RouteTokens(c, w, x, tokens);
  std::vector<float> shared;
  auto run_shared = [&] {
    if (w.shared_experts.empty() || tokens == 0) return;
    shared.resize(static_cast<size_t>(tokens * D));
    FeedForward(w.shared_experts, x, tokens, shared.data());
  };
  dispatcher_.DispatchSend(routing, x);
  if (overlap_ == OverlapMode::kDispatch) run_shared();  // between dispatch send and receive
  std::vector<int64_t> local_offsets;
  const std::vector<float>& rows = dispatcher_.DispatchRecv(&local_offsets);
  std::vector<float> expert_out(static_cast<size_t>(local_offsets.back() * D));
  RunLocalExperts(w, rows, local_offsets, expert_out.data());
  dispatcher_.CombineSend(expert_out.data());
  std::vector<float> expert_rows(static_cast<size_t>(tokens * routing.top_k * D));
  dispatcher_.CombineRecv(expert_rows.data());
  if (overlap_ == OverlapMode::kNone) run_shared();
  if (tokens > 0)
    FinalizeRouting(routing, expert_rows.data(), shared.empty() ? nullptr : shared.data(), D, out);
}

}  // namespace sy
