// Products against packed fp8 or bf16 weights with bf16 dot products (VDPBF16PS: two products
// per f32 lane per instruction, twice the f32 FMA's work), for every batch size on CPUs with
// AVX-512 BF16 and VBMI (Zen 4 and later, Sapphire Rapids and later).
//
// One arithmetic for every row, whatever the batch: activations are rounded to bf16 once per
// row; fp8 weights are converted to bf16 exactly (a 128-entry table, VPERMI2B); for each scale
// block of columns one chain of VDPBF16PS in column order sums the block, and the row's result
// is fma(block sum, block scale, result so far), block by block. The decode-sized kernel (one or
// two rows, weights converted in registers, four panels streamed side by side) and the
// GEMM-sized one (panel pairs converted a column range at a time, tiles of up to 12 rows; fp8
// products of up to 16 rows converted in the tiles' registers instead) follow it to the bit, so a
// row's output never depends on how many rows share its product: decoding is batch-invariant, and a
// prompt recomputed after preemption gets decode's exact rows. bf16 weights laid out in pairs at
// load (PackedMatrix::bf16_pairs; `switchyard` does so where this kernel runs) are VDPBF16PS's
// operands as stored: both kernels read them in place, with the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/packed_matrix.h"

namespace sy::kernels {

// AVX-512 BF16 and AVX-512 VBMI (the table lookup) on this CPU.
bool HasBf16Dot();

// Whether `w` can take the kernel: fp8 with scale blocks of a multiple of 4 columns, or bf16;
// columns a multiple of 4. (CPU support is checked separately.)
bool Bf16DotApplies(const PackedMatrix& w);

// Rows of x rounded to bf16 (nearest even), [m][cols]; cols must be a multiple of 4.
void ToBf16RowsForDot(const float* x, int64_t m, int64_t cols, uint16_t* out);

// Panels [begin, end) of a matrix: the product a thread runs next, whose first columns the
// kernel fetches into L2 while it computes its last ones (w null: none).
struct NextPanels {
  const PackedMatrix* w = nullptr;
  int64_t begin = 0, end = 0;
};

// y[m, w.rows] = x · wᵀ for panels [panel_begin, panel_end); one thread. x_bf16 from
// ToBf16RowsForDot. Requires HasBf16Dot() and Bf16DotApplies(w). `next`: see NextPanels (a
// hint; it changes no result).
void Bf16DotPanels(const uint16_t* x_bf16, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                   int64_t panel_end, float* y, const NextPanels& next = {});

// Panels per unit of work for m rows: four side by side for one or two rows, else pairs.
int64_t Bf16DotPanelUnit(int64_t m);

}  // namespace sy::kernels
