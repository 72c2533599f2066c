// Rotary-embedding frequencies (with YaRN) and the attention softmax scale, computed exactly
// as Hugging Face does (spec §5.5, §6), in f32 where HF uses f32.
#pragma once

#include <vector>

#include "model/config.h"

namespace sy {

struct RopeParams {
  std::vector<float> inv_freq;  // [qk_rope_head_dim / 2], ω' after YaRN blending
  float attention_factor = 1;   // multiplies cos and sin
  float softmax_scale = 0;      // dqk^-0.5, times mscale(factor, mscale_all_dim)² under YaRN
};

RopeParams ComputeRopeParams(const ModelConfig& config);

}  // namespace sy
