#include "kernels/cpu/grouped_ffn.h"

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/fast_linear.h"

namespace sy::kernels {
namespace {

struct WorkItem {
  int32_t expert;
  int32_t panel;  // first panel of the item
};

// Panels per work item: pairs for the bf16 kernel, four for decode-sized experts (the panel
// kernel streams four panels side by side when it has one or two rows), else one.
int64_t PanelsPerItem(bool bf16, int64_t rows) {
  return bf16 ? 2 : rows <= 2 ? 4 : 1;
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
  // Experts with enough rows run the bf16 GEMM on their rows rounded to bf16 once.
  std::vector<std::vector<uint16_t>> x_bf16(static_cast<size_t>(experts_count));
  std::vector<uint8_t> use_bf16(static_cast<size_t>(experts_count), 0);

  auto build_items = [&](bool down) {
    std::vector<WorkItem> items;
    for (int64_t e = 0; e < experts_count; ++e) {
      const int64_t count = offsets[e + 1] - offsets[e];
      if (count == 0 || experts[e].gate == nullptr) continue;
      const PackedMatrix& w = down ? *experts[e].down : *experts[e].gate;
      const int64_t step = PanelsPerItem(use_bf16[e], count);
      for (int64_t p = 0; p < w.panels; p += step)
        items.push_back({static_cast<int32_t>(e), static_cast<int32_t>(p)});
    }
    return items;
  };

  for (int64_t e = 0; e < experts_count; ++e) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (count > 0 && experts[e].gate && UseBf16Gemm(count, *experts[e].gate)) use_bf16[e] = 1;
  }
  ThreadPool::Global().ParallelFor(
      static_cast<size_t>(experts_count), [&](size_t begin, size_t end) {
        for (size_t e = begin; e < end; ++e)
          if (use_bf16[e])
            x_bf16[e] = ToBf16Rows(x + offsets[e] * hidden, offsets[e + 1] - offsets[e], hidden);
      });

  // Phase 1: gate and up panels, then SiLU(gate)·up on the same columns.
  std::vector<WorkItem> items = build_items(false);
  ThreadPool::Global().ParallelFor(items.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const int64_t e = items[i].expert, p = items[i].panel;
      const int64_t first = offsets[e], count = offsets[e + 1] - first;
      const ExpertPanels& w = experts[e];
      const int64_t p_end =
          std::min<int64_t>(w.gate->panels, p + PanelsPerItem(use_bf16[e], count));
      const uint16_t* xb = use_bf16[e] ? x_bf16[e].data() : nullptr;
      float* gate = hidden_rows.data() + first * width;
      float* up = up_rows.data() + first * width;
      LinearPanels(x + first * hidden, xb, count, *w.gate, p, p_end, gate);
      LinearPanels(x + first * hidden, xb, count, *w.up, p, p_end, up);
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
    const int64_t count = offsets[e + 1] - offsets[e];
    use_bf16[e] = count > 0 && experts[e].gate && UseBf16Gemm(count, *experts[e].down);
    if (use_bf16[e]) x_bf16[e] = ToBf16Rows(hidden_rows.data() + offsets[e] * width, count, width);
  }
  items = build_items(true);
  ThreadPool::Global().ParallelFor(items.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const int64_t e = items[i].expert, p = items[i].panel;
      const int64_t first = offsets[e], count = offsets[e + 1] - first;
      const PackedMatrix& down = *experts[e].down;
      const int64_t p_end = std::min<int64_t>(down.panels, p + PanelsPerItem(use_bf16[e], count));
      LinearPanels(hidden_rows.data() + first * width, use_bf16[e] ? x_bf16[e].data() : nullptr,
                   count, down, p, p_end, out + first * hidden);
    }
  });
}

}  // namespace sy::kernels
