#include "kernels/cpu/fast_linear.h"

#include "base/thread_pool.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/panel_gemm.h"

namespace sy::kernels {

KernelOptions& GlobalKernelOptions() {
  static KernelOptions options;
  return options;
}

bool UseBf16Gemm(int64_t m, const PackedMatrix& w) {
  const KernelOptions& options = GlobalKernelOptions();
  return options.allow_bf16_gemm && m >= options.bf16_gemm_min_rows && HasAvx512Bf16() &&
         (w.dtype != DType::kF8E4M3 || w.block_cols % 2 == 0);
}

void LinearPanels(const float* x, const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                  int64_t panel_begin, int64_t panel_end, float* y) {
  if (x_bf16 != nullptr) {
    Bf16Gemm(x_bf16, m, w, panel_begin, panel_end, y);
  } else {
    PanelGemm(x, m, w, panel_begin, panel_end, y);
  }
}

void LinearPacked(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  if (m == 0) return;
  std::vector<uint16_t> x_bf16;
  const bool bf16 = UseBf16Gemm(m, w);
  if (bf16) x_bf16 = ToBf16Rows(x, m, w.cols);
  // The bf16 kernel works on pairs of panels; split on pair boundaries.
  const int64_t unit = bf16 ? 2 : 1;
  const int64_t units = (w.panels + unit - 1) / unit;
  ThreadPool::Global().ParallelFor(static_cast<size_t>(units), [&](size_t begin, size_t end) {
    const int64_t panel_begin = static_cast<int64_t>(begin) * unit;
    const int64_t panel_end = std::min<int64_t>(w.panels, static_cast<int64_t>(end) * unit);
    LinearPanels(x, bf16 ? x_bf16.data() : nullptr, m, w, panel_begin, panel_end, y);
  });
}

void LinearAuto(const float* x, int64_t m, const Matrix& w, float* y) {
  if (w.packed) {
    LinearPacked(x, m, *w.packed, y);
  } else {
    Linear(x, m, w, y);
  }
}

}  // namespace sy::kernels
