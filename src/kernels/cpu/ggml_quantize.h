// The activation rows of GGML products quantized per block to int8 (QuantizeRowsQ8 in
// ggml_gemm.h lays out the Q8Rows and spreads rows over threads; these fill rows of it).
#pragma once

#include <cstdint>

#include "kernels/cpu/ggml_gemm.h"

namespace sy::kernels {

// Rows [first, last) of x [rows][out.cols] into `out`, whose layout fields and arrays are set:
// per block max|x|/127 as the scale and codes rounded half away from zero, per sub-block the
// codes' sum times out.offset. A block with NaN or ±inf gets a NaN scale, codes 0 and sums 0.
// The scalar form, for any block size.
void QuantizeRowRangeScalar(const float* x, int64_t first, int64_t last, Q8Rows& out);
// The same bits in vectors (Highway: the best target the ISA level allows), for blocks and
// sub-blocks that are whole multiples of 16 columns.
void QuantizeRowRangeVector(const float* x, int64_t first, int64_t last, Q8Rows& out);

}  // namespace sy::kernels
