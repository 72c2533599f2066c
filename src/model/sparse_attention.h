// DeepSeek-V3.2's sparse attention (DSA) on top of MLA. Each layer has a lightning indexer: a
// small multi-head projection whose single key per token is cached beside the latent row
// (ModelConfig::cache_row_width) and whose queries score every earlier key,
//   score(t, j) = Σ_h w_h(x_t) · relu(q_h(t) · k_j) / √(index_head_dim · index_n_heads),
// and each query attends to its index_topk best keys only. A query seeing index_topk keys or
// fewer sees them all: there DSA is dense MLA exactly, and no scores are computed. The chosen
// keys are read in place: the absorbed kernels walk a page table of one row per chosen key.
#pragma once

#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/latent_cache.h"
#include "model/rope.h"
#include "model/weights.h"

namespace sy {

// Values per token of the indexer's query buffer: index_n_heads query vectors of index_head_dim,
// then the index_n_heads head weights (the score's scales folded in).
inline int64_t IndexerQueryWidth(const ModelConfig& c) {
  return c.index_n_heads * (c.index_head_dim + 1);
}

// The indexer's projections of `tokens` rows.
// x:       [tokens, D], the layer's input_layernorm output
// cq:      [tokens, q_lora_rank], q_a_layernorm(q_a_proj(x))
// keys:    each token's key written at keys + t · key_stride (the cache row's tail):
//          LayerNorm(wk · x), its first qk_rope_head_dim values rotated in halves (HF's
//          rotate_half, where MLA's own RoPE rotates pairs)
// queries: [tokens, IndexerQueryWidth]
void IndexerProject(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
                    int64_t tokens, const int64_t* positions, const float* x, const float* cq,
                    float* keys, int64_t key_stride, float* queries);

// One query that attends sparsely: its row in the batch, its position, and the positions of the
// index_topk keys it attends to, ascending (ties in score go to the earlier key).
struct SparseQuery {
  int64_t token = 0;
  int64_t position = 0;
  size_t sequence = 0;  // its slice in the batch
  std::vector<int32_t> keys;
};

// The positions of the `topk` best of scores[0, count) (0 < topk < count), ascending: higher
// score first, the earlier key on a tie, NaN last. `scratch` is working space.
void ChooseTopKeys(const float* scores, int64_t count, int64_t topk, std::vector<float>& scratch,
                   std::vector<int32_t>& chosen);

// The batch's queries at positions ≥ index_topk (the others attend to every key), with their
// keys chosen from this layer's cached indexer keys (the batch's rows already written).
// queries: [batch.size(), IndexerQueryWidth] from IndexerProject.
std::vector<SparseQuery> SelectSparseKeys(const ModelConfig& c, int64_t layer,
                                          const ForwardBatch& batch,
                                          const std::vector<int64_t>& positions,
                                          const LatentCache& cache, const float* queries);

}  // namespace sy
