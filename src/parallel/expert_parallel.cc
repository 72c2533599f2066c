#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/stage_timer.h"
#include "base/thread_pool.h"
#include "kernels/cpu/grouped_ffn.h"

namespace sy {

namespace {

// fp8 rows carry one f32 scale per 128 values (the seed's 1×128 activation blocks), after the
// row's D bytes of e4m3 values.
constexpr int64_t kFp8Block = 128;

// restrict: bytes may alias floats, and without it the loop does not vectorize.
void EncodeFp8(const float* __restrict in, int64_t count, float multiplier,
               uint8_t* __restrict out) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = F32ToF8E4M3(in[i] * multiplier);
}

size_t WireRowBytes(int64_t hidden, DType wire) {
  if (wire == DType::kF8E4M3)
    return static_cast<size_t>(hidden + 4 * ((hidden + kFp8Block - 1) / kFp8Block));
  return static_cast<size_t>(hidden) * DTypeSize(wire);
}

}  // namespace

ExpertDispatcher::ExpertDispatcher(Communicator& comm, int64_t physical_experts, int64_t hidden,
                                   DType wire)
    : comm_(comm),
      experts_(physical_experts),
      local_(physical_experts / comm.size()),
      hidden_(hidden),
      wire_(wire),
      combine_wire_(wire == DType::kF8E4M3 ? DType::kBF16 : wire),
      row_bytes_(WireRowBytes(hidden, wire)),
      combine_row_bytes_(WireRowBytes(hidden, combine_wire_)) {
  const size_t n = static_cast<size_t>(comm.size());
  send_bytes_.assign(n, 0);
  send_offsets_.assign(n, 0);
  recv_bytes_.assign(n, 0);
  recv_offsets_.assign(n, 0);
}

void ExpertDispatcher::Pack(DType format, const float* rows, int64_t count, uint8_t* wire) const {
  const int64_t values = count * hidden_;
  const int64_t row_bytes = static_cast<int64_t>(WireRowBytes(hidden_, format));
  if (format == DType::kF32) {
    std::memcpy(wire, rows, static_cast<size_t>(values) * 4);
    return;
  }
  if (format == DType::kF8E4M3) {
    for (int64_t r = 0; r < count; ++r) {
      const float* row = rows + r * hidden_;
      uint8_t* out = wire + r * row_bytes;
      uint8_t* scales = out + hidden_;
      for (int64_t b = 0; b * kFp8Block < hidden_; ++b) {
        const int64_t begin = b * kFp8Block, end = std::min(hidden_, begin + kFp8Block);
        // max |x| through the bit patterns: for finite floats |x| orders as its bits do, and an
        // integer max reduction vectorizes where a float one may not (NaN rules).
        uint32_t amax_bits = 0;
        for (int64_t i = begin; i < end; ++i)
          amax_bits = std::max(amax_bits, BitsFromF32(row[i]) & 0x7fffffffu);
        const float amax = F32FromBits(amax_bits);
        const float scale = amax > 0 ? amax / 448.0f : 1.0f;  // 448: e4m3's largest finite value
        const float inverse = 1.0f / scale;
        std::memcpy(scales + 4 * b, &scale, 4);
        EncodeFp8(row + begin, end - begin, inverse, out + begin);
      }
    }
    return;
  }
  uint16_t* out = reinterpret_cast<uint16_t*>(wire);  // rows start 2-byte aligned
  for (int64_t i = 0; i < values; ++i)
    out[i] = F32ToBF16(rows[i]);
}

void ExpertDispatcher::Unpack(DType format, const uint8_t* wire, int64_t count, float* rows) const {
  const int64_t values = count * hidden_;
  const int64_t row_bytes = static_cast<int64_t>(WireRowBytes(hidden_, format));
  if (format == DType::kF32) {
    std::memcpy(rows, wire, static_cast<size_t>(values) * 4);
    return;
  }
  if (format == DType::kF8E4M3) {
    const float* table = F8E4M3Table();
    for (int64_t r = 0; r < count; ++r) {
      const uint8_t* in = wire + r * row_bytes;
      float* row = rows + r * hidden_;
      for (int64_t b = 0; b * kFp8Block < hidden_; ++b) {
        float scale;
        std::memcpy(&scale, in + hidden_ + 4 * b, 4);
        const int64_t begin = b * kFp8Block, end = std::min(hidden_, begin + kFp8Block);
        for (int64_t i = begin; i < end; ++i)
          row[i] = table[in[i]] * scale;
      }
    }
    return;
  }
  const uint16_t* in = reinterpret_cast<const uint16_t*>(wire);
  for (int64_t i = 0; i < values; ++i)
    rows[i] = BF16ToF32(in[i]);
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
  ThreadPool::Global().ParallelFor(static_cast<size_t>(slots_), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      Pack(wire_, x + (routing.sorted_slots[i] / routing.top_k) * hidden_, 1,
           send_buffer_.data() + i * row_bytes_);
  });
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
  for (int r = 0; r < ranks; ++r)
    if (r != comm_.rank()) remote_bytes_sent_ += send_bytes_[r];
  pending_ = comm_.StartAllToAllV(send_buffer_.data(), send_bytes_, send_offsets_,
                                  recv_buffer_.data(), recv_bytes_, recv_offsets_);
}

const std::vector<float>& ExpertDispatcher::DispatchRecv(std::vector<int64_t>* local_offsets) {
  ScopedStage stage(Stage::kDispatch);
  pending_->Wait();
  pending_.reset();
  const int64_t rows = static_cast<int64_t>(resort_source_.size());
  received_.resize(static_cast<size_t>(rows * hidden_));
  ThreadPool::Global().ParallelFor(static_cast<size_t>(rows), [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j)
      Unpack(wire_, recv_buffer_.data() + resort_source_[j] * row_bytes_, 1,
             received_.data() + j * hidden_);
  });
  *local_offsets = local_offsets_;
  return received_;
}

void ExpertDispatcher::CombineSend(const float* expert_rows) {
  ScopedStage stage(Stage::kCombine);
  // The same rows go back, in the combine format (bf16 when dispatch sends fp8, as the seed
  // does: outputs are summed, and their error adds up across the top-k experts).
  const int64_t rows = static_cast<int64_t>(resort_source_.size());
  const int64_t per_row = static_cast<int64_t>(combine_row_bytes_);
  const int ranks = comm_.size();
  combine_out_bytes_.resize(static_cast<size_t>(ranks));
  combine_out_offsets_.resize(static_cast<size_t>(ranks));
  combine_in_bytes_.resize(static_cast<size_t>(ranks));
  combine_in_offsets_.resize(static_cast<size_t>(ranks));
  const int64_t dispatch_row = static_cast<int64_t>(row_bytes_);
  for (int r = 0; r < ranks; ++r) {  // dispatch's receive side is combine's send side
    combine_out_bytes_[r] = recv_bytes_[r] / dispatch_row * per_row;
    combine_out_offsets_[r] = recv_offsets_[r] / dispatch_row * per_row;
    combine_in_bytes_[r] = send_bytes_[r] / dispatch_row * per_row;
    combine_in_offsets_[r] = send_offsets_[r] / dispatch_row * per_row;
    if (r != comm_.rank()) remote_bytes_sent_ += combine_out_bytes_[r];
  }
  // Undo the re-routing sort into the arrival order, then send each source its rows back.
  combine_out_.resize(static_cast<size_t>(rows * per_row));
  ThreadPool::Global().ParallelFor(static_cast<size_t>(rows), [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j)
      Pack(combine_wire_, expert_rows + j * hidden_, 1,
           combine_out_.data() + resort_source_[j] * per_row);
  });
  combine_in_.resize(static_cast<size_t>(slots_ * per_row));
  pending_ = comm_.StartAllToAllV(combine_out_.data(), combine_out_bytes_, combine_out_offsets_,
                                  combine_in_.data(), combine_in_bytes_, combine_in_offsets_);
}

void ExpertDispatcher::CombineRecv(float* out) {
  ScopedStage stage(Stage::kCombine);
  pending_->Wait();
  pending_.reset();
  // In this rank's sorted-slot order.
  ThreadPool::Global().ParallelFor(static_cast<size_t>(slots_), [&](size_t begin, size_t end) {
    Unpack(combine_wire_, combine_in_.data() + begin * combine_row_bytes_,
           static_cast<int64_t>(end - begin), out + begin * hidden_);
  });
}

ExpertParallelMoe::ExpertParallelMoe(Communicator& comm, const ModelConfig& config, DType wire,
                                     OverlapMode overlap, const ExpertPlacement* placement,
                                     ReplicaDispatch replicas)
    : overlap_(overlap), replica_dispatch_(replicas), rank_(comm.rank()), ranks_(comm.size()) {
  const int64_t physical =
      placement != nullptr ? placement->slots_per_rank * comm.size() : config.n_routed_experts;
  slots_.reserve(kSlots);
  for (int i = 0; i < kSlots; ++i)
    slots_.emplace_back(ExpertDispatcher(comm, physical, config.hidden_size, wire));
  if (placement != nullptr) SetPlacement(*placement);
}

void ExpertParallelMoe::SetPlacement(const ExpertPlacement& placement) {
  route_layers_.clear();
  routes_.clear();
  for (size_t l = 0; l < placement.layers.size(); ++l) {
    const std::vector<int32_t>& slots = placement.physical[l];
    bool contiguous = placement.redundant() == 0;
    for (size_t p = 0; p < slots.size() && contiguous; ++p)
      contiguous = slots[p] == static_cast<int32_t>(p);
    if (contiguous) continue;  // physical ids are the logical ones: nothing to re-sort
    LayerRoute route;
    route.slots = slots;
    route.replicas.resize(static_cast<size_t>(placement.experts));
    route.own.assign(static_cast<size_t>(placement.experts), -1);
    for (size_t p = 0; p < slots.size(); ++p) {
      route.replicas[slots[p]].push_back(static_cast<int32_t>(p));
      if (replica_dispatch_ == ReplicaDispatch::kOwnRank &&
          static_cast<int64_t>(p) / placement.slots_per_rank == rank_ && route.own[slots[p]] < 0)
        route.own[slots[p]] = static_cast<int32_t>(p);
    }
    route_layers_.push_back(placement.layers[l]);
    routes_.push_back(std::move(route));
  }
}

void ExpertParallelMoe::ToPhysical(const LayerRoute& route, ExpertRouting& routing) const {
  const int64_t K = routing.top_k;
  std::vector<int32_t> logical = routing.expert_ids;
  if (replica_dispatch_ == ReplicaDispatch::kBalanced) {
    const size_t per_rank = route.slots.size() / static_cast<size_t>(ranks_);
    // Rows sent to each rank in this exchange: the slots with one choice first, then each
    // slot with several to its least-sent-to replica's rank (ties: from replica (token + rank)
    // on, the spread rule's choice).
    std::vector<int64_t> sent(static_cast<size_t>(ranks_), 0);
    for (size_t slot = 0; slot < logical.size(); ++slot) {
      const std::vector<int32_t>& replicas = route.replicas[logical[slot]];
      if (replicas.size() == 1) {
        routing.expert_ids[slot] = replicas[0];
        ++sent[static_cast<size_t>(replicas[0]) / per_rank];
      }
    }
    for (size_t slot = 0; slot < logical.size(); ++slot) {
      const std::vector<int32_t>& replicas = route.replicas[logical[slot]];
      if (replicas.size() == 1) continue;
      const size_t n = replicas.size();
      const size_t first = static_cast<size_t>(static_cast<int64_t>(slot) / K + rank_) % n;
      int32_t best = replicas[first];
      for (size_t i = 1; i < n; ++i) {
        const int32_t p = replicas[(first + i) % n];
        if (sent[static_cast<size_t>(p) / per_rank] < sent[static_cast<size_t>(best) / per_rank])
          best = p;
      }
      routing.expert_ids[slot] = best;
      ++sent[static_cast<size_t>(best) / per_rank];
    }
  } else {
    for (size_t slot = 0; slot < logical.size(); ++slot) {
      const int32_t e = logical[slot];
      const int64_t token = static_cast<int64_t>(slot) / K;
      const std::vector<int32_t>& replicas = route.replicas[e];
      routing.expert_ids[slot] =
          route.own[e] >= 0 ? route.own[e]
                            : replicas[static_cast<size_t>(token + rank_) % replicas.size()];
    }
  }
  SortByExpert(routing, static_cast<int64_t>(route.slots.size()));
  // FinalizeRouting orders each token's sum by these ids: the logical ones, as in one process.
  routing.expert_ids = std::move(logical);
}

void ExpertParallelMoe::RunLocalExperts(const MoeWeights& w, const LayerRoute* route,
                                        const std::vector<float>& rows,
                                        const std::vector<int64_t>& local_offsets,
                                        float* out) const {
  ScopedStage stage(Stage::kGroupedGemm);
  const ExpertDispatcher& d = slots_[0].dispatcher;
  const int64_t D = d.hidden(), first = d.first_expert(), local = d.local_experts();
  const int64_t received = local_offsets.back();
  // The logical expert in each of this rank's slots.
  auto expert = [&](int64_t i) -> const FeedForwardWeights& {
    return w.experts[route != nullptr ? route->slots[first + i] : first + i];
  };
  std::vector<kernels::ExpertPanels> panels(static_cast<size_t>(local));
  bool packed = true;
  for (int64_t i = 0; i < local; ++i) {
    const FeedForwardWeights& ff = expert(i);
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
    if (begin < end) FeedForward(expert(i), rows.data() + begin * D, end - begin, out + begin * D);
  }
}

void ExpertParallelMoe::RunShared(InFlight& s) const {
  s.shared_done = true;
  if (s.weights->shared_experts.empty() || s.tokens == 0) return;
  s.shared.resize(static_cast<size_t>(s.tokens * s.config->hidden_size));
  FeedForward(s.weights->shared_experts, s.x, s.tokens, s.shared.data());
}

void ExpertParallelMoe::Start(const ModelConfig& c, const MoeWeights& w, int64_t layer,
                              const float* x, int64_t tokens, int slot, bool shared_now) {
  InFlight& s = slots_[slot];
  s.config = &c;
  s.weights = &w;
  s.x = x;
  s.tokens = tokens;
  s.layer = layer;
  s.shared_done = false;
  s.shared.clear();
  s.routing = RouteTokens(c, w, x, tokens);
  if (recorder_ != nullptr) recorder_->Record(layer, s.routing);
  auto it = std::lower_bound(route_layers_.begin(), route_layers_.end(), layer);
  s.route =
      it != route_layers_.end() && *it == layer ? &routes_[it - route_layers_.begin()] : nullptr;
  if (s.route != nullptr) ToPhysical(*s.route, s.routing);
  s.dispatcher.DispatchSend(s.routing, x);
  if (shared_now) RunShared(s);  // between dispatch send and receive
}

void ExpertParallelMoe::Begin(const ModelConfig& c, const MoeWeights& w, int64_t layer,
                              const float* x, int64_t tokens, int slot) {
  Start(c, w, layer, x, tokens, slot, /*shared_now=*/true);
}

void ExpertParallelMoe::Middle(int slot) {
  InFlight& s = slots_[slot];
  std::vector<int64_t> local_offsets;
  const std::vector<float>& rows = s.dispatcher.DispatchRecv(&local_offsets);
  if (recorder_ != nullptr) recorder_->RecordExchange(s.layer, local_offsets.back());
  s.expert_out.resize(static_cast<size_t>(local_offsets.back() * s.config->hidden_size));
  RunLocalExperts(*s.weights, s.route, rows, local_offsets, s.expert_out.data());
  s.dispatcher.CombineSend(s.expert_out.data());
}

void ExpertParallelMoe::End(int slot, float* out) {
  InFlight& s = slots_[slot];
  const int64_t D = s.config->hidden_size;
  std::vector<float> expert_rows(static_cast<size_t>(s.tokens * s.routing.top_k * D));
  s.dispatcher.CombineRecv(expert_rows.data());
  if (!s.shared_done) RunShared(s);  // no overlap: after the exchange
  if (s.tokens > 0)
    FinalizeRouting(s.routing, expert_rows.data(), s.shared.empty() ? nullptr : s.shared.data(), D,
                    out);
}

int64_t ExpertParallelMoe::remote_bytes_sent() const {
  int64_t total = 0;
  for (const InFlight& s : slots_)
    total += s.dispatcher.remote_bytes_sent();
  return total;
}

void ExpertParallelMoe::Run(const ModelConfig& c, const MoeWeights& w, int64_t layer,
                            const float* x, int64_t tokens, float* out) {
  Start(c, w, layer, x, tokens, 0, /*shared_now=*/overlap_ != OverlapMode::kNone);
  Middle(0);
  End(0, out);
}

}  // namespace sy
