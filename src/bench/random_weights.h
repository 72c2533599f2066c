// Random weight matrices for benchmarks, generated fast (no checkpoint needed): fp8 bytes with
// block scales or bf16, owned by the Matrix and packed.
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace sy::bench {

// A packed [rows, cols] matrix of random values (fp8 with 128×128 block scales, or bf16).
Matrix RandomPackedMatrix(DType dtype, int64_t rows, int64_t cols, uint64_t seed);

}  // namespace sy::bench
