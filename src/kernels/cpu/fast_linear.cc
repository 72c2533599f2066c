#include "kernels/cpu/fast_linear.h"

#include <algorithm>
#include "base/allocator.h"
#include "base/thread_pool.h"

#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/ggml_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/panel_gemm.h"

namespace sy::kernels {

KernelOptions& GlobalKernelOptions() {
  static KernelOptions options;
  return options;
}

namespace {
thread_local bool decode_step = false;
}  // namespace

DecodeStepScope::DecodeStepScope(bool active) : previous_(decode_step) {
  decode_step = decode_step || active;
}
DecodeStepScope::~DecodeStepScope() {
  decode_step = previous_;
}

bool UseBf16Dot(const PackedMatrix& w) {
  return GlobalKernelOptions().bf16_dot && HasBf16Dot() && Bf16DotApplies(w);
}

bool UseBf16Gemm(int64_t m, const PackedMatrix& w) {
  const KernelOptions& options = GlobalKernelOptions();
  if (UseAmxBf16(w)) return false;
  // Where the dot kernel runs, f32 weights (the router) keep f32 products at every row count,
  // so rows stay independent of the batch.
  if (options.bf16_dot && HasBf16Dot()) return false;
  return w.dtype != DType::kI8 && w.dtype != DType::kGgml && !decode_step &&
         options.allow_bf16_gemm && m >= options.bf16_gemm_min_rows && HasAvx512Bf16() &&
         (w.dtype != DType::kF8E4M3 || w.block_cols % 2 == 0);
}

const char* KernelPathName(int64_t m, const PackedMatrix& w) {
  const bool emulated = ActiveAmxBackend() == AmxBackend::kEmulated;
  if (w.dtype == DType::kI8) {
    if (UseAmxInt8(m, w)) return emulated ? "int8-amx-emulated" : "int8-amx";
    return Int8KernelName(ActiveInt8Kernel());
  }
  if (w.dtype == DType::kGgml) {
    if (UseAmxGgml(m, w)) return emulated ? "ggml-amx-emulated" : "ggml-amx";
    return GgmlKernelName(ActiveGgmlKernel());
  }
  if (UseAmxBf16(w)) return emulated ? "amx-bf16-emulated" : "amx-bf16";
  if (UseBf16Dot(w)) return "bf16-dot";
  return UseBf16Gemm(m, w) ? "avx512-bf16" : "panel-f32";
}

namespace {

// Each of m rows of x as three bf16 parts that add up to it exactly: part p of row r at
// parts + (p · m + r) · stride, each value rounded by round(values, cols, out) (the kernel's own
// rounding), then what it left, then the rest, which bf16 holds exactly (at most 8 significant
// bits remain).
template <typename Round>
void SplitIntoThreeParts(const float* x, int64_t m, int64_t cols, int64_t stride, Round round,
                         uint16_t* parts) {
  thread_local std::vector<float> left;
  left.resize(static_cast<size_t>(cols));
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * cols;
    uint16_t* part = parts + r * stride;
    round(row, cols, part);
    for (int64_t c = 0; c < cols; ++c)
      left[c] = row[c] - BF16ToF32(part[c]);
    part += m * stride;
    round(left.data(), cols, part);
    for (int64_t c = 0; c < cols; ++c)
      left[c] -= BF16ToF32(part[c]);
    round(left.data(), cols, part + m * stride);
  }
}

// y's columns of panels [panel_begin, panel_end) from the products of three bf16 parts of each
// of m rows (sums: [3m][w.rows], the high parts' rows first): (hi + mid) + lo.
void AddThreeParts(const float* sums, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                   int64_t panel_end, float* y) {
  const int64_t c0 = panel_begin * kPanelRows, c1 = std::min(w.rows, panel_end * kPanelRows);
  for (int64_t r = 0; r < m; ++r) {
    const float* hi = sums + r * w.rows;
    const float* mid = hi + m * w.rows;
    const float* lo = mid + m * w.rows;
    for (int64_t c = c0; c < c1; ++c)
      y[r * w.rows + c] = (hi[c] + mid[c]) + lo[c];
  }
}

// x to f32 accuracy against panels of bf16 pairs through the dot kernel: each row split into
// three bf16 parts that add up to it exactly, as for the tiles (LinearPanelsF32), the 3m rows
// multiplied together and each row's three results added. (The dot instruction takes a part
// below bf16's normal range, |x| < 2^-126 of a float, as zero.)
void PairsF32ThroughTheDotKernel(const float* x, int64_t m, const PackedMatrix& w,
                                 int64_t panel_begin, int64_t panel_end, float* y) {
  const int64_t cols = w.cols;
  thread_local std::vector<uint16_t> parts;
  thread_local std::vector<float> sums;
  parts.resize(std::max(parts.size(), static_cast<size_t>(3 * m * cols)));
  SplitIntoThreeParts(
      x, m, cols, cols,
      [](const float* v, int64_t n, uint16_t* out) { ToBf16RowsForDot(v, 1, n, out); },
      parts.data());
  sums.resize(std::max(sums.size(), static_cast<size_t>(3 * m * w.rows)));
  Bf16DotPanels(parts.data(), 3 * m, w, panel_begin, panel_end, sums.data());
  AddThreeParts(sums.data(), m, w, panel_begin, panel_end, y);
}

}  // namespace

void LinearPanels(const float* x, const uint16_t* x_bf16, int64_t m, const PackedMatrix& w,
                  int64_t panel_begin, int64_t panel_end, float* y) {
  if (w.dtype == DType::kGgml) {  // quantized here, for callers with few rows (per-head products)
    thread_local Q8Rows rows;
    QuantizeRowsQ8(x, m, w, rows, /*parallel=*/false);
    GgmlPanels(rows, 0, m, w, panel_begin, panel_end, y);
    return;
  }
  if (w.bf16_pairs && !UseAmxBf16(w)) {  // the dot kernel's: bf16 activations, as on the tiles
    thread_local std::vector<uint16_t> rows;
    if (x_bf16 == nullptr) {
      rows.resize(static_cast<size_t>(m * w.cols));
      ToBf16RowsForDot(x, m, w.cols, rows.data());
      x_bf16 = rows.data();
    }
    return Bf16DotPanels(x_bf16, m, w, panel_begin, panel_end, y);
  }
  if (w.bf16_pairs) {  // the AMX kernel's; one thread, as the others here
    thread_local CacheLineVector<uint16_t> rows;
    rows.resize(std::max(rows.size(), static_cast<size_t>(AmxBf16Elements(m, w.cols))));
    AmxToBf16Rows(ActiveAmxBackend(), x, m, w.cols, rows.data());
    AmxBf16Panels(ActiveAmxBackend(), rows.data(), m, w, panel_begin, panel_end, y);
    return;
  }
  if (x_bf16 != nullptr) {
    Bf16Gemm(x_bf16, m, w, panel_begin, panel_end, y);
  } else {
    PanelGemm(x, m, w, panel_begin, panel_end, y);
  }
}

void LinearPanelsF32(const float* x, int64_t m, const PackedMatrix& w, int64_t panel_begin,
                     int64_t panel_end, float* y) {
  if (!w.bf16_pairs || m <= 0) return LinearPanels(x, nullptr, m, w, panel_begin, panel_end, y);
  if (!UseAmxBf16(w)) return PairsF32ThroughTheDotKernel(x, m, w, panel_begin, panel_end, y);
  const AmxBackend backend = ActiveAmxBackend();
  const int64_t cols = w.cols, stride = AmxBf16RowStride(cols);
  // Parts [0, m), [m, 2m), [2m, 3m) as tile rows. Thread-local: a worker's per-head products
  // call this once a head.
  thread_local CacheLineVector<uint16_t> parts;
  thread_local std::vector<float> sums;
  parts.resize(std::max(parts.size(), static_cast<size_t>(AmxBf16Elements(3 * m, cols))));
  SplitIntoThreeParts(
      x, m, cols, stride,
      [backend](const float* v, int64_t n, uint16_t* out) { AmxToBf16Row(backend, v, n, out); },
      parts.data());
  // The rows past 3m that tile loads read.
  std::fill(parts.data() + 3 * m * stride, parts.data() + AmxBf16Elements(3 * m, cols),
            uint16_t{0});
  sums.resize(std::max(sums.size(), static_cast<size_t>(3 * m * w.rows)));
  AmxBf16Panels(backend, parts.data(), 3 * m, w, panel_begin, panel_end, sums.data());
  AddThreeParts(sums.data(), m, w, panel_begin, panel_end, y);
}

// Split-K: a matrix with too few panels to keep the threads busy (a router: DeepSeek-V3's has 16
// panels, the bench model's one) has its columns split into fixed chunks, each summed into its own
// buffer by whichever thread takes it, and the chunks added in order. Whether and where to split
// depends on the matrix alone, never on m or the thread count: a row's sums are then the same
// whatever the batch and however many threads run it.
static bool SplitK(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  constexpr int64_t kMostPanels = 4, kChunkColumns = 512;
  const int64_t align = w.dtype == DType::kF8E4M3 ? w.block_cols : 64;
  const int64_t chunk = (kChunkColumns + align - 1) / align * align;
  if (w.panels > kMostPanels || w.cols < 2 * chunk) return false;
  const int64_t parts = (w.cols + chunk - 1) / chunk;
  std::vector<std::vector<float>> partial(static_cast<size_t>(parts));
  ThreadPool::Global().ParallelFor(static_cast<size_t>(parts), [&](size_t begin, size_t end) {
    for (size_t part = begin; part < end; ++part) {
      const int64_t c0 = static_cast<int64_t>(part) * chunk;
      const int64_t c1 = std::min(w.cols, c0 + chunk);
      partial[part].assign(static_cast<size_t>(m * w.rows), 0.0f);
      std::vector<float> slice(static_cast<size_t>(m * (c1 - c0)));  // x's columns, contiguous
      for (int64_t t = 0; t < m; ++t)
        std::copy_n(x + t * w.cols + c0, c1 - c0, slice.begin() + t * (c1 - c0));
      const PackedMatrix view = ColumnRange(w, c0, c1);
      PanelGemm(slice.data(), m, view, 0, view.panels, partial[part].data());
    }
  });
  for (int64_t i = 0; i < m * w.rows; ++i) {
    float sum = 0;
    for (const auto& p : partial)
      sum += p[i];
    y[i] = sum;
  }
  return true;
}

void LinearF32(const float* x, int64_t m, const Matrix& w, float* y) {
  if (m == 0) return;
  if (!w.packed) {
    Linear(x, m, w, y);
    return;
  }
  const PackedMatrix& p = *w.packed;
  if (p.dtype == DType::kI8) {  // only the int8 kernel reads these (a router never is: exact)
    LinearPacked(x, m, p, y);
    return;
  }
  // Rows a call at most: on bf16 pairs LinearPanelsF32 keeps three bf16 parts of each row in a
  // thread's buffer (3 · 64 rows of DeepSeek-V3's 7,168 columns: 2.6 MiB).
  constexpr int64_t kRows = 64;
  const int64_t blocks = (m + kRows - 1) / kRows;
  auto run = [&](int64_t block_begin, int64_t block_end, int64_t panel_begin, int64_t panel_end) {
    for (int64_t b = block_begin; b < block_end; ++b) {
      const int64_t r0 = b * kRows;
      LinearPanelsF32(x + r0 * p.cols, std::min(kRows, m - r0), p, panel_begin, panel_end,
                      y + r0 * p.rows);
    }
  };
  ThreadPool& pool = ThreadPool::Global();
  if (p.panels >= pool.size() && blocks < pool.size()) {
    pool.ParallelFor(static_cast<size_t>(p.panels), [&](size_t begin, size_t end) {
      run(0, blocks, static_cast<int64_t>(begin), static_cast<int64_t>(end));
    });
  } else {
    pool.ParallelForIf(blocks > 1, static_cast<size_t>(blocks), [&](size_t begin, size_t end) {
      run(static_cast<int64_t>(begin), static_cast<int64_t>(end), 0, p.panels);
    });
  }
}

bool& SplitKEnabled() {
  static bool enabled = true;
  return enabled;
}

static void LinearPackedOwn(const float* x, int64_t m, const PackedMatrix& w, float* y);

void LinearPacked(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  if (m == 0) return;
  // Prefill-sized products may go to oneDNN where it is faster (onednn_linear.h). Not in decode
  // steps or batch-invariant runs: oneDNN's blocking, and so a row's bits, depend on m.
  if (m >= kOnednnMinRows && w.dtype != DType::kI8 && w.dtype != DType::kGgml && !decode_step &&
      GlobalKernelOptions().allow_bf16_gemm &&
      RunPrefillLinear(x, m, w, y, [&] { LinearPackedOwn(x, m, w, y); }))
    return;
  LinearPackedOwn(x, m, w, y);
}

static void LinearPackedOwn(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  if (w.dtype == DType::kI8) {
    // Reused: decode calls this hundreds of times a step. (By pointer: the workers must see the
    // caller's buffers, not their own thread_local ones.)
    thread_local Int8Rows buffers;
    const Int8Rows* rows = &buffers;
    QuantizeRowsInt8(x, m, w.cols, buffers);
    ThreadPool::Global().ParallelFor(static_cast<size_t>(w.panels), [&](size_t begin, size_t end) {
      Int8Panels(rows->codes.data(), rows->stride, rows->scales.data(), m, w,
                 static_cast<int64_t>(begin), static_cast<int64_t>(end), y);
    });
    return;
  }
  if (w.dtype == DType::kGgml) {
    thread_local Q8Rows buffers;  // by pointer, as for int8 above
    const Q8Rows* rows = &buffers;
    QuantizeRowsQ8(x, m, w, buffers);
    ThreadPool::Global().ParallelFor(static_cast<size_t>(w.panels), [&](size_t begin, size_t end) {
      GgmlPanels(*rows, 0, m, w, static_cast<int64_t>(begin), static_cast<int64_t>(end), y);
    });
    return;
  }
  if (UseAmxBf16(w)) {
    const AmxBackend backend = ActiveAmxBackend();
    // Reused, by pointer, as the int8 and GGML rows above: no page faults or zeroing per product.
    thread_local CacheLineVector<uint16_t> buffer;
    buffer.resize(std::max(buffer.size(), static_cast<size_t>(AmxBf16Elements(m, w.cols))));
    const uint16_t* x_bf16 = buffer.data();
    uint16_t* rows = buffer.data();
    // Whole tiles of rows per thread (a range's own padding rows are then only the last one's).
    // A prompt's rows converted on one thread were a few percent of its prefill.
    const int64_t tiles = (m + 15) / 16, stride = AmxBf16RowStride(w.cols);
    ThreadPool::Global().ParallelForIf(
        m * w.cols >= 65536, static_cast<size_t>(tiles), [&](size_t begin, size_t end) {
          const int64_t r0 = static_cast<int64_t>(begin) * 16;
          const int64_t r1 = std::min(m, static_cast<int64_t>(end) * 16);
          AmxToBf16Rows(backend, x + r0 * w.cols, r1 - r0, w.cols, rows + r0 * stride);
        });
    const int64_t threads = ThreadPool::Global().size();
    if (w.panels < threads && tiles >= threads) {
      // Fewer panels than threads (a router's 16 experts are one): whole tiles of rows over the
      // threads instead, as a row's bits do not depend on the rows beside it. A prompt's router
      // product on one thread was a third of a millisecond per layer while the others waited.
      ThreadPool::Global().ParallelFor(static_cast<size_t>(tiles), [&](size_t begin, size_t end) {
        const int64_t r0 = static_cast<int64_t>(begin) * 16;
        const int64_t r1 = std::min(m, static_cast<int64_t>(end) * 16);
        AmxBf16Panels(backend, x_bf16 + r0 * stride, r1 - r0, w, 0, w.panels, y + r0 * w.rows);
      });
      return;
    }
    ThreadPool::Global().ParallelFor(static_cast<size_t>(w.panels), [&](size_t begin, size_t end) {
      AmxBf16Panels(backend, x_bf16, m, w, static_cast<int64_t>(begin), static_cast<int64_t>(end),
                    y);
    });
    return;
  }
  if (UseBf16Dot(w)) {
    std::vector<uint16_t> x_bf16(static_cast<size_t>(m * w.cols));
    ToBf16RowsForDot(x, m, w.cols, x_bf16.data());
    // Panels in equal contiguous shares (the kernel tiles each share itself): whole 4- or 8-panel
    // units would leave one thread a unit more on small matrices (kv_a_proj's 18 panels: 3:2).
    ThreadPool::Global().ParallelFor(static_cast<size_t>(w.panels), [&](size_t begin, size_t end) {
      Bf16DotPanels(x_bf16.data(), m, w, static_cast<int64_t>(begin), static_cast<int64_t>(end), y);
    });
    return;
  }
  if (SplitKEnabled() && SplitK(x, m, w, y)) return;
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
