// The compute-bound GEMM for prefill on CPUs with AVX-512 BF16 (Zen 4, Sapphire Rapids):
// activations rounded to bf16 once, weights decoded from their packed panels into bf16 pairs a
// cache-sized block at a time, and VDPBF16PS multiply-adds two products per lane into f32
// accumulators. Machines without AVX-512 BF16 use PanelGemm.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/packed_matrix.h"

namespace sy::kernels {

bool HasAvx512Bf16();

// x as bf16 pairs: [m][padded_cols] with padded_cols = cols rounded up to even, zero-padded.
std::vector<uint16_t> ToBf16Rows(const float* x, int64_t m, int64_t cols);

// y[m, w.rows] = x · wᵀ for panels [panel_begin, panel_end) (panel_begin even); one thread.
// x_bf16 comes from ToBf16Rows. Requires HasAvx512Bf16().
void Bf16Gemm(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w, int64_t panel_begin,
              int64_t panel_end, float* y);

}  // namespace sy::kernels
