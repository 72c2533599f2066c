#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"

namespace sy::kernels {

void RmsNorm(const float* x, int64_t rows, int64_t width, const float* weight, float eps,
             float* out) {
  // A batch's rows over the threads: each row's arithmetic is its own, so the split changes
  // nothing but the time (one decode step normalizes every row three times per layer).
  if (rows >= 2 && ThreadPool::Global().size() > 1) {
    ThreadPool::Global().ParallelFor(static_cast<size_t>(rows), [&](size_t begin, size_t end) {
      RmsNormRows(x, static_cast<int64_t>(begin), static_cast<int64_t>(end), width, weight, eps,
                  out);
    });
  } else {
    RmsNormRows(x, 0, rows, width, weight, eps, out);
  }
}

void RmsNormRows(const float* x, int64_t begin, int64_t end, int64_t width, const float* weight,
                 float eps, float* out) {
  for (int64_t r = begin; r < end; ++r) {
    const float* in = x + r * width;
    float* target = out + r * width;
    // Accumulate the mean square in double: a row of 7168 values should not lose bits here.
    double sum = 0;
    for (int64_t i = 0; i < width; ++i)
      sum += static_cast<double>(in[i]) * in[i];
    float inverse = 1.0f / std::sqrt(static_cast<float>(sum / width) + eps);
    for (int64_t i = 0; i < width; ++i)
      target[i] = in[i] * inverse * weight[i];
  }
}

void SiluMul(float* gate, const float* up, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void RopePairwise(float* vector, int64_t dim, int64_t position, const float* inv_freq,
                  float attention_factor) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    // The angle in f32 as HF computes it: position (as float) times the f32 frequency.
    float angle = static_cast<float>(position) * inv_freq[i];
    float c = std::cos(angle) * attention_factor, s = std::sin(angle) * attention_factor;
    float a = vector[2 * i], b = vector[2 * i + 1];
    vector[2 * i] = a * c - b * s;
    vector[2 * i + 1] = a * s + b * c;
  }
}

void RopeTable(int64_t dim, int64_t position, const float* inv_freq, float attention_factor,
               float* cos_sin) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    cos_sin[2 * i] = std::cos(angle) * attention_factor;
    cos_sin[2 * i + 1] = std::sin(angle) * attention_factor;
  }
}

void ApplyRope(float* vector, int64_t dim, const float* cos_sin) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
    const float a = vector[2 * i], b = vector[2 * i + 1];
    vector[2 * i] = a * c - b * s;
    vector[2 * i + 1] = a * s + b * c;
  }
}

void Softmax(float* values, int64_t count) {
  if (count == 0) return;
  float maximum = *std::max_element(values, values + count);
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    values[i] = std::exp(values[i] - maximum);
    sum += values[i];
  }
  float inverse = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < count; ++i)
    values[i] *= inverse;
}

}  // namespace sy::kernels
