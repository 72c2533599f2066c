#include "model/moe_executor.h"

#include <algorithm>

#include "model/feed_forward.h"

namespace sy {

void LocalMoe::Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                   const float* x, int64_t tokens, float* out) {
  if (recorder_ == nullptr) {
    if (tokens > 0) MoeForward(config, weights, x, tokens, out);
    return;
  }
  const ExpertRouting routing = RouteTokens(config, weights, x, tokens);
  recorder_->Record(layer, routing);  // empty batches too: they are steps of the window
  if (tokens > 0) MoeForwardRouted(config, weights, routing, x, out);
}

void WholeLayerMoe::Begin(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                          const float* x, int64_t tokens, int slot) {
  results_[slot].resize(static_cast<size_t>(tokens * config.hidden_size));
  Run(config, weights, layer, x, tokens, results_[slot].data());
}

void WholeLayerMoe::End(int slot, float* out) {
  std::copy(results_[slot].begin(), results_[slot].end(), out);
}

}  // namespace sy
