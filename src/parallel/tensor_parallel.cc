#include "parallel/tensor_parallel.h"

#include <cstring>

namespace sy {

void TensorParallelAttention::AllGather(const float* mine, const std::vector<int64_t>& counts,
                                        float* all) {
  // Every count is known to every rank, so one all-to-all-v does it: the same block to each.
  const int P = group_.size();
  std::vector<int64_t> send_bytes(static_cast<size_t>(P)), send_offsets(static_cast<size_t>(P)),
      recv_bytes(static_cast<size_t>(P)), recv_offsets(static_cast<size_t>(P));
  int64_t offset = 0;
  for (int r = 0; r < P; ++r) {
    send_bytes[r] = counts[group_.rank()] * 4;
    recv_bytes[r] = counts[r] * 4;
    recv_offsets[r] = offset;
    offset += recv_bytes[r];
  }
  group_.StartAllToAllV(mine, send_bytes, send_offsets, all, recv_bytes, recv_offsets)->Wait();
}

void TensorParallelAttention::AllToAll(const float* send, const std::vector<int64_t>& send_counts,
                                       float* recv, const std::vector<int64_t>& recv_counts) {
  const int P = group_.size();
  std::vector<int64_t> send_bytes(static_cast<size_t>(P)), send_offsets(static_cast<size_t>(P)),
      recv_bytes(static_cast<size_t>(P)), recv_offsets(static_cast<size_t>(P));
  int64_t sent = 0, received = 0;
  for (int r = 0; r < P; ++r) {
    send_bytes[r] = send_counts[r] * 4;
    send_offsets[r] = sent;
    sent += send_bytes[r];
    recv_bytes[r] = recv_counts[r] * 4;
    recv_offsets[r] = received;
    received += recv_bytes[r];
  }
  group_.StartAllToAllV(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets)->Wait();
}

void TokenShardedMoe::Gather(std::vector<float>& mine, float* out) {
  std::vector<uint8_t> bytes(mine.size() * sizeof(float));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<uint8_t> all = group_.AllGather(bytes);  // shares in rank order = token order
  std::memcpy(out, all.data(), all.size());
}

void TokenShardedMoe::Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                          const float* x, int64_t tokens, float* out) {
  const int64_t D = config.hidden_size, parts = group_.size(), index = group_.rank();
  const int64_t begin = tokens * index / parts, end = tokens * (index + 1) / parts;
  std::vector<float> mine(static_cast<size_t>((end - begin) * D));
  inner_.Run(config, weights, layer, x + begin * D, end - begin, mine.data());
  Gather(mine, out);
}

void TokenShardedMoe::Begin(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                            const float* x, int64_t tokens, int slot) {
  const int64_t D = config.hidden_size, parts = group_.size(), index = group_.rank();
  const int64_t begin = tokens * index / parts, end = tokens * (index + 1) / parts;
  share_[slot].resize(static_cast<size_t>((end - begin) * D));
  inner_.Begin(config, weights, layer, x + begin * D, end - begin, slot);
}

void TokenShardedMoe::End(int slot, float* out) {
  inner_.End(slot, share_[slot].data());
  Gather(share_[slot], out);
}

}  // namespace sy
