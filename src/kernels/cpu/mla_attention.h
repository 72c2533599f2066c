// Multi-head latent attention over one sequence's cached latents, in DeepSeek's two forms.
// Both read the same cache rows: [c (latent, normalized) | k_pe (rope, rotated)].
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace sy::kernels {

struct MlaDims {
  int64_t heads = 0;
  int64_t nope = 0;    // qk_nope_head_dim
  int64_t rope = 0;    // qk_rope_head_dim
  int64_t v = 0;       // v_head_dim
  int64_t latent = 0;  // kv_lora_rank
  float softmax_scale = 0;
};

// q:         [tokens, heads, nope + rope]  queries, rope part already rotated
// positions: [tokens]                      absolute position of each query; query i attends to
//                                          cache rows j <= positions[i] (offset causal mask)
// latents:   [keys, latent + rope]         the sequence's cache rows, row j = position j
// kv_b:      [heads · (nope + v), latent]  kv_b_proj, head-major (k_nope rows, then v rows)
// out:       [tokens, heads · v]
//
// Expanded ("MHA") form: expands every cached latent into per-head keys and values with kv_b,
// as Hugging Face computes it. Best when many queries share the expansion (prefill).
void MlaAttendExpanded(const float* q, int64_t tokens, const int64_t* positions,
                       const float* latents, int64_t keys, const Matrix& kv_b, const MlaDims& dims,
                       float* out);

// The expanded form as flash attention, for prefill: keys are expanded with kv_b up to 256 at a
// time (fewer where heads are many) and folded in with an online softmax, so memory stays
// O(block · heads) instead of O(keys · heads), and each expanded block is reused by every query.
// Same result as MlaAttendExpanded up to rounding; a row's bits depend only on its query and the
// keys it sees, never on the other rows of the call.
void MlaAttendExpandedTiled(const float* q, int64_t tokens, const int64_t* positions,
                            const float* latents, int64_t keys, const Matrix& kv_b,
                            const MlaDims& dims, float* out);

// Absorbed form: folds W_UK into the query and W_UV into the output, so attention runs as MQA
// over the latents themselves (DeepSeek's inference/model.py). Best for decode.
void MlaAttendAbsorbed(const float* q, int64_t tokens, const int64_t* positions,
                       const float* latents, int64_t keys, const Matrix& kv_b, const MlaDims& dims,
                       float* out);

}  // namespace sy::kernels
