// config.json → ModelConfig: every DeepSeek-V2/V3 architecture field, parsed once and validated.
// Everything downstream reads this struct, never the JSON.
#pragma once

#include <algorithm>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace sy {

enum class ScoringFunc { kSigmoid, kSoftmax };
// noaux_tc: DeepSeek-V3 (bias-corrected, group score = sum of top 2);
// group_limited_greedy: V2 (group score = max); greedy: plain top-k.
enum class TopkMethod { kNoauxTc, kGroupLimitedGreedy, kGreedy };

struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;
};

// quantization_config of a Hugging Face int4 (W4A16) checkpoint; the tensors are read by
// model/hf_int4.h. kAwq: AutoAWQ's GEMM layout; kGptq: GPTQ's packed int32 layout (auto-gptq,
// GPTQModel); kCompressed: compressed-tensors' pack-quantized format.
enum class Int4Format : uint8_t { kNone, kAwq, kGptq, kCompressed };
struct Int4Config {
  Int4Format format = Int4Format::kNone;
  int64_t group_size = 128;
  // GPTQ and compressed-tensors: symmetric codes, q − 8 (compressed-tensors stores no zero
  // points then; GPTQ stores them anyway and they are used as stored). AWQ is always asymmetric.
  bool symmetric = false;
  // GPTQ: checkpoint_format "gptq" (the default) stores each zero point minus one, which the
  // readers add back; "gptq_v2" stores it as it is.
  bool gptq_zeros_minus_one = true;
  // Modules left unquantized, by name: AWQ/GPTQ `modules_to_not_convert` match as substrings of
  // the module name (as transformers does); compressed-tensors `ignore` entries match the whole
  // name, or from its start as a regular expression where written "re:PATTERN".
  std::vector<std::string> not_converted;
  bool ignore_is_regex_list = false;  // compressed-tensors' matching rules
  // The checkpoint's prefix for the language model's modules (ModelConfig::checkpoint_prefix):
  // entries may name a module with or without it.
  std::string module_prefix;
  bool enabled() const { return format != Int4Format::kNone; }
};

struct ModelConfig {
  std::string model_type;  // "deepseek_v3", "deepseek_v2", "kimi_k2" or "deepseek_v32"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t n_shared_experts = 0;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;
  TopkMethod topk_method = TopkMethod::kNoauxTc;
  bool norm_topk_prob = true;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  std::optional<int64_t> q_lora_rank;  // absent/null: a single q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  double rope_theta = 10000.0;
  std::optional<YarnScaling> yarn;  // rope_scaling of type yarn
  double rms_norm_eps = 1e-6;
  int64_t num_nextn_predict_layers = 0;
  int64_t max_position_embeddings = 0;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;
  // generation_config.json's eos_token_id (a number or a list) beyond eos_token_id: generation
  // stops on these too, as vLLM's does. Kimi K2's chat turns end in <|im_end|>, which only
  // generation_config.json names.
  std::vector<int64_t> generation_eos_token_ids;
  // DeepSeek-V3.2's sparse attention (DSA, model/sparse_attention.h): each layer's lightning
  // indexer scores every cached key for each query, and the query attends to its index_topk
  // best only. 0: dense MLA (every other model type).
  int64_t index_topk = 0;
  int64_t index_head_dim = 0;
  int64_t index_n_heads = 0;
  // quantization_config: fp8 e4m3 weights with [block_rows, block_cols] scale blocks.
  bool fp8_weights = false;
  int64_t weight_block_rows = 128;
  int64_t weight_block_cols = 128;
  // quantization_config: AWQ, GPTQ or compressed-tensors 4-bit weights.
  Int4Config int4;
  // A multimodal wrapper whose language model this is (Kimi K2.5's "kimi_k25": Kimi K2's model
  // in text_config beside a vision tower), or empty. Its language model's tensors are named with
  // `checkpoint_prefix` ("language_model."); those under `checkpoint_set_aside` (the vision tower
  // and projector, which this engine does not run) are not read.
  std::string wrapper_type;
  std::string checkpoint_prefix;
  std::vector<std::string> checkpoint_set_aside;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Elements cached per token per layer by absorbed MLA: the normalized latent and rotated k_pe.
  int64_t latent_cache_width() const { return kv_lora_rank + qk_rope_head_dim; }
  bool has_indexer() const { return index_topk > 0; }
  // Elements per token per layer in the paged cache: the latent row, and where the model has
  // DSA the indexer's key after it, so paging, prefix sharing, rollback and the prefill-to-decode
  // hand-off carry both with no second cache.
  int64_t cache_row_width() const {
    return latent_cache_width() + (has_indexer() ? index_head_dim : 0);
  }
  int64_t shared_expert_width() const { return moe_intermediate_size * n_shared_experts; }
  bool IsEos(int64_t token) const {
    return token == eos_token_id ||
           std::find(generation_eos_token_ids.begin(), generation_eos_token_ids.end(), token) !=
               generation_eos_token_ids.end();
  }
  bool IsMoeLayer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
};

// Parses and validates config.json text; `source` names the file in messages.
Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source);
Result<ModelConfig> LoadModelConfig(const std::string& path);
// Reads `directory`/generation_config.json, where there is one, into
// config->generation_eos_token_ids; an id outside the vocabulary is an error naming the file.
Status ReadGenerationConfig(const std::string& directory, ModelConfig* config);
// Writes the config back as HF-style config.json text (used by the model generator).
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace sy
