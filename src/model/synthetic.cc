#include "model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "model/safetensors.h"

namespace sy {
namespace {

// splitmix64 + Box-Muller: the same numbers on every platform and standard library, which
// std::normal_distribution does not promise.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double Normal() {
    double u1 = Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2 * M_PI * u2);
  }

 private:
  uint64_t state_;
};

class CheckpointBuilder {
 public:
  CheckpointBuilder(const ModelConfig& config, uint64_t seed) : config_(config), random_(seed) {}

  std::vector<TensorToWrite>& tensors() { return tensors_; }

  // A [rows, cols] Linear weight ~ N(0, std); fp8 with block scales when `quantize`.
  void Matrix(const std::string& name, int64_t rows, int64_t cols, double std, bool quantize) {
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (float& v : values)
      v = static_cast<float>(random_.Normal() * std);
    if (quantize && config_.fp8_weights) {
      AddFp8(name, values, rows, cols);
    } else {
      AddBF16(name, values, {rows, cols});
    }
  }
  void Linear(const std::string& name, int64_t out, int64_t in) {
    Matrix(name, out, in, 1.0 / std::sqrt(static_cast<double>(in)), true);
  }
  void Norm(const std::string& name, int64_t size) {
    std::vector<float> values(static_cast<size_t>(size));
    for (float& v : values)
      v = static_cast<float>(1.0 + 0.1 * random_.Normal());
    AddBF16(name, values, {size});
  }
  void Bias(const std::string& name, int64_t size) {
    std::vector<float> values(static_cast<size_t>(size));
    for (float& v : values)
      v = static_cast<float>(0.1 * random_.Uniform());
    TensorToWrite tensor;
    tensor.name = name;
    tensor.dtype = DType::kF32;
    tensor.shape = std::vector<int64_t>{size};
    tensor.bytes.resize(values.size() * 4);
    std::memcpy(tensor.bytes.data(), values.data(), tensor.bytes.size());
    tensors_.push_back(std::move(tensor));
  }

 private:
  void AddBF16(const std::string& name, const std::vector<float>& values,
               std::vector<int64_t> shape) {
    TensorToWrite tensor;
    tensor.name = name;
    tensor.dtype = DType::kBF16;
    tensor.shape = std::move(shape);
    tensor.bytes.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits = F32ToBF16(values[i]);
      std::memcpy(tensor.bytes.data() + 2 * i, &bits, 2);
    }
    tensors_.push_back(std::move(tensor));
  }

  // DeepSeek's block quantization: scale_inv = amax(|block|) / 448 over each (possibly partial)
  // block, q = e4m3(w / scale_inv).
  void AddFp8(const std::string& name, const std::vector<float>& values, int64_t rows,
              int64_t cols) {
    const int64_t br = config_.weight_block_rows, bc = config_.weight_block_cols;
    const int64_t scale_rows = (rows + br - 1) / br, scale_cols = (cols + bc - 1) / bc;
    std::vector<float> scales(static_cast<size_t>(scale_rows * scale_cols), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col) {
        float& amax = scales[(r / br) * scale_cols + col / bc];
        amax = std::max(amax, std::fabs(values[r * cols + col]));
      }
    for (float& s : scales)
      s = s > 0 ? s / 448.0f : 1.0f;
    TensorToWrite weight;
    weight.name = name;
    weight.dtype = DType::kF8E4M3;
    weight.shape = std::vector<int64_t>{rows, cols};
    weight.bytes.resize(values.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col)
        weight.bytes[r * cols + col] =
            F32ToF8E4M3(values[r * cols + col] / scales[(r / br) * scale_cols + col / bc]);
    TensorToWrite scale;
    scale.name = name + "_scale_inv";
    scale.dtype = DType::kF32;
    scale.shape = std::vector<int64_t>{scale_rows, scale_cols};
    scale.bytes.resize(scales.size() * 4);
    std::memcpy(scale.bytes.data(), scales.data(), scale.bytes.size());
    tensors_.push_back(std::move(weight));
    tensors_.push_back(std::move(scale));
  }

  const ModelConfig& config_;
  Random random_;
  std::vector<TensorToWrite> tensors_;
};

void AddFeedForward(CheckpointBuilder& b, const std::string& prefix, int64_t width,
                    int64_t hidden) {
  b.Linear(prefix + ".gate_proj.weight", width, hidden);
  b.Linear(prefix + ".up_proj.weight", width, hidden);
  b.Linear(prefix + ".down_proj.weight", hidden, width);
}

void AddDecoderLayer(CheckpointBuilder& b, const ModelConfig& c, int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer);
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  b.Norm(p + ".input_layernorm.weight", D);
  if (c.q_lora_rank) {
    b.Linear(p + ".self_attn.q_a_proj.weight", *c.q_lora_rank, D);
    b.Norm(p + ".self_attn.q_a_layernorm.weight", *c.q_lora_rank);
    b.Linear(p + ".self_attn.q_b_proj.weight", H * c.qk_head_dim(), *c.q_lora_rank);
  } else {
    b.Linear(p + ".self_attn.q_proj.weight", H * c.qk_head_dim(), D);
  }
  b.Linear(p + ".self_attn.kv_a_proj_with_mqa.weight", c.latent_cache_width(), D);
  b.Norm(p + ".self_attn.kv_a_layernorm.weight", c.kv_lora_rank);
  b.Linear(p + ".self_attn.kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim),
           c.kv_lora_rank);
  b.Linear(p + ".self_attn.o_proj.weight", D, H * c.v_head_dim);
  if (c.has_indexer()) {  // DeepSeek-V3.2's lightning indexer (its weights_proj stays bf16)
    const std::string indexer = p + ".self_attn.indexer";
    b.Linear(indexer + ".wq_b.weight", c.index_n_heads * c.index_head_dim, *c.q_lora_rank);
    b.Linear(indexer + ".wk.weight", c.index_head_dim, D);
    b.Norm(indexer + ".k_norm.weight", c.index_head_dim);
    b.Bias(indexer + ".k_norm.bias", c.index_head_dim);
    b.Matrix(indexer + ".weights_proj.weight", c.index_n_heads, D,
             1.0 / std::sqrt(static_cast<double>(D)), false);
  }
  b.Norm(p + ".post_attention_layernorm.weight", D);
  if (!c.IsMoeLayer(layer)) {
    AddFeedForward(b, p + ".mlp", c.intermediate_size, D);
    return;
  }
  b.Matrix(p + ".mlp.gate.weight", c.n_routed_experts, D, 1.0 / std::sqrt(static_cast<double>(D)),
           false);
  if (c.topk_method == TopkMethod::kNoauxTc)
    b.Bias(p + ".mlp.gate.e_score_correction_bias", c.n_routed_experts);
  for (int64_t e = 0; e < c.n_routed_experts; ++e)
    AddFeedForward(b, p + ".mlp.experts." + std::to_string(e), c.moe_intermediate_size, D);
  if (c.n_shared_experts > 0)
    AddFeedForward(b, p + ".mlp.shared_experts", c.shared_expert_width(), D);
}

}  // namespace

ModelConfig SmallModelConfig() {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = 4096;
  c.hidden_size = 512;
  c.intermediate_size = 1408;
  c.moe_intermediate_size = 192;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.n_shared_experts = 1;
  c.n_routed_experts = 32;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.q_lora_rank = 192;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.rope_theta = 10000;
  c.yarn = YarnScaling{40.0, 4096, 32.0, 1.0, 1.0, 1.0, std::nullopt};
  c.rms_norm_eps = 1e-6;
  c.num_nextn_predict_layers = 1;
  c.max_position_embeddings = 163840;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.fp8_weights = true;
  c.weight_block_rows = 128;
  c.weight_block_cols = 128;
  return c;
}

ModelConfig BenchModelConfig() {
  ModelConfig c = SmallModelConfig();
  c.vocab_size = 16384;
  c.hidden_size = 2048;
  c.intermediate_size = 5632;
  c.moe_intermediate_size = 768;
  c.num_hidden_layers = 10;
  c.num_attention_heads = c.num_key_value_heads = 16;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.q_lora_rank = 768;
  c.kv_lora_rank = 256;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 64;
  c.num_nextn_predict_layers = 0;
  return c;
}

ModelConfig DeepSeekV3Config() {
  ModelConfig c = SmallModelConfig();
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = 61;
  c.num_attention_heads = c.num_key_value_heads = 128;
  c.n_shared_experts = 1;
  c.n_routed_experts = 256;
  c.num_experts_per_tok = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.first_k_dense_replace = 3;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  return c;
}

Status WriteSyntheticCheckpoint(const ModelConfig& c, const std::string& directory,
                                const SyntheticOptions& options) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) return Status::Errorf("{}: cannot create directory: {}", directory, error.message());
  CheckpointBuilder b(c, options.seed);
  const int64_t D = c.hidden_size;
  b.Matrix("model.embed_tokens.weight", c.vocab_size, D, 1.0, false);
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer)
    AddDecoderLayer(b, c, layer);
  b.Norm("model.norm.weight", D);
  b.Matrix("lm_head.weight", c.vocab_size, D, 1.0 / std::sqrt(static_cast<double>(D)), false);
  for (int64_t i = 0; i < c.num_nextn_predict_layers; ++i) {
    const int64_t layer = c.num_hidden_layers + i;
    const std::string p = "model.layers." + std::to_string(layer);
    AddDecoderLayer(b, c, layer);
    b.Norm(p + ".enorm.weight", D);
    b.Norm(p + ".hnorm.weight", D);
    b.Matrix(p + ".eh_proj.weight", D, 2 * D, 1.0 / std::sqrt(2.0 * D), false);
    b.Norm(p + ".shared_head.norm.weight", D);
  }
  SY_RETURN_IF_ERROR(
      WriteSafetensors((fs::path(directory) / "model.safetensors").string(), b.tensors()));
  std::ofstream config_file(fs::path(directory) / "config.json");
  config_file << ModelConfigToJson(c);
  if (!config_file) return Status::Errorf("{}: cannot write config.json", directory);
  return Status::Ok();
}

}  // namespace sy
