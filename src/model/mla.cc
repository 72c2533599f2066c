#include "model/mla.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/mla_attention.h"

namespace sy {
namespace {

// q_a_layernorm and kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says (HF and reference).
constexpr float kLatentNormEps = 1e-6f;

}  // namespace

void MlaForward(const ModelConfig& c, const RopeParams& rope, const AttentionWeights& w,
                int64_t layer, const ForwardBatch& batch, const std::vector<int64_t>& positions,
                LatentCache& cache, AttentionForm form, const float* x, float* out) {
  const int64_t T = batch.size(), H = c.num_attention_heads, dqk = c.qk_head_dim();
  const int64_t latent = c.kv_lora_rank, dr = c.qk_rope_head_dim, row = c.latent_cache_width();

  // Queries: q = q_b(rmsnorm(q_a(x))) or q_proj(x); [T, H, dqk], rope on the last dr of each head.
  std::vector<float> q(static_cast<size_t>(T * H * dqk));
  if (c.q_lora_rank) {
    const int64_t rq = *c.q_lora_rank;
    std::vector<float> cq(static_cast<size_t>(T * rq));
    kernels::LinearAuto(x, T, w.q_a_proj, cq.data());
    kernels::RmsNorm(cq.data(), T, rq, w.q_a_layernorm.data(), kLatentNormEps, cq.data());
    kernels::LinearAuto(cq.data(), T, w.q_b_proj, q.data());
  } else {
    kernels::LinearAuto(x, T, w.q_proj, q.data());
  }
  // Latent rows: [c | k_pe] = kv_a(x); c normalized, k_pe rotated, then cached.
  std::vector<float> latent_rows(static_cast<size_t>(T * row));
  kernels::LinearAuto(x, T, w.kv_a_proj_with_mqa, latent_rows.data());
  for (int64_t t = 0; t < T; ++t) {
    float* r = latent_rows.data() + t * row;
    kernels::RmsNorm(r, 1, latent, w.kv_a_layernorm.data(), kLatentNormEps, r);
    kernels::RopePairwise(r + latent, dr, positions[t], rope.inv_freq.data(), rope.attention_factor);
    for (int64_t h = 0; h < H; ++h)
      kernels::RopePairwise(q.data() + (t * H + h) * dqk + c.qk_nope_head_dim, dr, positions[t],
                            rope.inv_freq.data(), rope.attention_factor);
  }
  for (const auto& seq : batch.sequences)
    for (int64_t i = 0; i < seq.token_count; ++i)
      cache.Write(layer, *seq.cache, seq.start_position + i,
                  latent_rows.data() + (seq.token_offset + i) * row);

  const kernels::MlaDims dims{H, c.qk_nope_head_dim, dr, c.v_head_dim, latent, rope.softmax_scale};
  std::vector<float> heads_out(static_cast<size_t>(T * H * c.v_head_dim));
  std::vector<float> latents;
  for (const auto& seq : batch.sequences) {
    const int64_t keys = seq.start_position + seq.token_count;
    latents.resize(static_cast<size_t>(keys * row));
    cache.Gather(layer, *seq.cache, keys, latents.data());
    bool absorbed = form == AttentionForm::kAbsorbed ||
                    (form == AttentionForm::kAuto && seq.token_count <= kAbsorbedMaxQueries);
    auto attend = absorbed ? kernels::MlaAttendAbsorbed : kernels::MlaAttendExpanded;
    attend(q.data() + seq.token_offset * H * dqk, seq.token_count,
           positions.data() + seq.token_offset, latents.data(), keys, w.kv_b_proj, dims,
           heads_out.data() + seq.token_offset * H * c.v_head_dim);
  }
  kernels::LinearAuto(heads_out.data(), T, w.o_proj, out);
}

}  // namespace sy
