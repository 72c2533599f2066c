// The grouped expert GEMM: every held expert's SwiGLU MLP over its rows, in one pass on all
// threads. Rows arrive sorted by expert ("init routing"); work items are (expert, panel) pairs
// split evenly over the threads: first gate and up together with SiLU(gate)·up fused into the
// same item, then down.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/amx_kernels.h"
#include "tensor/packed_matrix.h"

namespace sy::kernels {

struct ExpertPanels {
  const PackedMatrix* gate = nullptr;  // [width, hidden]
  const PackedMatrix* up = nullptr;    // [width, hidden]
  const PackedMatrix* down = nullptr;  // [hidden, width]
};

// x:       [rows, hidden] sorted by expert, or with source_rows, the rows they come from
// offsets: [experts + 1]   rows of expert e are [offsets[e], offsets[e+1])
// experts: [experts]       null gate for experts not held here (their rows are left untouched)
// out:     [rows, hidden]
// source_rows: [rows]      null, or row i of the batch is x's row source_rows[i] (a token's row
//                          for each of its experts, unsorted): the f32 rows are then copied in
//                          expert order only where a path reads them (the AMX path rounds each
//                          to bf16 straight from x).
// routed_sum: null, or where the batch's rows are summed per token (AmxRoutedRows, over the
//                          whole batch: row i weighs weight[i] into out's row token[i]): on the
//                          fused AMX path the down products add themselves there, expert by
//                          expert in ascending order over each thread's columns, and `out` is not
//                          written. Returns whether it did (else `out` holds the rows). From
//                          1,024 rows the threads' column shares are sized by the speed each
//                          ran at in earlier calls (grouped_ffn.cc); the bits never depend on
//                          them.
bool GroupedExpertFfn(const float* x, const std::vector<int64_t>& offsets,
                      const std::vector<ExpertPanels>& experts, int64_t hidden, float* out,
                      const int64_t* source_rows = nullptr,
                      const AmxRoutedRows* routed_sum = nullptr);

// Tests: the routed pass's measured costs per share (relative; one per thread), as if earlier
// calls had found them, so that its shares come out unequal.
void SetRoutedShareCostsForTesting(const std::vector<double>& costs);

}  // namespace sy::kernels
