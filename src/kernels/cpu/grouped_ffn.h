// The grouped expert GEMM: every held expert's SwiGLU MLP over its rows, in one pass on all
// threads. Rows arrive sorted by expert ("init routing"); work items are (expert, panel) pairs
// split evenly over the threads: first gate and up together with SiLU(gate)·up fused into the
// same item, then down.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/packed_matrix.h"

namespace sy::kernels {

struct ExpertPanels {
  const PackedMatrix* gate = nullptr;  // [width, hidden]
  const PackedMatrix* up = nullptr;    // [width, hidden]
  const PackedMatrix* down = nullptr;  // [hidden, width]
};

// x:       [rows, hidden] sorted by expert
// offsets: [experts + 1]   rows of expert e are [offsets[e], offsets[e+1])
// experts: [experts]       null gate for experts not held here (their rows are left untouched)
// out:     [rows, hidden]
void GroupedExpertFfn(const float* x, const std::vector<int64_t>& offsets,
                      const std::vector<ExpertPanels>& experts, int64_t hidden, float* out);

}  // namespace sy::kernels
