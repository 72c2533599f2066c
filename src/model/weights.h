// The weights of a DeepSeek-V3-family model, named as in the spec and the checkpoint.
// Matrices are views into the memory-mapped checkpoint; norms and biases are small f32 copies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "tensor/matrix.h"

namespace sy {

struct AttentionWeights {
  std::vector<float> input_layernorm;  // [D]
  Matrix q_a_proj;                     // [q_lora_rank, D]        (q_lora variant)
  std::vector<float> q_a_layernorm;    // [q_lora_rank]
  Matrix q_b_proj;                     // [H·dqk, q_lora_rank]
  Matrix q_proj;                       // [H·dqk, D]              (no q_lora)
  Matrix kv_a_proj_with_mqa;           // [kv_lora_rank + dr, D]
  std::vector<float> kv_a_layernorm;   // [kv_lora_rank]
  Matrix kv_b_proj;                    // [H·(dn + dv), kv_lora_rank]
  Matrix o_proj;                       // [D, H·dv]
  // kv_b_proj split per head for the absorbed form, made at load time (PackWeights), packed only
  // (no row-major data): kv_b_proj's element type where its scale blocks allow, else f32; int8
  // under --int8-products.
  std::vector<Matrix> w_uk_t;  // [H] of [kv_lora_rank, dn]: q_abs = q_nope · W_UK = W_UKᵀ-as-Linear
  std::vector<Matrix> w_uv;  // [H] of [dv, kv_lora_rank]: O = W_UV · o_latent
  // A GGUF's attn_k_b [H·kv_lora_rank, dn] and attn_v_b [H·dv, kv_lora_rank] kept as GGML blocks:
  // per head, exactly W_UKᵀ and W_UV, which then multiply natively (dropped once packed).
  Matrix gguf_k_b, gguf_v_b;
  // DeepSeek-V3.2's lightning indexer (model/sparse_attention.h); empty in dense models, and in
  // an MTP layer stored without one (which then attends densely: it only drafts).
  Matrix indexer_wq_b;                     // [Hi·dI, q_lora_rank]
  Matrix indexer_wk;                       // [dI, D]
  std::vector<float> indexer_k_norm;       // [dI] LayerNorm weight
  std::vector<float> indexer_k_norm_bias;  // [dI]
  Matrix indexer_weights_proj;             // [Hi, D]
  bool has_indexer() const { return !indexer_wk.empty(); }
};

// One SwiGLU MLP: down(silu(gate(x)) · up(x)).
struct FeedForwardWeights {
  Matrix gate_proj;  // [width, D]
  Matrix up_proj;    // [width, D]
  Matrix down_proj;  // [D, width]
  bool empty() const { return gate_proj.empty(); }
};

struct MoeWeights {
  Matrix gate;                                 // router [E, D], never fp8
  std::vector<float> e_score_correction_bias;  // [E]; empty for V2-style gates
  std::vector<FeedForwardWeights> experts;     // [E]; empty entries for experts held elsewhere
  FeedForwardWeights shared_experts;           // width moe_intermediate_size · n_shared_experts
};

struct DecoderLayerWeights {
  AttentionWeights self_attn;
  std::vector<float> post_attention_layernorm;  // [D]
  bool is_moe = false;
  FeedForwardWeights mlp;  // dense layers
  MoeWeights moe;          // MoE layers
};

// A multi-token-prediction module (stored after the last main layer); loaded and kept for
// speculative decoding.
struct MtpWeights {
  Matrix embed_tokens;           // [vocab, D], the main embedding when not stored
  std::vector<float> enorm;      // [D]
  std::vector<float> hnorm;      // [D]
  Matrix eh_proj;                // [D, 2D]: columns [0, D) take the embedding, [D, 2D) the hidden
  std::vector<float> head_norm;  // shared_head.norm [D]
  Matrix head;                   // shared_head.head [vocab, D], lm_head when not stored
  DecoderLayerWeights block;
};

struct ModelWeights {
  Matrix embed_tokens;                      // [vocab, D]
  std::vector<DecoderLayerWeights> layers;  // num_hidden_layers
  std::vector<float> norm;                  // [D]
  Matrix lm_head;                           // [vocab, D]
  std::vector<MtpWeights> mtp;              // num_nextn_predict_layers
};

struct ExpertPlacement;  // model/expert_placement.h

struct WeightLoadOptions {
  // Routed experts [expert_begin, expert_end) are loaded; -1 means all of them.
  int64_t expert_begin = 0;
  int64_t expert_end = -1;
  // Or, when set, the experts of rank `placement_rank`'s slots in each MoE layer (not owned);
  // a MoE layer the placement does not name is an error.
  const ExpertPlacement* placement = nullptr;
  int placement_rank = 0;
  // Re-lay out the matrices for the fast kernels (Model::Load); off keeps the reference path.
  bool pack = true;
  // Tensor parallelism: this rank keeps attention heads [tp_rank·H/tp_size, (tp_rank+1)·H/tp_size).
  int tp_rank = 0;
  int tp_size = 1;
  // SP-TP-SP attention (the Huawei prefill recipe): q_b_proj (q_proj) and o_proj stay whole —
  // they run on this rank's token shard for every head — and only kv_b_proj and the absorbed
  // per-head matrices are split by heads.
  bool sequence_parallel_attention = false;
};

// Keeps only this rank's attention heads in every layer: q_b_proj (or q_proj) and kv_b_proj rows,
// the absorbed per-head matrices, and o_proj's columns. q_a, kv_a and the latent cache serve every
// head and stay whole (the seed's point about MLA under TP). keep_projections: q_b/q_proj and
// o_proj stay whole too (SP-TP-SP). GGML blocks (a GGUF's) stay blocks: row ranges always, o_proj's
// columns where they are whole blocks of its type; an o_proj whose shard cuts its blocks is decoded
// to f32, and the returned line says which and why (empty when none was).
std::string ShardAttentionHeads(const ModelConfig& config, int tp_rank, int tp_size,
                                bool keep_projections, ModelWeights& weights);

// Packs one decoder layer's matrices and splits its kv_b_proj per head (see PackWeights).
void PackDecoderLayer(const ModelConfig& config, DecoderLayerWeights& layer);

// Packs one routed expert's three matrices as the loader does.
void PackRoutedExpert(FeedForwardWeights& expert);

// Packs every matrix the forward pass multiplies by (tensor/packed_matrix.h), in place.
// Also splits kv_b_proj into per-head absorbed matrices, which needs the config's dimensions.
void PackWeights(const ModelConfig& config, ModelWeights& weights);

// Makes `moe` (MoE layer `layer`) hold exactly the routed experts in `experts`: those it lacks
// are loaded from the checkpoint (and packed with `pack`), the others dropped. Online expert
// rebalancing calls it; the checkpoint's pages must still be readable (a mapped file).
Status LoadRoutedExperts(const Checkpoint& checkpoint, const ModelConfig& config, int64_t layer,
                         const std::vector<int32_t>& experts, bool pack, MoeWeights& moe);

// Loads and checks every tensor the config calls for: presence, dtype, shape, fp8 block scales.
// Errors name the file and tensor. Tensors the model does not use are reported in `unused`.
Result<ModelWeights> LoadWeights(const Checkpoint& checkpoint, const ModelConfig& config,
                                 const WeightLoadOptions& options = {},
                                 std::vector<std::string>* unused = nullptr);

}  // namespace sy
