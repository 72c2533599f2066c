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
  kAuto,      // expanded for sequences with more than kAbsorbedMaxQueries new tokens, else absorbed
  kExpanded,  // HF's form: expand cached latents with kv_b (prefill)
  kAbsorbed,  // DeepSeek's absorbed form over the latent cache (decode)
};

// Sequences with at most this many new tokens use the absorbed form under kAuto: a decode step,
// or an MTP verification step of query length 2.
inline constexpr int64_t kAbsorbedMaxQueries = 2;

// x:   [tokens, D] output of input_layernorm
// out: [tokens, D] attention output after o_proj
// Appends this layer's latent rows for every token to the sequences' caches (already reserved).
void MlaForward(const ModelConfig& config, const RopeParams& rope, const AttentionWeights& w,
                int64_t layer, const ForwardBatch& batch, const std::vector<int64_t>& positions,
                LatentCache& cache, AttentionForm form, const float* x, float* out);

}  // namespace sy
