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

// Restricts run-time dispatch to one target (a HWY_* bit), for tests; 0 restores the best.
void ForcePanelGemmTarget(int64_t target);
// The Highway targets compiled into this binary and supported by this CPU.
std::vector<int64_t> PanelGemmTargets();
const char* TargetName(int64_t target);

}  // namespace sy::kernels
