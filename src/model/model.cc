#include "model/model.h"

#include <filesystem>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "model/feed_forward.h"

namespace sy {

Result<std::unique_ptr<Model>> Model::Load(const std::string& directory,
                                           const WeightLoadOptions& options) {
  auto model = std::unique_ptr<Model>(new Model());
  model->directory_ = directory;
  SY_ASSIGN_OR_RETURN(model->config_,
                      LoadModelConfig((std::filesystem::path(directory) / "config.json").string()));
  SY_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(directory));
  model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
  SY_ASSIGN_OR_RETURN(model->weights_, LoadWeights(*model->checkpoint_, model->config_, options,
                                                   &model->unused_tensors_));
  if (options.pack) PackWeights(model->config_, model->weights_);
  model->attention_config_ = model->config_;
  if (options.tp_size > 1) {
    if (model->config_.num_attention_heads % options.tp_size != 0)
      return Status::Errorf("{} attention heads cannot be split over {} tensor-parallel ranks",
                            model->config_.num_attention_heads, options.tp_size);
    ShardAttentionHeads(model->config_, options.tp_rank, options.tp_size, model->weights_);
    model->attention_config_.num_attention_heads /= options.tp_size;
    model->attention_config_.num_key_value_heads = model->attention_config_.num_attention_heads;
  }
  model->rope_ = ComputeRopeParams(model->config_);
  return model;
}

LatentCache Model::NewCache(int64_t max_tokens, int64_t max_sequences, DType dtype,
                            int64_t page_size) const {
  const int64_t pages = (max_tokens + page_size - 1) / page_size + max_sequences;
  return LatentCache(config_.num_hidden_layers, config_.latent_cache_width(), page_size, pages,
                     dtype);
}

Status Model::CheckBatch(const ForwardBatch& batch) const {
  int64_t expected_offset = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const SequenceSlice& seq = batch.sequences[s];
    if (seq.token_count <= 0) return Status::Errorf("sequence {} is empty", s);
    if (seq.cache == nullptr) return Status::Errorf("sequence {} has no cache", s);
    if (seq.token_offset != expected_offset || seq.token_offset + seq.token_count > batch.size())
      return Status::Errorf("sequence {}: tokens [{}, {}) do not follow the previous sequence", s,
                            seq.token_offset, seq.token_offset + seq.token_count);
    if (seq.start_position != seq.cache->length)
      return Status::Errorf("sequence {}: starts at position {} but its cache holds {} tokens", s,
                            seq.start_position, seq.cache->length);
    for (int64_t i = 0; i < seq.token_count; ++i) {
      const int32_t id = batch.tokens[static_cast<size_t>(seq.token_offset + i)];
      if (id < 0 || id >= config_.vocab_size)
        return Status::Errorf("sequence {}, position {}: token id {} is outside [0, {})", s,
                              seq.start_position + i, id, config_.vocab_size);
    }
    expected_offset += seq.token_count;
  }
  if (expected_offset != batch.size())
    return Status::Errorf("batch has {} tokens but its sequences cover {}", batch.size(),
                          expected_offset);
  return Status::Ok();
}

Status Model::Forward(const ForwardBatch& batch, LatentCache& cache, const ForwardOptions& options,
                      std::vector<float>* logits) const {
  SY_RETURN_IF_ERROR(CheckBatch(batch));
  // Reserve cache rows for every sequence, or none.
  std::vector<int64_t> old_lengths;
  for (const auto& seq : batch.sequences) {
    old_lengths.push_back(seq.cache->length);
    Status reserved = cache.Reserve(*seq.cache, seq.start_position + seq.token_count);
    if (!reserved.ok()) {
      for (size_t i = 0; i < old_lengths.size(); ++i)
        cache.Truncate(*batch.sequences[i].cache, old_lengths[i]);
      return reserved;
    }
  }

  const ModelConfig& c = config_;
  const int64_t T = batch.size(), D = c.hidden_size;
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (const auto& seq : batch.sequences)
    for (int64_t i = 0; i < seq.token_count; ++i)
      positions[seq.token_offset + i] = seq.start_position + i;

  std::vector<float> hidden(static_cast<size_t>(T * D)), normed(hidden.size()),
      delta(hidden.size());
  for (int64_t t = 0; t < T; ++t)
    weights_.embed_tokens.DecodeRow(batch.tokens[t], hidden.data() + t * D);

  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const DecoderLayerWeights& layer = weights_.layers[l];
    kernels::RmsNorm(hidden.data(), T, D, layer.self_attn.input_layernorm.data(), eps,
                     normed.data());
    MlaForward(attention_config_, rope_, layer.self_attn, l, batch, positions, cache,
               options.attention, normed.data(), delta.data());
    if (options.attention_reduce != nullptr) options.attention_reduce->Sum(delta.data(), T * D);
    for (size_t i = 0; i < hidden.size(); ++i)
      hidden[i] += delta[i];
    kernels::RmsNorm(hidden.data(), T, D, layer.post_attention_layernorm.data(), eps,
                     normed.data());
    if (layer.is_moe) {
      if (options.moe != nullptr) {
        options.moe->Run(c, layer.moe, l, normed.data(), T, delta.data());
      } else {
        MoeForward(c, layer.moe, normed.data(), T, delta.data());
      }
    } else {
      FeedForward(layer.mlp, normed.data(), T, delta.data());
    }
    for (size_t i = 0; i < hidden.size(); ++i)
      hidden[i] += delta[i];
  }

  // Final norm and lm_head over the rows asked for.
  std::vector<int64_t> rows;
  if (options.logit_rows == LogitRows::kAll) {
    for (int64_t t = 0; t < T; ++t)
      rows.push_back(t);
  } else {
    for (const auto& seq : batch.sequences)
      rows.push_back(seq.token_offset + seq.token_count - 1);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> final_rows(static_cast<size_t>(R * D));
  for (int64_t r = 0; r < R; ++r)
    kernels::RmsNorm(hidden.data() + rows[r] * D, 1, D, weights_.norm.data(), eps,
                     final_rows.data() + r * D);
  logits->resize(static_cast<size_t>(R * c.vocab_size));
  kernels::LinearAuto(final_rows.data(), R, weights_.lm_head, logits->data());
  return Status::Ok();
}

}  // namespace sy
