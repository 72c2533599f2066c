// Normalization, activation and rotary embedding on f32 rows.
#pragma once

#include <cstdint>

namespace sy::kernels {

// out[r] = x[r] / sqrt(mean(x[r]²) + eps) * weight, for each of `rows` rows of `width`.
// out may alias x. Rows are spread over the thread pool (not from inside a pool task).
void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out);
// Rows [begin, end) only, on the calling thread.
void RmsNormRows(const float* x, int64_t begin, int64_t end, int64_t width, const float* weight,
                 float eps, float* out);

// gate[i] = silu(gate[i]) * up[i], the SwiGLU product, in place over `count` elements.
void SiluMul(float* gate, const float* up, int64_t count);

// DeepSeek's pairwise rotary embedding (rope.cc) of one vector of `dim` elements at `position`:
// each pair (2i, 2i+1) is rotated by position·inv_freq[i], cos/sin scaled by
// attention_factor (YaRN's mscale ratio; 1 for DeepSeek-V3).
void RopePairwise(float* vector, int64_t dim, int64_t position, const float* inv_freq,
                  float attention_factor);

// RopePairwise in two steps, for many vectors at one position: the scaled cos and sin of each
// pair's angle (cos_sin[2i], cos_sin[2i + 1]), then the rotation. Same arithmetic.
void RopeTable(int64_t dim, int64_t position, const float* inv_freq, float attention_factor,
               float* cos_sin);
void ApplyRope(float* vector, int64_t dim, const float* cos_sin);

// out[i] = F32ToBF16(x[i]) (tensor/dtype.h) for `count` values: the same bits, vectorized.
void RoundToBf16(const float* x, int64_t count, uint16_t* out);
// out[i] = BF16ToF32(x[i]) for `count` values (exact), vectorized.
void WidenBf16(const uint16_t* x, int64_t count, float* out);

// In-place softmax of `count` values, computed in f32 with the maximum subtracted.
void Softmax(float* values, int64_t count);

}  // namespace sy::kernels
