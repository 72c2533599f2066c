#include "model/gguf_model.h"

#include <cmath>
#include <cstring>
#include <mutex>
#include <set>

#include <fmt/ranges.h>

#include "base/thread_pool.h"
#include "tensor/dtype.h"
#include "tensor/ggml_quants.h"

namespace sy {
namespace {

constexpr std::string_view kArchitecture = "deepseek2";
// llama_expert_gating_func_type (llama-hparams.h).
constexpr int64_t kGatingSoftmax = 1, kGatingSigmoid = 2;

// Typed access to deepseek2.* keys; errors name the file and the key.
class Metadata {
 public:
  explicit Metadata(const GgufFile& file) : file_(file) {}

  const GgufValue* Find(std::string_view key) const {
    return file_.Find(fmt::format("{}.{}", kArchitecture, key));
  }
  Result<int64_t> Int(std::string_view key) const {
    const GgufValue* value = Find(key);
    if (value == nullptr)
      return Status::Errorf("{}: {}.{} is missing", file_.source(), kArchitecture, key);
    auto number = value->AsInt();
    if (!number || *number < 0)
      return Status::Errorf("{}: {}.{} must be a non-negative integer, not a {}", file_.source(),
                            kArchitecture, key, GgufValueTypeName(value->type));
    return *number;
  }
  Result<int64_t> Int(std::string_view key, int64_t fallback) const {
    return Find(key) == nullptr ? Result<int64_t>(fallback) : Int(key);
  }
  Result<double> Float(std::string_view key, std::optional<double> fallback = {}) const {
    const GgufValue* value = Find(key);
    if (value == nullptr) {
      if (fallback) return *fallback;
      return Status::Errorf("{}: {}.{} is missing", file_.source(), kArchitecture, key);
    }
    auto number = value->AsFloat();
    if (!number)
      return Status::Errorf("{}: {}.{} must be a number, not a {}", file_.source(), kArchitecture,
                            key, GgufValueTypeName(value->type));
    return *number;
  }
  Result<bool> Bool(std::string_view key, bool fallback) const {
    const GgufValue* value = Find(key);
    if (value == nullptr) return fallback;
    if (value->type != GgufValueType::kBool)
      return Status::Errorf("{}: {}.{} must be a bool", file_.source(), kArchitecture, key);
    return value->unsigned_value != 0;
  }

 private:
  const GgufFile& file_;
};

Status CheckArchitecture(const GgufFile& file) {
  const GgufValue* value = file.Find("general.architecture");
  if (value == nullptr || !value->AsString())
    return Status::Errorf("{}: general.architecture is missing", file.source());
  if (*value->AsString() != kArchitecture)
    return Status::Errorf(
        "{}: architecture '{}' is not supported (deepseek2: DeepSeek-V2/V3 as llama.cpp names "
        "them)",
        file.source(), *value->AsString());
  return Status::Ok();
}

bool AnyTensorEndsWith(const GgufShards& shards, std::string_view suffix) {
  for (const GgufFile& file : shards.files())
    for (const auto& tensor : file.tensors())
      if (tensor.name.ends_with(suffix)) return true;
  return false;
}

// YaRN from rope.scaling.*; yarn_log_multiplier is 0.1 · mscale_all_dim (the converter's
// DeepSeek convention), and mscale is taken equal to it, as llama.cpp does.
Result<std::optional<YarnScaling>> ReadYarn(const GgufFile& file, const Metadata& meta) {
  const GgufValue* type = meta.Find("rope.scaling.type");
  if (type == nullptr) return std::optional<YarnScaling>();
  const auto name = type->AsString();
  if (!name)
    return Status::Errorf("{}: {}.rope.scaling.type must be a string", file.source(),
                          kArchitecture);
  if (*name == "none") return std::optional<YarnScaling>();
  if (*name != "yarn")
    return Status::Errorf("{}: rope scaling '{}' is not supported (yarn or none)", file.source(),
                          *name);
  YarnScaling yarn;
  SY_ASSIGN_OR_RETURN(yarn.factor, meta.Float("rope.scaling.factor"));
  SY_ASSIGN_OR_RETURN(yarn.original_max_position_embeddings,
                      meta.Int("rope.scaling.original_context_length"));
  SY_ASSIGN_OR_RETURN(yarn.beta_fast, meta.Float("rope.scaling.yarn_beta_fast", 32.0));
  SY_ASSIGN_OR_RETURN(yarn.beta_slow, meta.Float("rope.scaling.yarn_beta_slow", 1.0));
  if (meta.Find("rope.scaling.yarn_log_multiplier") != nullptr) {
    SY_ASSIGN_OR_RETURN(const double log_multiplier,
                        meta.Float("rope.scaling.yarn_log_multiplier"));
    // The f32 the converter stored is 0.1 · m rounded; m comes back as the nearest f32.
    const double mscale = static_cast<float>(log_multiplier * 10.0);
    yarn.mscale = mscale;
    yarn.mscale_all_dim = mscale;
  }
  return std::optional<YarnScaling>(yarn);
}

}  // namespace

Result<ModelConfig> GgufModelConfig(const GgufShards& shards) {
  const GgufFile& file = shards.first();
  SY_RETURN_IF_ERROR(CheckArchitecture(file));
  const Metadata meta(file);
  ModelConfig c;
  SY_ASSIGN_OR_RETURN(c.num_hidden_layers, meta.Int("block_count"));
  SY_ASSIGN_OR_RETURN(c.hidden_size, meta.Int("embedding_length"));
  SY_ASSIGN_OR_RETURN(c.intermediate_size, meta.Int("feed_forward_length"));
  SY_ASSIGN_OR_RETURN(c.num_attention_heads, meta.Int("attention.head_count"));
  c.num_key_value_heads = c.num_attention_heads;  // the file's 1 is MLA written as MQA
  SY_ASSIGN_OR_RETURN(c.max_position_embeddings, meta.Int("context_length"));
  SY_ASSIGN_OR_RETURN(c.rms_norm_eps, meta.Float("attention.layer_norm_rms_epsilon"));
  SY_ASSIGN_OR_RETURN(c.rope_theta, meta.Float("rope.freq_base", 10000.0));
  SY_ASSIGN_OR_RETURN(c.qk_rope_head_dim, meta.Int("rope.dimension_count"));
  SY_ASSIGN_OR_RETURN(c.kv_lora_rank, meta.Int("attention.kv_lora_rank"));
  SY_ASSIGN_OR_RETURN(const int64_t q_lora_rank, meta.Int("attention.q_lora_rank", 0));
  if (q_lora_rank > 0) c.q_lora_rank = q_lora_rank;
  // Files with split attn_k_b/attn_v_b give MLA's per-head sizes in *_mla keys (their
  // key_length is the latent's); older files with a fused attn_kv_b give them directly.
  const bool mla_keys = meta.Find("attention.key_length_mla") != nullptr;
  SY_ASSIGN_OR_RETURN(const int64_t key_length,
                      meta.Int(mla_keys ? "attention.key_length_mla" : "attention.key_length"));
  SY_ASSIGN_OR_RETURN(c.v_head_dim,
                      meta.Int(mla_keys ? "attention.value_length_mla" : "attention.value_length"));
  if (key_length <= c.qk_rope_head_dim)
    return Status::Errorf("{}: key length {} leaves no room beside {} rotary dimensions",
                          file.source(), key_length, c.qk_rope_head_dim);
  c.qk_nope_head_dim = key_length - c.qk_rope_head_dim;

  SY_ASSIGN_OR_RETURN(c.n_routed_experts, meta.Int("expert_count", 0));
  SY_ASSIGN_OR_RETURN(c.num_experts_per_tok, meta.Int("expert_used_count", 0));
  SY_ASSIGN_OR_RETURN(c.n_shared_experts, meta.Int("expert_shared_count", 0));
  SY_ASSIGN_OR_RETURN(c.moe_intermediate_size, meta.Int("expert_feed_forward_length", 0));
  SY_ASSIGN_OR_RETURN(c.first_k_dense_replace, meta.Int("leading_dense_block_count", 0));
  SY_ASSIGN_OR_RETURN(c.routed_scaling_factor, meta.Float("expert_weights_scale", 1.0));
  SY_ASSIGN_OR_RETURN(c.norm_topk_prob, meta.Bool("expert_weights_norm", false));
  SY_ASSIGN_OR_RETURN(c.n_group, meta.Int("expert_group_count", 1));
  SY_ASSIGN_OR_RETURN(c.topk_group, meta.Int("expert_group_used_count", 1));
  // Absent in DeepSeek-V2 files written before the key existed: softmax, as llama.cpp assumes.
  SY_ASSIGN_OR_RETURN(const int64_t gating, meta.Int("expert_gating_func", kGatingSoftmax));
  if (gating != kGatingSoftmax && gating != kGatingSigmoid)
    return Status::Errorf("{}: {}.expert_gating_func {} is not supported (1 softmax, 2 sigmoid)",
                          file.source(), kArchitecture, gating);
  c.scoring_func = gating == kGatingSigmoid ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  // DeepSeek-V3's bias-corrected routing is there exactly when the layers carry its bias.
  const bool v3 = AnyTensorEndsWith(shards, ".exp_probs_b.bias");
  c.model_type = v3 ? "deepseek_v3" : "deepseek_v2";
  c.topk_method = v3              ? TopkMethod::kNoauxTc
                  : c.n_group > 1 ? TopkMethod::kGroupLimitedGreedy
                                  : TopkMethod::kGreedy;
  SY_ASSIGN_OR_RETURN(c.yarn, ReadYarn(file, meta));

  const GgufTensorInfo* embedding = shards.FindTensor("token_embd.weight").tensor;
  int64_t vocab_fallback =
      embedding != nullptr && embedding->dims.size() == 2 ? embedding->dims[1] : 0;
  SY_ASSIGN_OR_RETURN(c.vocab_size, meta.Int("vocab_size", vocab_fallback));
  c.tie_word_embeddings = shards.FindTensor("output.weight").tensor == nullptr;
  for (auto [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", &c.bos_token_id},
                            std::pair{"tokenizer.ggml.eos_token_id", &c.eos_token_id}}) {
    if (const GgufValue* value = file.Find(key); value != nullptr && value->AsInt())
      *field = *value->AsInt();
  }
  c.num_nextn_predict_layers = 0;  // GGUF files carry no MTP layers
  // Validated exactly as a config.json with these fields would be.
  return ParseModelConfig(ModelConfigToJson(c), file.source());
}

Result<ModelConfig> GgufModelConfig(const GgufFile& file) {
  SY_ASSIGN_OR_RETURN(GgufShards shards, GgufShards::Single(file));
  return GgufModelConfig(shards);
}

Result<ModelConfig> LoadGgufModelConfig(const std::string& path) {
  SY_ASSIGN_OR_RETURN(GgufShards shards, GgufShards::Open(path));
  return GgufModelConfig(shards);
}

Result<GgufShards> GgufShards::Single(GgufFile file) {
  GgufShards shards;
  shards.files_.push_back(std::move(file));
  SY_RETURN_IF_ERROR(shards.Index());
  return shards;
}

Result<GgufShards> GgufShards::Open(const std::string& path) {
  GgufShards shards;
  SY_ASSIGN_OR_RETURN(GgufFile first, GgufFile::Open(path));
  const GgufValue* count_value = first.Find("split.count");
  const int64_t count = count_value && count_value->AsInt() ? *count_value->AsInt() : 1;
  shards.files_.push_back(std::move(first));
  if (count > 1) {
    // llama.cpp's shard names: PREFIX-%05d-of-%05d.gguf, numbered from 1.
    const std::string suffix = fmt::format("-00001-of-{:05d}.gguf", count);
    if (count > 99999 || !path.ends_with(suffix))
      return Status::Errorf("{}: shard 1 of {} must be named PREFIX{}", path, count, suffix);
    const std::string prefix = path.substr(0, path.size() - suffix.size());
    for (int64_t i = 0; i < count; ++i) {
      if (i > 0) {
        const std::string name = fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, i + 1, count);
        auto shard = GgufFile::Open(name);
        if (!shard.ok())
          return shard.status().WithContext(fmt::format("shard {} of {}", i + 1, count));
        shards.files_.push_back(std::move(shard).value());
      }
      const GgufFile& file = shards.files_.back();
      const GgufValue* number = file.Find("split.no");
      const GgufValue* total = file.Find("split.count");
      if (!number || number->AsInt() != i || !total || total->AsInt() != count)
        return Status::Errorf("{}: split.no / split.count do not say shard {} of {}", file.source(),
                              i + 1, count);
    }
  }
  SY_RETURN_IF_ERROR(shards.Index());
  return shards;
}

Status GgufShards::Index() {
  index_.clear();
  for (const GgufFile& file : files_)
    for (const auto& tensor : file.tensors())
      if (!index_.emplace(tensor.name, Located{&file, &tensor}).second)
        return Status::Errorf("{}: tensor '{}' is also in {}", file.source(), tensor.name,
                              index_[tensor.name].file->source());
  return Status::Ok();
}

GgufShards::Located GgufShards::FindTensor(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? Located{} : it->second;
}

namespace {

// The GGML types whose bytes are a plain little-endian array of one switchyard dtype.
std::optional<DType> RawDType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return DType::kF32;
    case GgmlType::kF16:
      return DType::kF16;
    case GgmlType::kBF16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

// GGUF tensor names (after "blk.N.", or whole) → Hugging Face names (after "model.layers.N.").
struct NameRule {
  std::string_view gguf;
  std::string_view hf;
};
constexpr NameRule kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attn_kv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate_inp.weight", "mlp.gate.weight"},
    {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
    {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
    {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
    {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
};
constexpr NameRule kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
// Stacked experts [E, rows, cols] → model.layers.N.mlp.experts.e.<proj>.weight.
constexpr NameRule kExpertNames[] = {
    {"ffn_gate_exps.weight", "gate_proj"},
    {"ffn_up_exps.weight", "up_proj"},
    {"ffn_down_exps.weight", "down_proj"},
};

}  // namespace

int64_t ParseNameIndex(std::string_view digits) {
  if (digits.empty() || digits.size() > 6) return -1;
  int64_t value = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return -1;
    value = value * 10 + (ch - '0');
  }
  return value;
}

std::string GgufTensorName(const std::string& hf) {
  for (const NameRule& rule : kGlobalNames)
    if (hf == rule.hf) return std::string(rule.gguf);
  if (!hf.starts_with("model.layers.")) return "";
  const size_t dot = hf.find('.', 13);
  if (dot == std::string::npos) return "";
  const std::string layer = hf.substr(13, dot - 13), rest = hf.substr(dot + 1);
  for (const NameRule& rule : kLayerNames)
    if (rest == rule.hf) return fmt::format("blk.{}.{}", layer, rule.gguf);
  for (const NameRule& rule : kExpertNames)
    if (rest == fmt::format("mlp.experts.{}.weight", rule.hf))
      return fmt::format("blk.{}.{}", layer, rule.gguf);
  return "";
}

namespace {

class GgufConverter {
 public:
  GgufConverter(const GgufShards& shards, const ModelConfig& config,
                const ExpertFilter& keep_expert)
      : shards_(shards), config_(config), keep_expert_(keep_expert) {}

  Status Run() {
    for (const GgufFile& file : shards_.files()) {
      file_ = &file;
      SY_RETURN_IF_ERROR(RunFile());
    }
    return Status::Ok();
  }

  Checkpoint Take() {
    return Checkpoint::FromMemory(shards_.first().source(), std::move(tensors_),
                                  std::move(sources_));
  }

 private:
  Status RunFile() {
    int64_t mtp_layers = 0;
    if (const GgufValue* value = shards_.first().Find("deepseek2.nextn_predict_layers");
        value && value->AsInt())
      mtp_layers = *value->AsInt();
    for (const auto& tensor : file_->tensors()) {
      const std::string name(tensor.name);
      SY_RETURN_IF_ERROR(CheckDecodable(tensor));
      if (!name.starts_with("blk.")) {
        SY_RETURN_IF_ERROR(Global(tensor));
        continue;
      }
      const size_t dot = name.find('.', 4);
      int64_t layer = -1;
      if (dot != std::string::npos) layer = ParseNameIndex(name.substr(4, dot - 4));
      if (layer < 0) return Error(tensor, "is not named blk.<layer>.<tensor>");
      if (layer >= config_.num_hidden_layers) {
        if (layer < config_.num_hidden_layers + mtp_layers) continue;  // MTP: not loaded
        return Error(tensor, fmt::format("names layer {} but the file has {}", layer,
                                         config_.num_hidden_layers));
      }
      SY_RETURN_IF_ERROR(Layer(tensor, layer, name.substr(dot + 1)));
    }
    return Status::Ok();
  }

  Status Error(const GgufTensorInfo& tensor, const std::string& what) const {
    return Status::Errorf("{}: tensor '{}' {}", FileOf(tensor).source(), tensor.name, what);
  }

  Status CheckDecodable(const GgufTensorInfo& tensor) const {
    const auto traits = GgmlTypeInfo(tensor.type);
    if (traits->dequantizable) return Status::Ok();
    return Error(tensor, fmt::format("is {}, which this build cannot decode (supported: F32, F16, "
                                     "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, "
                                     "Q6_K)",
                                     traits->name));
  }

  // Rows [first, first + count) of `tensor` (rows of dims[0] elements): F32, F16 and BF16 bytes
  // as they are, anything else decoded to float32.
  // Quantized types with an integer form stay GGML blocks where `keep_blocks` (and the global
  // mode) allow.
  Result<TensorToWrite> Rows(const GgufTensorInfo& tensor, int64_t first, int64_t count,
                             bool keep_blocks = false) const {
    const auto traits = GgmlTypeInfo(tensor.type);
    const int64_t row = tensor.dims[0];
    const int64_t row_bytes = row / traits->block_size * traits->block_bytes;
    const uint8_t* source = FileOf(tensor).TensorData(tensor) + first * row_bytes;
    TensorToWrite out;
    if (GlobalGgufWeights() == GgufWeights::kNative && GgmlIntegerForm(tensor.type) &&
        keep_blocks) {
      // Kept as GGML blocks: the loader packs them for the quantized kernels
      // (tensor/ggml_panels.h), reading the mapped file in place.
      out.dtype = DType::kGgml;
      out.ggml_type = tensor.type;
      InPlace(tensor, source, static_cast<size_t>(count * row_bytes), out);
      return out;
    }
    if (const std::optional<DType> raw = RawDType(tensor.type)) {
      // BF16, F16 and F32 are the checkpoint's own layout: read in place like the blocks above,
      // so packing gives the file's pages back (a copy here stayed resident beside the packed
      // weights: twice a BF16 file, four times an F16 one decoded to float32).
      out.dtype = *raw;
      InPlace(tensor, source, static_cast<size_t>(count * row_bytes), out);
      return out;
    }
    out.dtype = DType::kF32;
    out.bytes.resize(static_cast<size_t>(count * row) * sizeof(float));
    float* values = reinterpret_cast<float*>(out.bytes.data());
    // Rows decode independently (whole blocks each), so the pool splits them; every value is
    // the same whichever thread decodes it.
    std::mutex failure_mutex;
    Status failure;
    auto decode = [&](size_t begin, size_t end) {
      Status status = DequantizeGgml(tensor.type, source + begin * row_bytes,
                                     static_cast<int64_t>(end - begin) * row, values + begin * row);
      if (status.ok()) return;
      std::lock_guard<std::mutex> lock(failure_mutex);
      failure = status;
    };
    ThreadPool::Global().ParallelForIf(count * row >= (int64_t{1} << 18),
                                       static_cast<size_t>(count), decode);
    if (!failure.ok()) return Error(tensor, failure.message());
    return out;
  }

  // `bytes` of `tensor`'s data from `source` as `out`'s: pointing into the mapped file, or a copy
  // where the file is not mapped (one parsed from memory).
  void InPlace(const GgufTensorInfo& tensor, const uint8_t* source, size_t bytes,
               TensorToWrite& out) const {
    if (FileOf(tensor).mapping()) {
      out.external = source;
      out.external_bytes = bytes;
      out.external_owner = FileOf(tensor).mapping();
    } else {
      out.bytes.assign(source, source + bytes);
    }
  }

  // Every value as float32 (never blocks).
  Result<std::vector<float>> Floats(const GgufTensorInfo& tensor) const {
    SY_ASSIGN_OR_RETURN(TensorToWrite rows, Rows(tensor, 0, tensor.elements / tensor.dims[0]));
    std::vector<float> values(static_cast<size_t>(tensor.elements));
    const uint8_t* bytes = rows.external ? rows.external : rows.bytes.data();
    for (size_t i = 0; i < values.size(); ++i) {
      if (rows.dtype == DType::kF32) {
        std::memcpy(&values[i], bytes + 4 * i, 4);
        continue;
      }
      uint16_t bits;
      std::memcpy(&bits, bytes + 2 * i, 2);
      values[i] = rows.dtype == DType::kBF16 ? BF16ToF32(bits) : F16ToF32(bits);
    }
    return values;
  }

  void Add(std::string name, std::vector<int64_t> shape, TensorToWrite data,
           const GgufTensorInfo& from) {
    data.name = std::move(name);
    data.shape = std::move(shape);
    tensors_.push_back(std::move(data));
    sources_.push_back(fmt::format("{}: {}", FileOf(from).source(), from.name));
  }

  // The Hugging Face shape of a tensor: GGUF dims reversed.
  static std::vector<int64_t> HfShape(const GgufTensorInfo& tensor) {
    return std::vector<int64_t>(tensor.dims.rbegin(), tensor.dims.rend());
  }

  Status Whole(const GgufTensorInfo& tensor, std::string hf_name) {
    SY_ASSIGN_OR_RETURN(TensorToWrite data,
                        Rows(tensor, 0, tensor.elements / tensor.dims[0], /*keep_blocks=*/true));
    Add(std::move(hf_name), HfShape(tensor), std::move(data), tensor);
    return Status::Ok();
  }

  Status Global(const GgufTensorInfo& tensor) {
    for (const auto& rule : kGlobalNames)
      if (tensor.name == rule.gguf) return Whole(tensor, std::string(rule.hf));
    if (tensor.name == "rope_freqs.weight") return Status::Ok();  // llama.cpp's own cache
    return Error(tensor, "is not part of the deepseek2 layout");
  }

  Status Layer(const GgufTensorInfo& tensor, int64_t layer, const std::string& suffix) {
    const std::string prefix = fmt::format("model.layers.{}.", layer);
    for (const auto& rule : kLayerNames)
      if (suffix == rule.gguf) return Whole(tensor, prefix + std::string(rule.hf));
    for (const auto& rule : kExpertNames)
      if (suffix == rule.gguf) return Experts(tensor, layer, prefix, rule.hf);
    if (suffix == "attn_k_b.weight" || suffix == "attn_v_b.weight") {
      // Files that carry the fused attn_kv_b too: it is kv_b_proj as it is.
      if (shards_.FindTensor(fmt::format("blk.{}.attn_kv_b.weight", layer)).tensor != nullptr)
        return Status::Ok();
    }
    if (suffix == "attn_k_b.weight") return JoinKvB(tensor, layer, prefix);
    if (suffix == "attn_v_b.weight") {
      if (shards_.FindTensor(fmt::format("blk.{}.attn_k_b.weight", layer)).tensor == nullptr)
        return Error(tensor, "has no attn_k_b beside it");
      return Status::Ok();  // joined with attn_k_b
    }
    return Error(tensor, "is not part of the deepseek2 layout");
  }

  // [E, rows, cols] (dims {cols, rows, E}), each expert's rows contiguous.
  Status Experts(const GgufTensorInfo& tensor, int64_t layer, const std::string& prefix,
                 std::string_view proj) {
    if (tensor.dims.size() != 3 || tensor.dims[2] != config_.n_routed_experts)
      return Error(tensor, fmt::format("has dims [{}] but stacked experts need [cols, rows, {}]",
                                       fmt::join(tensor.dims, ", "), config_.n_routed_experts));
    const int64_t rows = tensor.dims[1], cols = tensor.dims[0];
    for (int64_t e = 0; e < tensor.dims[2]; ++e) {
      if (keep_expert_ && !keep_expert_(layer, e)) continue;
      SY_ASSIGN_OR_RETURN(TensorToWrite data, Rows(tensor, e * rows, rows, /*keep_blocks=*/true));
      Add(fmt::format("{}mlp.experts.{}.{}.weight", prefix, e, proj), {rows, cols}, std::move(data),
          tensor);
    }
    return Status::Ok();
  }

  // kv_b_proj [H·(dn + dv), r] from attn_k_b [H, r, dn] (dims {dn, r, H}: each head's W_UK
  // transposed) and attn_v_b [H, dv, r] (dims {r, dv, H}), as float32.
  Status JoinKvB(const GgufTensorInfo& k_b, int64_t layer, const std::string& prefix) {
    const GgufTensorInfo* v_b =
        shards_.FindTensor(fmt::format("blk.{}.attn_v_b.weight", layer)).tensor;
    if (v_b == nullptr) return Error(k_b, "has no attn_v_b beside it");
    const int64_t H = config_.num_attention_heads, r = config_.kv_lora_rank;
    const int64_t dn = config_.qk_nope_head_dim, dv = config_.v_head_dim;
    if (k_b.dims != std::vector<int64_t>{dn, r, H})
      return Error(k_b, fmt::format("has dims [{}] but the metadata implies [{}, {}, {}]",
                                    fmt::join(k_b.dims, ", "), dn, r, H));
    if (v_b->dims != std::vector<int64_t>{r, dv, H})
      return Error(*v_b, fmt::format("has dims [{}] but the metadata implies [{}, {}, {}]",
                                     fmt::join(v_b->dims, ", "), r, dv, H));
    SY_ASSIGN_OR_RETURN(std::vector<float> k, Floats(k_b));
    SY_ASSIGN_OR_RETURN(std::vector<float> v, Floats(*v_b));
    TensorToWrite joined;
    joined.dtype = DType::kF32;
    joined.bytes.resize(static_cast<size_t>(H * (dn + dv) * r) * sizeof(float));
    auto* out = reinterpret_cast<float*>(joined.bytes.data());
    for (int64_t h = 0; h < H; ++h) {
      float* head = out + h * (dn + dv) * r;
      for (int64_t j = 0; j < dn; ++j)
        for (int64_t c = 0; c < r; ++c)
          head[j * r + c] = k[(h * r + c) * dn + j];
      std::memcpy(head + dn * r, v.data() + h * dv * r,
                  static_cast<size_t>(dv * r) * sizeof(float));
    }
    Add(prefix + "self_attn.kv_b_proj.weight", {H * (dn + dv), r}, std::move(joined), k_b);
    // attn_k_b and attn_v_b are, head by head, the absorbed form's W_UKᵀ and W_UV: kept as
    // blocks too where both have an integer form, decode multiplies with them natively.
    if (GlobalGgufWeights() == GgufWeights::kNative && GgmlIntegerForm(k_b.type) &&
        GgmlIntegerForm(v_b->type)) {
      SY_ASSIGN_OR_RETURN(TensorToWrite k_blocks, Rows(k_b, 0, H * r, /*keep_blocks=*/true));
      Add(prefix + "self_attn.gguf_k_b.weight", {H * r, dn}, std::move(k_blocks), k_b);
      SY_ASSIGN_OR_RETURN(TensorToWrite v_blocks, Rows(*v_b, 0, H * dv, /*keep_blocks=*/true));
      Add(prefix + "self_attn.gguf_v_b.weight", {H * dv, r}, std::move(v_blocks), *v_b);
    }
    return Status::Ok();
  }

  // The shard holding a tensor (each tensor is in exactly one).
  const GgufFile& FileOf(const GgufTensorInfo& tensor) const {
    return *shards_.FindTensor(tensor.name).file;
  }

  const GgufShards& shards_;
  const GgufFile* file_ = nullptr;  // the shard being converted
  const ModelConfig& config_;
  const ExpertFilter& keep_expert_;
  std::vector<TensorToWrite> tensors_;
  std::vector<std::string> sources_;
};

}  // namespace

GgufWeights& GlobalGgufWeights() {
  static GgufWeights mode = GgufWeights::kNative;
  return mode;
}

Result<Checkpoint> GgufCheckpoint(const GgufShards& shards, const ModelConfig& config,
                                  const ExpertFilter& keep_expert) {
  SY_RETURN_IF_ERROR(CheckArchitecture(shards.first()));
  GgufConverter converter(shards, config, keep_expert);
  SY_RETURN_IF_ERROR(converter.Run());
  return converter.Take();
}

Result<Checkpoint> GgufCheckpoint(const GgufFile& file, const ModelConfig& config) {
  SY_ASSIGN_OR_RETURN(GgufShards shards, GgufShards::Single(file));
  return GgufCheckpoint(shards, config);
}

}  // namespace sy
