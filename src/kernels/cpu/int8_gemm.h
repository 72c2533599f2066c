// Products against int8 weights (PackInt8) with activations quantized per row to bytes, for
// `--int8-products`: VPMADDUBSW and VPMADDWD sum four byte products per int32 lane, about twice
// the f32 FMA's work per cycle on CPUs without AVX-512 BF16 (measured on Zen 3: 54–59 against
// 27 GMAC/s per core in L1). Lossy by design; docs/benchmarks.md gives its accuracy.
//
// One arithmetic for every row, whatever the batch: a row's activations are quantized per group
// of kInt8GroupCols columns to code + 128 in [1, 255] with scale max |x| / 127; each group's
// integer sum is exact, so every tile shape gets the same int32, and the row's result is,
// group by group in column order, y = fma(float(sum − offset) · w_scale, x_scale, y). Rows are
// therefore bit-identical alone or in any batch, and the AVX2 kernel equals the portable one.
#pragma once

#include <cstdint>
#include <vector>

#include "base/allocator.h"
#include "tensor/packed_matrix.h"

namespace sy::kernels {

// Activations as the kernel takes them: codes [m][stride] (the first cols of each row used),
// scales [m][groups]. The stride is an odd number of cache lines: the kernel reads the same
// columns of every row at once, and with a stride of a multiple of 4 KiB (or 2 KiB: cols 2048)
// those lines would all fall in one or two L1 sets and evict each other.
struct Int8Rows {
  CacheLineVector<uint8_t> codes;  // tile loads read the rows (AMX int8)
  std::vector<float> scales;
  int64_t cols = 0;
  int64_t stride = 0;
  int64_t groups = 0;

  const uint8_t* Codes(int64_t row) const { return codes.data() + row * stride; }
  const float* Scales(int64_t row) const { return scales.data() + row * groups; }
};

// Quantizes rows [0, m) of x [m][cols]. A group holding NaN or ±inf gets a NaN scale, so the
// outputs it feeds are NaN rather than silently finite.
void QuantizeRowsInt8(const float* x, int64_t m, int64_t cols, Int8Rows& out);

// y[m, w.rows] = x · wᵀ for panels [panel_begin, panel_end); one thread. `codes` and `scales`
// point at the first of m rows of an Int8Rows (row strides `stride` and w.groups; its cols equal
// w.cols). w.dtype is kI8.
// From one tile of rows up it takes the AMX kernel where that runs (amx_kernels.h): the same bits.
void Int8Panels(const uint8_t* codes, int64_t stride, const float* scales, int64_t m,
                const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y);

// The kernels, slowest first; every one gives the same bits.
//  - kAvx2: VPMADDUBSW + VPMADDWD + VPADDD, 32 byte products per three instructions.
//  - kAvx512Vnni: VPDPBUSD on 512-bit vectors, 64 byte products per instruction (Intel since
//    Cascade Lake, AMD since Zen 4).
enum class Int8Kernel : uint8_t { kPortable, kAvx2, kAvx512Vnni };
// The fastest kernel this CPU runs. The AVX-512 VNNI kernel is used only after it gave the
// portable kernel's bits on a fixed problem the first time this is asked (else a warning on
// stderr and kAvx2).
Int8Kernel BestInt8Kernel();
// The kernel products use now: the best, or a lower one a test asked for.
Int8Kernel ActiveInt8Kernel();
// Tests: use at most `kernel` (kAvx512Vnni lifts the limit).
void LimitInt8Kernel(Int8Kernel kernel);
const char* Int8KernelName(Int8Kernel kernel);  // "int8", "int8-avx2", "int8-avx512vnni"
// Int8Panels on one vector kernel (this CPU must run it), never AMX: the AMX kernel's check.
void Int8PanelsOn(Int8Kernel kernel, const uint8_t* codes, int64_t stride, const float* scales,
                  int64_t m, const PackedMatrix& w, int64_t panel_begin, int64_t panel_end,
                  float* y);

}  // namespace sy::kernels
