// Products against packed weights, f32 activations and accumulation, written once with Highway
// and compiled for every SIMD target (SSE4, AVX2, AVX-512, NEON, SVE, scalar), chosen at run
// time. fp8 weights are decoded in registers (never expanded in memory): an e4m3 byte moved into
// f16 position is exactly the value / 256, so one f16→f32 conversion and the block scale × 256
// recover it.
#pragma once

#include <cstdint>

#include "tensor/packed_matrix.h"

namespace sy::kernels {

// y[m, w.rows] = x[m, w.cols] · wᵀ for panels [panel_begin, panel_end); one thread.
void PanelGemm(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
               int64_t panel_end, float* y);

// Panels [panel_begin, panel_end) of w (fp8, bf16 or f32) as a row-major [w.cols][out_stride]
// block whose column j is weight row row0 + j, for a library's matmul (onednn_linear.h): fp8
// times its block scale rounded once to f32 (each weight as the reference kernel has it); the
// bf16 form rounds that to nearest even.
void DequantizePanels(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, int64_t row0,
                      float* out, int64_t out_stride);
void DequantizePanels(const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, int64_t row0,
                      uint16_t* out, int64_t out_stride);

// Restricts run-time dispatch to one target (a HWY_* bit), for tests; 0 restores the best.
void ForcePanelGemmTarget(int64_t target);
// The Highway targets compiled into this binary and supported by this CPU.
std::vector<int64_t> PanelGemmTargets();
const char* TargetName(int64_t target);

}  // namespace sy::kernels
