// Dense products against checkpoint weight matrices, f32 activations and accumulation.
// These are the straightforward multithreaded kernels; faster ones must match them.
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace sy::kernels {

// y[tokens, w.rows] = x[tokens, w.cols] · wᵀ   (a PyTorch Linear without bias)
void Linear(const float* x, int64_t tokens, const Matrix& w, float* y);

// y[tokens, w.cols] = x[tokens, w.rows] · w    (the weight used untransposed, as in absorbed
// MLA's q·W_UK)
void LinearTransposed(const float* x, int64_t tokens, const Matrix& w, float* y);

// f32 dot product with several partial sums, so the compiler can vectorize without -ffast-math.
float Dot(const float* a, const float* b, int64_t n);

}  // namespace sy::kernels
