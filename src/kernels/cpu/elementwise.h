// Normalization, activation and rotary embedding on f32 rows.
#pragma once

#include <cstdint>

namespace sy::kernels {

// out[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight, for each of `rows` rows of `width`.
// out may alias x.
void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out);

// gate[i] = silu(gate[i]) * up[i], the SwiGLU product, in place over `count` elements.
void SiluMul(float* gate, const float* up, int64_t count);

// DeepSeek's pairwise rotary embedding of one vector of `dim` elements at `position`:
// each pair (2i, 2i+1) is rotated by position·inv_freq[i], cos/sin scaled by
// attention_factor (YaRN's mscale ratio; 1 for DeepSeek-V3).
void RopePairwise(float* vector, int64_t dim, int64_t position, const float* inv_freq,
                  float attention_factor);

// In-place softmax of `count` values, computed in f32 with the maximum subtracted.
void Softmax(float* values, int64_t count);

}  // namespace sy::kernels
