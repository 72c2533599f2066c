// Products against GGML blocks kept quantized (PackGgml: a GGUF's Q4_K, Q6_K, Q8_0... weights),
// as llama.cpp computes them: activations quantized per row to int8 (one scale per 256 columns
// for the K-quants, as its Q8_K; per 32 for Q4_0..Q8_0, as its Q8_0), integer dot products of
// codes within each sub-block, scaled by the sub-block's integer scale, and float only once per
// block.
//
// For weight row i, activation row x and block b (columns [b·B, (b+1)·B)), with sub-block code
// sums S_j = Σ_{c∈j} q_c · xq_c and activation sums X_j = Σ_{c∈j} xq_c (exact int32: VPDPBUSD of
// unsigned codes × signed activations, VPMULLD by the sub-block scales):
//   shared d (offset types):  t = d · float(Σ_j sc_j · (S_j − offset · X_j))
//   separate dmin:            t = fma(d, float(Σ_j sc_j · S_j), −(dmin · float(Σ_j mn_j · X_j)))
//   y = fma(t, xs_b, y)       blocks in column order
// Every kernel computes exactly this, so they give the same bits, and a row's result depends on
// nothing but its own activations: the same alone or in any batch.
//
// What it costs in accuracy: x_c is replaced by xs_b · xq_c, within xs_b / 2 of it (xs_b =
// max_b |x| / 127), so |y − Σ w_c x_c| ≤ Σ_b (xs_b / 2) Σ_{c∈b} |w_c| plus float rounding
// (tests/ggml_gemm_test.cc checks that bound).
#pragma once

#include <cstdint>
#include <vector>

#include "base/allocator.h"
#include "tensor/packed_matrix.h"

namespace sy::kernels {

// Activation rows quantized for one weight layout: codes [m][stride] (int8), scales
// [m][blocks], code sums [m][subs] (times the weights' offset for shared-d types).
struct Q8Rows {
  CacheLineVector<int8_t> codes;  // tile loads read the rows (AMX GGML)
  std::vector<float> scales;
  std::vector<int32_t> sums;
  int64_t cols = 0, stride = 0;
  int64_t block_cols = 0, sub_cols = 0, blocks = 0, subs = 0;
  int offset = 0;

  const int8_t* Codes(int64_t row) const { return codes.data() + row * stride; }
  const float* Scales(int64_t row) const { return scales.data() + row * blocks; }
  const int32_t* Sums(int64_t row) const { return sums.data() + row * subs; }
  bool Fits(const PackedMatrix& w) const {
    return cols == w.cols && block_cols == w.super_cols && sub_cols == w.sub_cols &&
           offset == ActivationOffset(w);
  }
  // What the code sums are multiplied by for `w`: its code offset where d is shared, else 1.
  static int ActivationOffset(const PackedMatrix& w) { return w.shared_d ? w.ggml_offset : 1; }
};

// Whether rows quantized for `a` serve products against `b` (and back): the same columns,
// blocks, sub-blocks and code-sum factor.
inline bool SameActivationLayout(const PackedMatrix& a, const PackedMatrix& b) {
  return a.cols == b.cols && a.super_cols == b.super_cols && a.sub_cols == b.sub_cols &&
         Q8Rows::ActivationOffset(a) == Q8Rows::ActivationOffset(b);
}

// Quantizes rows [0, m) of x [m][w.cols] for products against `w` (dtype kGgml). A block holding
// NaN or ±inf gets a NaN scale, so the outputs it feeds are NaN. `parallel`: rows spread over the
// thread pool (never from inside one of its workers: the pool is not reentrant).
void QuantizeRowsQ8(const float* x, int64_t m, const PackedMatrix& w, Q8Rows& out,
                    bool parallel = true);

// y[m, w.rows] = x · wᵀ for panels [panel_begin, panel_end), rows [first, first + m) of `x`; one
// thread. From one tile of rows up it takes the AMX kernel where that runs (amx_kernels.h): the
// same bits.
void GgmlPanels(const Q8Rows& x, int64_t first, int64_t m, const PackedMatrix& w,
                int64_t panel_begin, int64_t panel_end, float* y);

// The kernels, slowest first; each gives the same bits.
//  - kAvx2: VPMADDUBSW + VPMADDWD on 8-row halves of a panel (Haswell, Zen 1–3).
//  - kAvx512Vnni: VPDPBUSD on 512-bit vectors (Intel since Cascade Lake, AMD since Zen 4).
enum class GgmlKernel : uint8_t { kPortable, kAvx2, kAvx512Vnni };
GgmlKernel ActiveGgmlKernel();            // the best this CPU and --max-isa allow, or the limit
void LimitGgmlKernel(GgmlKernel kernel);  // tests: use at most `kernel`
const char* GgmlKernelName(GgmlKernel kernel);  // "ggml", "ggml-avx2", "ggml-avx512vnni"
// GgmlPanels on one vector kernel (this CPU must run it), never AMX: the AMX kernel's check.
void GgmlPanelsOn(GgmlKernel kernel, const Q8Rows& x, int64_t first, int64_t m,
                  const PackedMatrix& w, int64_t panel_begin, int64_t panel_end, float* y);

}  // namespace sy::kernels
