// How a MoE layer's experts run: in this process (LocalMoe), or spread over expert-parallel
// ranks (parallel/expert_parallel.h). Model::Forward calls it once per MoE layer and micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/expert_load.h"
#include "model/weights.h"

namespace sy {

class MoeExecutor {
 public:
  virtual ~MoeExecutor() = default;
  // x: [tokens, D] output of post_attention_layernorm (tokens may be 0: a rank with no work
  // still takes part); out: [tokens, D] routed experts' weighted sum plus the shared expert.
  virtual void Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                   const float* x, int64_t tokens, float* out) = 0;

  // The same work in three calls, for the two-micro-batch schedule (model/decoder_schedule.h),
  // which runs the other micro-batch's compute between them while this one's rows travel:
  //   Begin:  gate and routing, dispatch send, the shared expert        (the seed's stage 3)
  //   Middle: dispatch receive, the local experts, combine send          (stage 4)
  //   End:    combine receive, the weighted sum with the shared expert   (stage 5)
  // `slot` (0 or 1) names the micro-batch; x must stay valid until End. Every rank calls the
  // three in the same order of slots.
  static constexpr int kSlots = 2;
  virtual void Begin(const ModelConfig& config, const MoeWeights& weights, int64_t layer,
                     const float* x, int64_t tokens, int slot) = 0;
  virtual void Middle(int slot) = 0;
  virtual void End(int slot, float* out) = 0;

  // Routed slots per logical expert (and, under expert parallelism, each exchange's received
  // rows) go to `recorder` from now on; null stops recording. Not owned.
  void set_load_recorder(ExpertLoadRecorder* recorder) { recorder_ = recorder; }

 protected:
  ExpertLoadRecorder* recorder_ = nullptr;
};

// An executor with nothing to wait for: the whole layer runs in Begin, End hands the result.
class WholeLayerMoe : public MoeExecutor {
 public:
  void Begin(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
             int64_t tokens, int slot) final;
  void Middle(int) final {}
  void End(int slot, float* out) final;

 private:
  std::vector<float> results_[kSlots];
};

// All experts in this process.
class LocalMoe final : public WholeLayerMoe {
 public:
  void Run(const ModelConfig& config, const MoeWeights& weights, int64_t layer, const float* x,
           int64_t tokens, float* out) override;
};

}  // namespace sy
