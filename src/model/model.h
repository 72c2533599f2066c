// A loaded DeepSeek-V3-family model and its forward pass over ragged batches:
//   h = embed(ids); for each layer: h += MLA(norm(h)); h += MoE-or-MLP(norm(h));
//   logits = lm_head(norm(h))
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/decoder_schedule.h"
#include "model/latent_cache.h"
#include "model/mla.h"
#include "model/moe_executor.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace sy {

class Model {
 public:
  // Loads config.json and the safetensors checkpoint in `directory`.
  static Result<std::unique_ptr<Model>> Load(const std::string& directory,
                                             const WeightLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  // The config attention runs with: num_attention_heads is this rank's share under TP.
  const ModelConfig& attention_config() const { return attention_config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::vector<std::string>& unused_tensors() const { return unused_tensors_; }

  // A latent cache able to hold `max_tokens` tokens in all (rounded up to whole pages per
  // sequence for `max_sequences` sequences).
  LatentCache NewCache(int64_t max_tokens, int64_t max_sequences, DType dtype,
                       int64_t page_size = 16) const;

  // Runs one step. Checks token ids, positions and cache space first and changes nothing on
  // error. logits: [rows, vocab_size] per `options.logit_rows`. An empty batch is allowed: under
  // expert parallelism a rank with nothing to do still steps so its peers' exchanges complete.
  Status Forward(const ForwardBatch& batch, LatentCache& cache, const ForwardOptions& options,
                 std::vector<float>* logits) const;

 private:
  Status CheckBatch(const ForwardBatch& batch) const;

  std::string directory_;
  ModelConfig config_;
  ModelConfig attention_config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mappings the weights point into
  ModelWeights weights_;
  RopeParams rope_;
  bool sequence_parallel_attention_ = false;  // weights laid out for SP-TP-SP
  std::vector<std::string> unused_tensors_;
};

}  // namespace sy
