// The MLA block of one decoder layer over a ragged batch: projections, latent normalization,
// RoPE, appending the latent cache, attention in the chosen form, o_proj.
#pragma once

#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/latent_cache.h"
#include "model/rope.h"
#include "model/weights.h"

namespace sy {

enum class AttentionForm {
  kAuto,      // by each row's role and position: absorbed for generated tokens
              // (SequenceCache::prompt_end), and where the bf16 MLA kernel runs for prompt
              // positions whose query sees kAbsorbedPromptKeys keys or more; else expanded
  kExpanded,  // HF's form: expand cached latents with kv_b (prefill)
  kAbsorbed,  // DeepSeek's absorbed form over the latent cache (decode)
};

// A slice with at most this many new tokens is a decode step (absorbed under kAuto) where its
// sequence's role is unknown (SequenceCache::prompt_end < 0): one token, or an MTP verification
// step of query length 1 + K (K ≤ 8 draft tokens). For so few queries attending straight from
// the latent cache beats expanding every cached row with kv_b.
inline constexpr int64_t kAbsorbedMaxQueries = 9;
// Under kAuto, where the bf16 MLA decode kernel runs (a bf16 cache on a CPU with AVX-512 BF16),
// prompt rows whose query sees this many keys take the absorbed form as well. Measured again on
// Zen 4 against the flash-attention expanded kernel (`bench kernels`' mla_prefill rows,
// docs/benchmarks.md): a fresh 512-token prompt is 1.12x faster expanded, a 32-token turn after
// 1,024 cached keys 4.6x faster absorbed, and a row's form may depend only on its position.
inline constexpr int64_t kAbsorbedPromptKeys = 384;

// The block in its phases, for schedules that exchange between them (SP-TP-SP attention):
// Projections of `tokens` rows x [tokens, D]: q [tokens, H, qk_head_dim] with RoPE applied, and
// cache rows [tokens, config.cache_row_width()] (c normalized, k_pe rotated, and in a DSA model
// the indexer's key), ready for the cache. H is config.num_attention_heads (q_b_proj must hold
// that many heads). Where the layer has an indexer, index_queries [tokens,
// IndexerQueryWidth(config)] receives its queries (model/sparse_attention.h); else it is unused.
void MlaProject(const ModelConfig& config, const RopeParams& rope, const AttentionWeights& w,
                int64_t tokens, const int64_t* positions, const float* x, float* q,
                float* latent_rows, float* index_queries);
// Appends the batch's latent rows [batch.size(), width] to this layer of the cache.
void MlaWriteCache(const ModelConfig& config, int64_t layer, const ForwardBatch& batch,
                   const float* latent_rows, LatentCache& cache);
// Attention of the batch's queries q [T, H, qk_head_dim] over the cache (this layer's rows for
// the batch already written): heads_out [T, H, v_head_dim], before o_proj. With index_queries
// (a DSA layer: MlaProject's), queries at positions ≥ index_topk attend to the keys their
// indexer picks, in the absorbed form; nullptr: dense.
void MlaAttend(const ModelConfig& config, const RopeParams& rope, const AttentionWeights& w,
               int64_t layer, const ForwardBatch& batch, const std::vector<int64_t>& positions,
               const LatentCache& cache, AttentionForm form, const float* q,
               const float* index_queries, float* heads_out);

// The whole block:
// x:   [tokens, D] output of input_layernorm
// out: [tokens, D] attention output after o_proj
// Appends this layer's latent rows for every token to the sequences' caches (already reserved).
void MlaForward(const ModelConfig& config, const RopeParams& rope, const AttentionWeights& w,
                int64_t layer, const ForwardBatch& batch, const std::vector<int64_t>& positions,
                LatentCache& cache, AttentionForm form, const float* x, float* out);

}  // namespace sy
