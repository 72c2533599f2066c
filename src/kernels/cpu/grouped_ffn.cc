#include "kernels/cpu/grouped_ffn.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/int8_gemm.h"

namespace sy::kernels {
namespace {

struct WorkItem {
  int32_t expert;
  int32_t panel;  // first panel of the item
};

// How one expert's products run: the bf16 dot kernel, the bf16 GEMM, the f32 panel kernel, or
// the int8 kernel (weights packed as int8).
enum class Path : uint8_t { kF32, kBf16Gemm, kDot, kInt8 };

// Panels per work item: the dot kernel's unit, pairs for the bf16 GEMM, four for decode-sized
// experts on the f32 kernel (it streams four panels side by side for one or two rows), else one.
int64_t PanelsPerItem(Path path, int64_t rows) {
  if (path == Path::kDot) return Bf16DotPanelUnit(rows);
  return path == Path::kBf16Gemm ? 2 : rows <= 2 ? 4 : 1;
}

// One expert's rows against panels [p, p_end) of w, by its path (x_int8: the whole batch).
void Product(Path path, const float* x, const uint16_t* x_bf16, const Int8Rows& x_int8,
             int64_t first, int64_t rows, const PackedMatrix& w, int64_t p, int64_t p_end,
             float* y) {
  if (path == Path::kInt8) {
    Int8Panels(x_int8.Codes(first), x_int8.Scales(first), rows, w, p, p_end, y);
  } else if (path == Path::kDot) {
    Bf16DotPanels(x_bf16, rows, w, p, p_end, y);
  } else {
    LinearPanels(x, path == Path::kBf16Gemm ? x_bf16 : nullptr, rows, w, p, p_end, y);
  }
}

}  // namespace

void GroupedExpertFfn(const float* x, const std::vector<int64_t>& offsets,
                      const std::vector<ExpertPanels>& experts, int64_t hidden, float* out) {
  const int64_t experts_count = static_cast<int64_t>(experts.size());
  int64_t width = 0;
  for (const auto& e : experts)
    if (e.gate) width = e.gate->rows;
  if (width == 0) return;
  const int64_t rows = offsets[experts_count];
  std::vector<float> hidden_rows(static_cast<size_t>(rows * width));
  std::vector<float> up_rows(hidden_rows.size());
  // Experts on the dot kernel, or with enough rows for the bf16 GEMM, take their rows rounded
  // to bf16 once.
  std::vector<std::vector<uint16_t>> x_bf16(static_cast<size_t>(experts_count));
  std::vector<Path> path(static_cast<size_t>(experts_count), Path::kF32);
  auto choose = [&](int64_t e, const PackedMatrix& w) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (count == 0 || experts[e].gate == nullptr) return Path::kF32;
    if (w.dtype == DType::kI8) return Path::kInt8;
    if (UseBf16Dot(w)) return Path::kDot;
    return UseBf16Gemm(count, w) ? Path::kBf16Gemm : Path::kF32;
  };
  auto round_rows = [&](const float* source, int64_t e, int64_t cols) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (path[e] == Path::kDot) {
      x_bf16[e].resize(static_cast<size_t>(count * cols));
      ToBf16RowsForDot(source + offsets[e] * cols, count, cols, x_bf16[e].data());
    } else if (path[e] == Path::kBf16Gemm) {
      x_bf16[e] = ToBf16Rows(source + offsets[e] * cols, count, cols);
    }
  };

  auto build_items = [&](bool down) {
    std::vector<WorkItem> items;
    for (int64_t e = 0; e < experts_count; ++e) {
      const int64_t count = offsets[e + 1] - offsets[e];
      if (count == 0 || experts[e].gate == nullptr) continue;
      const PackedMatrix& w = down ? *experts[e].down : *experts[e].gate;
      const int64_t step = PanelsPerItem(path[e], count);
      for (int64_t p = 0; p < w.panels; p += step)
        items.push_back({static_cast<int32_t>(e), static_cast<int32_t>(p)});
    }
    return items;
  };

  for (int64_t e = 0; e < experts_count; ++e)
    if (experts[e].gate) path[e] = choose(e, *experts[e].gate);
  // Int8 experts take the whole batch quantized once (rows are quantized independently).
  Int8Rows x_int8;
  auto quantize_all = [&](const float* source, int64_t cols) {
    if (std::find(path.begin(), path.end(), Path::kInt8) != path.end())
      QuantizeRowsInt8(source, rows, cols, x_int8);
  };
  quantize_all(x, hidden);
  ThreadPool::Global().ParallelFor(static_cast<size_t>(experts_count),
                                   [&](size_t begin, size_t end) {
                                     for (size_t e = begin; e < end; ++e)
                                       round_rows(x, static_cast<int64_t>(e), hidden);
                                   });

  // Phase 1: gate and up panels, then SiLU(gate)·up on the same columns.
  std::vector<WorkItem> items = build_items(false);
  ThreadPool::Global().ParallelFor(items.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const int64_t e = items[i].expert, p = items[i].panel;
      const int64_t first = offsets[e], count = offsets[e + 1] - first;
      const ExpertPanels& w = experts[e];
      const int64_t p_end = std::min<int64_t>(w.gate->panels, p + PanelsPerItem(path[e], count));
      const uint16_t* xb = x_bf16[e].data();
      float* gate = hidden_rows.data() + first * width;
      float* up = up_rows.data() + first * width;
      Product(path[e], x + first * hidden, xb, x_int8, first, count, *w.gate, p, p_end, gate);
      Product(path[e], x + first * hidden, xb, x_int8, first, count, *w.up, p, p_end, up);
      const int64_t c0 = p * kPanelRows, c1 = std::min(width, p_end * kPanelRows);
      for (int64_t r = 0; r < count; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float g = gate[r * width + c];
          gate[r * width + c] = g / (1.0f + std::exp(-g)) * up[r * width + c];
        }
    }
  });

  // Phase 2: down.
  for (int64_t e = 0; e < experts_count; ++e) {
    path[e] = experts[e].gate ? choose(e, *experts[e].down) : Path::kF32;
    round_rows(hidden_rows.data(), e, width);
  }
  quantize_all(hidden_rows.data(), width);
  items = build_items(true);
  ThreadPool::Global().ParallelFor(items.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const int64_t e = items[i].expert, p = items[i].panel;
      const int64_t first = offsets[e], count = offsets[e + 1] - first;
      const PackedMatrix& down = *experts[e].down;
      const int64_t p_end = std::min<int64_t>(down.panels, p + PanelsPerItem(path[e], count));
      Product(path[e], hidden_rows.data() + first * width, x_bf16[e].data(), x_int8, first, count,
              down, p, p_end, out + first * hidden);
    }
  });
}

}  // namespace sy::kernels
