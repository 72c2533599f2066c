// Random weight matrices for benchmarks, generated fast (no checkpoint needed): fp8 bytes with
// block scales or bf16, owned by the Matrix and packed.
#pragma once

#include <cstdint>

#include "tensor/matrix.h"

namespace sy::bench {

// A packed [rows, cols] matrix of random values (fp8 with 128×128 block scales, or bf16).
Matrix RandomPackedMatrix(DType dtype, int64_t rows, int64_t cols, uint64_t seed);

// A packed [rows, cols] matrix of random GGML blocks of `type` (Q4_K or Q6_K: random codes and
// sub-scales, half-precision scales of modest size), packed by PackGgml as a GGUF's would be.
Matrix RandomGgmlMatrix(GgmlType type, int64_t rows, int64_t cols, uint64_t seed);

}  // namespace sy::bench
