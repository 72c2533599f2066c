#include "model/config.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <fmt/format.h>

namespace sy {
namespace {

using nlohmann::json;

constexpr int64_t kMaxHiddenLayers = 65536;

// Field readers: each names the field and what was wrong with it.
class FieldReader {
 public:
  FieldReader(const json& object, std::string source)
      : object_(object), source_(std::move(source)) {}

  Status status() const { return status_; }

  void Int(const char* name, int64_t& out, bool required = true) {
    if (!status_.ok()) return;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) Fail(name, "is missing");
      return;
    }
    if (!it->is_number_integer()) {
      // Accept integral floats such as 4096.0; reject anything else. The range is checked before
      // the cast: a double past int64's range (1.2e69, found by the hf_int4 fuzzer) has no
      // defined conversion.
      if (it->is_number_float()) {
        const double value = it->get<double>();
        if (!(value >= -0x1p63 && value < 0x1p63)) {
          Fail(name, "is out of range");
          return;
        }
        if (value == std::trunc(value)) {
          out = static_cast<int64_t>(value);
          return;
        }
      }
      Fail(name, "must be an integer");
      return;
    }
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      Fail(name, "is out of range");
      return;
    }
    out = it->get<int64_t>();
  }

  void OptionalInt(const char* name, std::optional<int64_t>& out) {
    if (!status_.ok()) return;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      out.reset();
      return;
    }
    int64_t value = 0;
    Int(name, value);
    out = value;
  }

  void Double(const char* name, double& out, bool required = true) {
    if (!status_.ok()) return;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) Fail(name, "is missing");
      return;
    }
    if (!it->is_number()) {
      Fail(name, "must be a number");
      return;
    }
    out = it->get<double>();  // integers in the JSON read as floats (YaRN factor 40)
  }

  void OptionalDouble(const char* name, std::optional<double>& out) {
    if (!status_.ok()) return;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return;
    double value = 0;
    Double(name, value);
    out = value;
  }

  void Bool(const char* name, bool& out, bool required = false) {
    if (!status_.ok()) return;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) Fail(name, "is missing");
      return;
    }
    if (!it->is_boolean()) {
      Fail(name, "must be true or false");
      return;
    }
    out = it->get<bool>();
  }

  void String(const char* name, std::string& out, bool required = false) {
    if (!status_.ok()) return;
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (required) Fail(name, "is missing");
      return;
    }
    if (!it->is_string()) {
      Fail(name, "must be a string");
      return;
    }
    out = it->get<std::string>();
  }

  void Fail(const std::string& name, const std::string& what) {
    if (status_.ok()) status_ = Status::Errorf("{}: field '{}' {}", source_, name, what);
  }

 private:
  const json& object_;
  std::string source_;
  Status status_;
};

Status Check(bool condition, const std::string& source, const std::string& field,
             const std::string& what) {
  if (condition) return Status::Ok();
  return Status::Errorf("{}: field '{}' {}", source, field, what);
}

Status Validate(const ModelConfig& c, const std::string& s) {
  SY_RETURN_IF_ERROR(Check(c.vocab_size > 0, s, "vocab_size", "must be positive"));
  SY_RETURN_IF_ERROR(Check(c.hidden_size > 0, s, "hidden_size", "must be positive"));
  // Layer counts are bounded before anything walks the layers: a count from a damaged file must
  // not become a loop of 2^40 steps (the GGUF fuzzer's block_count; a checkpoint without its MTP
  // module is looked for layer by layer). DeepSeek-V3 has 61 and 1.
  SY_RETURN_IF_ERROR(Check(c.num_hidden_layers > 0 && c.num_hidden_layers <= kMaxHiddenLayers, s,
                           "num_hidden_layers",
                           fmt::format("must be in [1, {}]", kMaxHiddenLayers)));
  SY_RETURN_IF_ERROR(
      Check(c.num_attention_heads > 0, s, "num_attention_heads", "must be positive"));
  SY_RETURN_IF_ERROR(Check(c.num_key_value_heads == c.num_attention_heads, s, "num_key_value_heads",
                           "must equal num_attention_heads for MLA"));
  SY_RETURN_IF_ERROR(Check(c.kv_lora_rank > 0, s, "kv_lora_rank", "must be positive"));
  SY_RETURN_IF_ERROR(
      Check(!c.q_lora_rank || *c.q_lora_rank > 0, s, "q_lora_rank", "must be positive or null"));
  SY_RETURN_IF_ERROR(Check(c.qk_nope_head_dim > 0, s, "qk_nope_head_dim", "must be positive"));
  SY_RETURN_IF_ERROR(Check(c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0, s,
                           "qk_rope_head_dim", "must be positive and even"));
  SY_RETURN_IF_ERROR(Check(c.v_head_dim > 0, s, "v_head_dim", "must be positive"));
  SY_RETURN_IF_ERROR(Check(c.rms_norm_eps > 0, s, "rms_norm_eps", "must be positive"));
  SY_RETURN_IF_ERROR(Check(c.rope_theta > 0, s, "rope_theta", "must be positive"));
  SY_RETURN_IF_ERROR(
      Check(c.first_k_dense_replace >= 0, s, "first_k_dense_replace", "must not be negative"));
  SY_RETURN_IF_ERROR(Check(c.moe_layer_freq >= 1, s, "moe_layer_freq", "must be at least 1"));
  SY_RETURN_IF_ERROR(
      Check(c.num_nextn_predict_layers >= 0 && c.num_nextn_predict_layers <= kMaxHiddenLayers, s,
            "num_nextn_predict_layers", fmt::format("must be in [0, {}]", kMaxHiddenLayers)));
  bool any_dense = false;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer)
    any_dense |= !c.IsMoeLayer(layer);
  if (any_dense) {
    SY_RETURN_IF_ERROR(Check(c.intermediate_size > 0, s, "intermediate_size",
                             "must be positive (the config has dense layers)"));
  }
  if (c.n_routed_experts > 0) {
    SY_RETURN_IF_ERROR(
        Check(c.moe_intermediate_size > 0, s, "moe_intermediate_size", "must be positive"));
    SY_RETURN_IF_ERROR(
        Check(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts, s,
              "num_experts_per_tok", "must be in [1, n_routed_experts]"));
    SY_RETURN_IF_ERROR(Check(c.n_group >= 1 && c.n_routed_experts % c.n_group == 0, s, "n_group",
                             "must be at least 1 and divide n_routed_experts"));
    SY_RETURN_IF_ERROR(Check(c.topk_group >= 1 && c.topk_group <= c.n_group, s, "topk_group",
                             "must be in [1, n_group]"));
    SY_RETURN_IF_ERROR(
        Check(c.n_shared_experts >= 0, s, "n_shared_experts", "must not be negative"));
    int64_t candidates = c.topk_group * (c.n_routed_experts / c.n_group);
    if (c.topk_method != TopkMethod::kGreedy) {
      SY_RETURN_IF_ERROR(Check(candidates >= c.num_experts_per_tok, s, "topk_group",
                               "keeps fewer experts than num_experts_per_tok"));
    }
    if (c.topk_method == TopkMethod::kNoauxTc) {
      SY_RETURN_IF_ERROR(Check(c.n_routed_experts / c.n_group >= 2, s, "n_group",
                               "leaves fewer than 2 experts per group (noaux_tc sums the top 2)"));
    }
  }
  if (c.model_type == "deepseek_v32") {
    SY_RETURN_IF_ERROR(Check(c.index_topk > 0, s, "index_topk", "must be positive"));
    SY_RETURN_IF_ERROR(Check(c.index_n_heads > 0, s, "index_n_heads", "must be positive"));
    SY_RETURN_IF_ERROR(Check(c.index_head_dim >= c.qk_rope_head_dim, s, "index_head_dim",
                             "must be at least qk_rope_head_dim (the indexer rotates that many)"));
    SY_RETURN_IF_ERROR(Check(c.q_lora_rank.has_value(), s, "q_lora_rank",
                             "must be set: the indexer's queries come from the q_lora latent"));
  }
  if (c.yarn) {
    SY_RETURN_IF_ERROR(Check(c.yarn->factor > 0, s, "rope_scaling.factor", "must be positive"));
    SY_RETURN_IF_ERROR(Check(c.yarn->original_max_position_embeddings > 0, s,
                             "rope_scaling.original_max_position_embeddings", "must be positive"));
  }
  if (c.fp8_weights) {
    SY_RETURN_IF_ERROR(Check(c.weight_block_rows > 0 && c.weight_block_cols > 0, s,
                             "quantization_config.weight_block_size", "must be positive"));
  }
  return Status::Ok();
}

// Names of modules to leave unquantized: a list of strings, or null.
Status ReadNameList(const json& quant, const char* field, const std::string& where,
                    std::vector<std::string>& out) {
  auto it = quant.find(field);
  if (it == quant.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return Status::Errorf("{}.{} must be a list of module names", where, field);
  for (const auto& name : *it) {
    if (!name.is_string())
      return Status::Errorf("{}.{} must be a list of module names", where, field);
    out.push_back(name.get<std::string>());
  }
  return Status::Ok();
}

// quantization_config of an AWQ, GPTQ or compressed-tensors checkpoint: what the int4 loader
// (model/hf_int4.h) supports, anything else an error naming the field. The field names are the
// ones AutoAWQ, auto-gptq/GPTQModel and compressed-tensors write.
Status ParseInt4Config(const json& quant, const std::string& method, const std::string& source,
                       Int4Config& out) {
  const std::string where = source + ": quantization_config";
  FieldReader q(quant, where);
  int64_t bits = 4;
  if (method == "awq" || method == "gptq") {
    out.format = method == "awq" ? Int4Format::kAwq : Int4Format::kGptq;
    q.Int(quant.contains("w_bit") ? "w_bit" : "bits", bits);
    q.Int(quant.contains("q_group_size") ? "q_group_size" : "group_size", out.group_size);
    if (method == "awq") {
      bool zero_point = true;
      std::string version = "gemm";
      q.Bool("zero_point", zero_point);
      q.String("version", version);
      SY_RETURN_IF_ERROR(q.status());
      for (char& ch : version)
        ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (version != "gemm")
        return Status::Errorf("{}.version is '{}'; supported: gemm (AutoAWQ's GEMM packing)", where,
                              version);
      if (!zero_point)
        return Status::Errorf("{}.zero_point is false; supported: AWQ with zero points", where);
    } else {
      bool desc_act = false;  // act-order: accepted, but each g_idx must be the plain order
      std::string checkpoint_format = "gptq";
      q.Bool("sym", out.symmetric);
      q.Bool("desc_act", desc_act);
      q.String(quant.contains("checkpoint_format") ? "checkpoint_format" : "format",
               checkpoint_format);
      SY_RETURN_IF_ERROR(q.status());
      if (checkpoint_format != "gptq" && checkpoint_format != "gptq_v2")
        return Status::Errorf("{}.checkpoint_format is '{}'; supported: gptq, gptq_v2", where,
                              checkpoint_format);
      out.gptq_zeros_minus_one = checkpoint_format == "gptq";
      auto dynamic = quant.find("dynamic");
      if (dynamic != quant.end() && !dynamic->is_null() && !dynamic->empty())
        return Status::Errorf("{}.dynamic (per-module overrides) is not supported", where);
    }
    SY_RETURN_IF_ERROR(q.status());
    SY_RETURN_IF_ERROR(ReadNameList(quant, "modules_to_not_convert", where, out.not_converted));
  } else {
    out.format = Int4Format::kCompressed;
    out.ignore_is_regex_list = true;
    std::string format, status = "compressed";
    q.String("format", format);
    q.String("quantization_status", status);
    SY_RETURN_IF_ERROR(q.status());
    if (status != "compressed")
      return Status::Errorf("{}.quantization_status is '{}'; supported: compressed", where, status);
    auto groups = quant.find("config_groups");
    if (groups == quant.end() || !groups->is_object() || groups->empty())
      return Status::Errorf("{}.config_groups must name at least one scheme", where);
    bool first = true;
    for (const auto& [name, group] : groups->items()) {
      const std::string at = where + ".config_groups." + name;
      if (!group.is_object()) return Status::Errorf("{} must be an object", at);
      std::string group_format = format;
      FieldReader g(group, at);
      g.String("format", group_format);
      SY_RETURN_IF_ERROR(g.status());
      if (group_format != "pack-quantized")
        return Status::Errorf("{}: format is '{}'; supported: pack-quantized (W4A16)", at,
                              group_format.empty() ? "(none)" : group_format);
      for (const char* activations : {"input_activations", "output_activations"})
        if (group.contains(activations) && !group[activations].is_null())
          return Status::Errorf("{}.{} is set; supported: weight-only quantization (W4A16)", at,
                                activations);
      auto weights = group.find("weights");
      if (weights == group.end() || !weights->is_object())
        return Status::Errorf("{}.weights must be an object", at);
      FieldReader w(*weights, at + ".weights");
      std::string type = "int", strategy;
      int64_t group_bits = 0, group_size = 0;
      bool symmetric = true, dynamic = false;
      w.Int("num_bits", group_bits);
      w.String("type", type);
      w.String("strategy", strategy, true);
      w.Int("group_size", group_size, strategy == "group");
      w.Bool("symmetric", symmetric);
      w.Bool("dynamic", dynamic);
      SY_RETURN_IF_ERROR(w.status());
      if (type != "int" || strategy != "group" || dynamic)
        return Status::Errorf(
            "{}.weights is {} {} quantization{}; supported: int, strategy group, static", at, type,
            strategy, dynamic ? ", dynamic" : "");
      if (!first &&
          (group_bits != bits || group_size != out.group_size || symmetric != out.symmetric))
        return Status::Errorf("{}.weights differ from the first scheme's; supported: one scheme",
                              at);
      bits = group_bits;
      out.group_size = group_size;
      out.symmetric = symmetric;
      first = false;
    }
    SY_RETURN_IF_ERROR(ReadNameList(quant, "ignore", where, out.not_converted));
  }
  if (bits != 4) return Status::Errorf("{}: {}-bit weights; supported: 4", where, bits);
  // Groups of 32 (Kimi K2-Thinking's release): compressed-tensors' symmetric scheme only, which
  // is exactly llama.cpp's Q4_0 (hf_int4.h).
  const bool q4_0 = out.group_size == 32 && out.format == Int4Format::kCompressed && out.symmetric;
  if (out.group_size != 128 && !q4_0)
    return Status::Errorf(
        "{}: group size {}; supported: 128, and 32 for symmetric compressed-tensors", where,
        out.group_size);
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::Errorf("{}: not valid JSON", source);
  if (!root.is_object()) return Status::Errorf("{}: must be a JSON object", source);

  // Kimi K2.5 (KimiK25ForConditionalGeneration): Kimi K2's language model, config and all, in
  // text_config, beside a vision tower (MoonViT) and projector. Served text-only, as vLLM's
  // model does with no media: the language model is DeepSeek-V3's (vLLM runs it as
  // DeepseekV2Model on text_config), its tensors under "language_model.".
  if (auto type = root.find("model_type");
      type != root.end() && type->is_string() && *type == "kimi_k25") {
    auto text = root.find("text_config");
    if (text == root.end() || !text->is_object())
      return Status::Errorf(
          "{}: model_type kimi_k25 needs a 'text_config' object (the language "
          "model's config)",
          source);
    json inner = *text;
    if (auto inner_type = inner.find("model_type");
        inner_type != inner.end() && *inner_type == "kimi_k25")
      return Status::Errorf("{}: text_config is itself a kimi_k25 wrapper", source);
    // vLLM's KimiK25Config propagates the text model's quantization_config; take either. The
    // token ids too may be written at the top only.
    for (const char* key : {"quantization_config", "bos_token_id", "eos_token_id"})
      if (!inner.contains(key) && root.contains(key)) inner[key] = root[key];
    SY_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(inner.dump(), source + ": text_config"));
    c.wrapper_type = "kimi_k25";
    c.checkpoint_prefix = "language_model.";
    c.checkpoint_set_aside = {"vision_tower.", "mm_projector."};
    c.int4.module_prefix = c.checkpoint_prefix;
    return c;
  }

  ModelConfig c;
  FieldReader read(root, source);
  read.String("model_type", c.model_type);
  // Moonshot's Kimi K2 is DeepSeek-V3's architecture (DeepseekV3ForCausalLM) under its own
  // model_type: the same maths, more experts and heads set in the config.
  // DeepSeek-V3.2 (deepseek_v32) is V3 with a lightning indexer in every attention layer (DSA).
  if (!c.model_type.empty() && c.model_type != "deepseek_v3" && c.model_type != "deepseek_v2" &&
      c.model_type != "kimi_k2" && c.model_type != "deepseek_v32") {
    return Status::Errorf(
        "{}: field 'model_type' is '{}'; supported: deepseek_v3, deepseek_v2, kimi_k2, kimi_k25, "
        "deepseek_v32",
        source, c.model_type);
  }
  read.Int("vocab_size", c.vocab_size);
  read.Int("hidden_size", c.hidden_size);
  read.Int("intermediate_size", c.intermediate_size, /*required=*/false);
  read.Int("moe_intermediate_size", c.moe_intermediate_size, false);
  read.Int("num_hidden_layers", c.num_hidden_layers);
  read.Int("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;
  read.Int("num_key_value_heads", c.num_key_value_heads, false);
  read.Int("n_shared_experts", c.n_shared_experts, false);
  read.Int("n_routed_experts", c.n_routed_experts, false);
  read.Int("num_experts_per_tok", c.num_experts_per_tok, false);
  read.Int("n_group", c.n_group, false);
  read.Int("topk_group", c.topk_group, false);
  read.Double("routed_scaling_factor", c.routed_scaling_factor, false);
  read.Bool("norm_topk_prob", c.norm_topk_prob);
  read.Int("first_k_dense_replace", c.first_k_dense_replace, false);
  read.Int("moe_layer_freq", c.moe_layer_freq, false);
  read.OptionalInt("q_lora_rank", c.q_lora_rank);
  read.Int("kv_lora_rank", c.kv_lora_rank);
  read.Int("qk_nope_head_dim", c.qk_nope_head_dim);
  read.Int("qk_rope_head_dim", c.qk_rope_head_dim);
  read.Int("v_head_dim", c.v_head_dim);
  read.Double("rope_theta", c.rope_theta, false);
  read.Double("rms_norm_eps", c.rms_norm_eps, false);
  read.Int("num_nextn_predict_layers", c.num_nextn_predict_layers, false);
  read.Int("max_position_embeddings", c.max_position_embeddings, false);
  read.Bool("attention_bias", c.attention_bias);
  read.Bool("tie_word_embeddings", c.tie_word_embeddings);
  read.Int("bos_token_id", c.bos_token_id, false);
  read.Int("eos_token_id", c.eos_token_id, false);
  if (c.model_type == "deepseek_v32") {
    read.Int("index_topk", c.index_topk);
    read.Int("index_head_dim", c.index_head_dim);
    read.Int("index_n_heads", c.index_n_heads);
  }
  SY_RETURN_IF_ERROR(read.status());

  // V2 configs default to softmax + greedy; V3 is always sigmoid + noaux_tc in HF.
  bool v2 = c.model_type == "deepseek_v2";
  c.scoring_func = v2 ? ScoringFunc::kSoftmax : ScoringFunc::kSigmoid;
  c.topk_method = v2 ? TopkMethod::kGreedy : TopkMethod::kNoauxTc;
  std::string scoring, topk_method;
  read.String("scoring_func", scoring);
  read.String("topk_method", topk_method);
  SY_RETURN_IF_ERROR(read.status());
  if (scoring == "sigmoid")
    c.scoring_func = ScoringFunc::kSigmoid;
  else if (scoring == "softmax")
    c.scoring_func = ScoringFunc::kSoftmax;
  else if (!scoring.empty())
    return Status::Errorf("{}: field 'scoring_func' is '{}'; supported: sigmoid, softmax", source,
                          scoring);
  if (topk_method == "noaux_tc")
    c.topk_method = TopkMethod::kNoauxTc;
  else if (topk_method == "group_limited_greedy")
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  else if (topk_method == "greedy")
    c.topk_method = TopkMethod::kGreedy;
  else if (!topk_method.empty())
    return Status::Errorf(
        "{}: field 'topk_method' is '{}'; supported: noaux_tc, group_limited_greedy, greedy",
        source, topk_method);

  std::string hidden_act = "silu";
  read.String("hidden_act", hidden_act);
  SY_RETURN_IF_ERROR(read.status());
  if (hidden_act != "silu")
    return Status::Errorf("{}: field 'hidden_act' is '{}'; supported: silu", source, hidden_act);
  if (c.attention_bias)
    return Status::Errorf(
        "{}: field 'attention_bias' is true; biased attention projections are "
        "not supported",
        source);
  if (c.tie_word_embeddings)
    return Status::Errorf(
        "{}: field 'tie_word_embeddings' is true; DeepSeek checkpoints keep a "
        "separate lm_head and tied heads are not supported",
        source);
  if (root.contains("rope_interleave") && root["rope_interleave"].is_boolean() &&
      !root["rope_interleave"].get<bool>()) {
    return Status::Errorf(
        "{}: field 'rope_interleave' is false; DeepSeek weights need the "
        "pairwise rope layout",
        source);
  }

  auto scaling = root.find("rope_scaling");
  // transformers 5 saves RoPE as rope_parameters: rope_theta and the scaling in one object.
  if (auto params = root.find("rope_parameters"); (scaling == root.end() || scaling->is_null()) &&
                                                  params != root.end() && params->is_object()) {
    scaling = params;
    FieldReader theta(*params, source + ": rope_parameters");
    theta.Double("rope_theta", c.rope_theta, false);
    SY_RETURN_IF_ERROR(theta.status());
  }
  if (scaling != root.end() && !scaling->is_null()) {
    if (!scaling->is_object())
      return Status::Errorf("{}: field 'rope_scaling' must be an object", source);
    std::string type;
    FieldReader rope(*scaling, source + ": rope_scaling");
    rope.String("type", type);
    if (type.empty()) rope.String("rope_type", type);
    SY_RETURN_IF_ERROR(rope.status());
    if (type == "yarn") {
      YarnScaling yarn;
      rope.Double("factor", yarn.factor);
      rope.Int("original_max_position_embeddings", yarn.original_max_position_embeddings, false);
      rope.Double("beta_fast", yarn.beta_fast, false);
      rope.Double("beta_slow", yarn.beta_slow, false);
      rope.OptionalDouble("mscale", yarn.mscale);
      rope.OptionalDouble("mscale_all_dim", yarn.mscale_all_dim);
      rope.OptionalDouble("attention_factor", yarn.attention_factor);
      SY_RETURN_IF_ERROR(rope.status());
      c.yarn = yarn;
    } else if (type != "default" && !type.empty()) {
      return Status::Errorf("{}: field 'rope_scaling.type' is '{}'; supported: yarn, default",
                            source, type);
    }
  }

  auto quant = root.find("quantization_config");
  if (quant != root.end() && !quant->is_null()) {
    if (!quant->is_object())
      return Status::Errorf("{}: field 'quantization_config' must be an object", source);
    std::string method, format = "e4m3";
    FieldReader q(*quant, source + ": quantization_config");
    q.String("quant_method", method, true);
    SY_RETURN_IF_ERROR(q.status());
    if (method == "awq" || method == "gptq" || method == "compressed-tensors") {
      SY_RETURN_IF_ERROR(ParseInt4Config(*quant, method, source, c.int4));
      SY_RETURN_IF_ERROR(Validate(c, source));
      return c;
    }
    q.String("fmt", format);
    SY_RETURN_IF_ERROR(q.status());
    if (method != "fp8")
      return Status::Errorf(
          "{}: field 'quantization_config.quant_method' is '{}'; supported: fp8, awq, gptq, "
          "compressed-tensors",
          source, method);
    if (format != "e4m3")
      return Status::Errorf("{}: field 'quantization_config.fmt' is '{}'; supported: e4m3", source,
                            format);
    auto block = quant->find("weight_block_size");
    if (block == quant->end() || !block->is_array() || block->size() != 2 ||
        !(*block)[0].is_number_integer() || !(*block)[1].is_number_integer()) {
      return Status::Errorf(
          "{}: field 'quantization_config.weight_block_size' must be "
          "[rows, cols]",
          source);
    }
    c.fp8_weights = true;
    c.weight_block_rows = (*block)[0].get<int64_t>();
    c.weight_block_cols = (*block)[1].get<int64_t>();
  }

  SY_RETURN_IF_ERROR(Validate(c, source));
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Errorf("{}: cannot open", path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseModelConfig(text.str(), path);
}

Status ReadGenerationConfig(const std::string& directory, ModelConfig* config) {
  const std::string path = directory + "/generation_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Ok();  // optional
  std::stringstream text;
  text << in.rdbuf();
  const json root = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return Status::Errorf("{}: not a JSON object", path);
  auto it = root.find("eos_token_id");
  if (it == root.end() || it->is_null()) return Status::Ok();
  const json ids = it->is_array() ? *it : json::array({*it});
  config->generation_eos_token_ids.clear();
  for (const json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= config->vocab_size)
      return Status::Errorf("{}: eos_token_id {} is not a token id (vocab_size {})", path,
                            id.dump(), config->vocab_size);
    if (!config->IsEos(id.get<int64_t>()))
      config->generation_eos_token_ids.push_back(id.get<int64_t>());
  }
  return Status::Ok();
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json j;
  j["architectures"] = {c.model_type == "deepseek_v2"    ? "DeepseekV2ForCausalLM"
                        : c.model_type == "deepseek_v32" ? "DeepseekV32ForCausalLM"
                                                         : "DeepseekV3ForCausalLM"};
  j["model_type"] = c.model_type.empty() ? "deepseek_v3" : c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["scoring_func"] = c.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
  j["topk_method"] = c.topk_method == TopkMethod::kNoauxTc              ? "noaux_tc"
                     : c.topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                        : "greedy";
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rope_theta"] = c.rope_theta;
  if (c.yarn) {
    json r;
    r["type"] = "yarn";
    r["factor"] = c.yarn->factor;
    r["original_max_position_embeddings"] = c.yarn->original_max_position_embeddings;
    r["beta_fast"] = c.yarn->beta_fast;
    r["beta_slow"] = c.yarn->beta_slow;
    if (c.yarn->mscale) r["mscale"] = *c.yarn->mscale;
    if (c.yarn->mscale_all_dim) r["mscale_all_dim"] = *c.yarn->mscale_all_dim;
    j["rope_scaling"] = r;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["attention_bias"] = c.attention_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  if (c.has_indexer()) {
    j["index_topk"] = c.index_topk;
    j["index_head_dim"] = c.index_head_dim;
    j["index_n_heads"] = c.index_n_heads;
  }
  if (c.fp8_weights) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {c.weight_block_rows, c.weight_block_cols}}};
  }
  return j.dump(2) + "\n";
}

}  // namespace sy
