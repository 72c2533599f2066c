#include "kernels/cpu/linear.h"

#include <algorithm>
#include <vector>

#include "base/thread_pool.h"

namespace sy::kernels {

float Dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      partial[j] += a[i + j] * b[i + j];
  float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
              ((partial[4] + partial[5]) + (partial[6] + partial[7]));
  for (; i < n; ++i)
    sum += a[i] * b[i];
  return sum;
}

void Linear(const float* x, int64_t tokens, const Matrix& w, float* y) {
  if (tokens == 0 || w.rows == 0) return;
  const int64_t out = w.rows, in = w.cols;
  ThreadPool::Global().ParallelFor(static_cast<size_t>(out), [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(in));
    for (size_t o = begin; o < end; ++o) {
      w.DecodeRow(static_cast<int64_t>(o), row.data());
      for (int64_t t = 0; t < tokens; ++t)
        y[t * out + o] = Dot(x + t * in, row.data(), in);
    }
  });
}

void LinearTransposed(const float* x, int64_t tokens, const Matrix& w, float* y) {
  if (tokens == 0 || w.cols == 0) return;
  const int64_t in = w.rows, out = w.cols;
  // Split the output columns so each thread decodes its own part of every row once.
  ThreadPool::Global().ParallelFor(static_cast<size_t>(out), [&](size_t begin, size_t end) {
    const int64_t width = static_cast<int64_t>(end - begin);
    std::vector<float> row(static_cast<size_t>(width));
    for (int64_t t = 0; t < tokens; ++t)
      std::fill_n(y + t * out + begin, width, 0.0f);
    for (int64_t r = 0; r < in; ++r) {
      w.DecodeRow(r, static_cast<int64_t>(begin), static_cast<int64_t>(end), row.data());
      for (int64_t t = 0; t < tokens; ++t) {
        const float scale = x[t * in + r];
        float* target = y + t * out + begin;
        for (int64_t c = 0; c < width; ++c)
          target[c] += scale * row[c];
      }
    }
  });
}

}  // namespace sy::kernels
