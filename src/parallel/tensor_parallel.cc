#include "parallel/tensor_parallel.h"

#include <cstring>
#include <vector>

namespace sy {

void TokenShardedMoe::Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                          const float* x, int64_t tokens, float* out) {
  const int64_t D = config.hidden_size, parts = group_.size(), index = group_.rank();
  const int64_t begin = tokens * index / parts, end = tokens * (index + 1) / parts;
  std::vector<float> mine(static_cast<size_t>((end - begin) * D));
  inner_.Run(config, weights, layer, x + begin * D, end - begin, mine.data());
  std::vector<uint8_t> bytes(mine.size() * sizeof(float));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  std::vector<uint8_t> all = group_.AllGather(bytes);  // shares in rank order = token order
  std::memcpy(out, all.data(), all.size());
}

}  // namespace sy
