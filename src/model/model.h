// A loaded DeepSeek-V3-family model and its forward pass over ragged batches:
//   h = embed(ids); for each layer: h += MLA(norm(h)); h += MoE-or-MLP(norm(h));
//   logits = lm_head(norm(h))
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/decoder_schedule.h"
#include "model/expert_placement.h"
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

  // Whether the checkpoint has an MTP module (num_nextn_predict_layers > 0).
  bool has_mtp() const { return !weights_.mtp.empty(); }

  // Online expert moves (parallel/expert_migration.h). The routed expert `expert` of MoE layer
  // `layer` as this rank holds it; null where it is held elsewhere or the layer has no experts.
  const FeedForwardWeights* RoutedExpert(int64_t layer, int32_t expert) const;
  // Packs an expert that arrived from a peer the way this model's loader packed its own, so
  // the panels are the same bytes.
  void PackArrivedExpert(FeedForwardWeights& expert) const;
  // MoE layer `layer` comes to hold exactly the experts `held`: each of `arrived` put in, those
  // not in `held` freed. Every expert of `held` must be held already or arrive. Not while a
  // forward pass reads the layer.
  Status InstallRoutedExperts(int64_t layer, const std::vector<int32_t>& held,
                              std::map<int32_t, FeedForwardWeights> arrived);
  // A routed expert loaded (and packed) afresh from the checkpoint: what a moved one must equal.
  Result<FeedForwardWeights> LoadRoutedExpert(int64_t layer, int32_t expert) const;

  // A latent cache able to hold `max_tokens` tokens in all (rounded up to whole pages per
  // sequence for `max_sequences` sequences). With `mtp` it has one more layer, the MTP block's.
  LatentCache NewCache(int64_t max_tokens, int64_t max_sequences, DType dtype,
                       int64_t page_size = 16, bool mtp = false) const;
  // Cache layers: the main layers, plus the MTP block's with `mtp`.
  int64_t CacheLayers(bool mtp) const { return config_.num_hidden_layers + (mtp ? 1 : 0); }

  // Runs one step. Checks token ids, positions and cache space first and changes nothing on
  // error. logits: [rows, vocab_size] per `options.logit_rows`. An empty batch is allowed: under
  // expert parallelism a rank with nothing to do still steps so its peers' exchanges complete.
  // final_hidden (optional): [batch.size(), D], every token's hidden state after the final norm —
  // what the MTP module drafts from.
  Status Forward(const ForwardBatch& batch, LatentCache& cache, const ForwardOptions& options,
                 std::vector<float>* logits, std::vector<float>* final_hidden = nullptr) const;
  // One sequence as a prefill of its own, in a fresh cache (f32 unless told; scoring,
  // calibration, tests).
  Status ForwardSequence(const std::vector<int32_t>& ids, const ForwardOptions& options,
                         std::vector<float>* logits, DType cache_dtype = DType::kF32) const;

  // Runs the MTP module (spec 8; the DeepSeek-V3 report's MTP): for each token row t,
  //   u = eh_proj([enorm(embed(batch.tokens[t])); hnorm(main_hidden[t])]),
  // one decoder block over its own cache layer, shared_head.norm, then the head: the logits
  // predict the token after batch.tokens[t]. Row t pairs the main model's final hidden state at
  // position p with the token at p + 1, and sits at position p (as the module was trained), so
  // batch.tokens are the main sequence shifted left by one. A sequence's start_position may lie
  // below its cache length (the main layers run ahead of the MTP layer within a step); rows past
  // the length are reserved. `main_hidden`: [batch.size(), D]; logits as in Forward;
  // mtp_hidden (optional): [batch.size(), D] after shared_head.norm, the input of a chained draft.
  // The cache must have the MTP layer (NewCache with mtp).
  Status ForwardMtp(const ForwardBatch& batch, const float* main_hidden, LatentCache& cache,
                    const ForwardOptions& options, std::vector<float>* logits,
                    std::vector<float>* mtp_hidden = nullptr) const;

 private:
  Status CheckBatch(const ForwardBatch& batch, bool mtp) const;
  const MoeWeights* MoeAt(int64_t layer) const;
  Status ReserveRows(const ForwardBatch& batch, LatentCache& cache) const;
  // Runs stack layers [first, last) over the batch; row_input(t, row) writes token t's input
  // row. Returns every token's output rows [T, D] (all of them on every rank of an SP group).
  template <typename RowInput>
  Status RunStack(const ForwardBatch& batch, LatentCache& cache, const ForwardOptions& options,
                  int64_t first, int64_t last, RowInput row_input,
                  std::vector<float>& hidden) const;
  // norm + head over the rows `options.logit_rows` picks; final_hidden gets every row normed.
  void Head(const ForwardBatch& batch, const ForwardOptions& options,
            const std::vector<float>& hidden, const std::vector<float>& norm, const Matrix& head,
            std::vector<float>* logits, std::vector<float>* final_hidden) const;

  std::string directory_;
  ModelConfig config_;
  ModelConfig attention_config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mappings the weights point into
  bool packed_ = false;                     // WeightLoadOptions::pack
  ModelWeights weights_;
  RopeParams rope_;
  bool sequence_parallel_attention_ = false;  // weights laid out for SP-TP-SP
  std::vector<std::string> unused_tensors_;
  std::vector<const DecoderLayerWeights*> layer_table_;  // main layers, then MTP blocks
};

}  // namespace sy
