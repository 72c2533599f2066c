#include "kernels/cpu/grouped_ffn.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "base/allocator.h"
#include "base/clock.h"
#include "base/thread_pool.h"
#include "kernels/cpu/amx_kernels.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/ggml_gemm.h"
#include "kernels/cpu/int8_gemm.h"

namespace sy::kernels {
namespace {

struct WorkItem {
  int32_t expert;
  int32_t panel, panel_end;  // the item's panels [panel, panel_end)
};

// How one expert's products run: the AMX bf16 kernel, the bf16 dot kernel, the bf16 GEMM, the
// f32 panel kernel, or the int8 kernel (weights packed as int8).
enum class Path : uint8_t { kF32, kBf16Gemm, kDot, kAmx, kInt8, kGgml };

// Weights one decode-sized GGML item streams per matrix. Each item starts its streams afresh
// (gate's and up's, or down's), so small items pay that start many times a layer; large ones
// leave the threads' shares uneven at the end. Four panels (64-74 KB of gate and of up) ran a
// bench-model step 2-7% slower than ~256 KB (Zen 4, paired in one process, seven runs; 128 KB
// gained half of that, 512 KB-1 MB no more).
constexpr int64_t kDecodeItemBytes = 256 << 10;

// Panels per work item: the dot kernel's unit, pairs for the bf16 GEMM, about kDecodeItemBytes
// for decode-sized experts on GGML blocks, four for them on the f32 kernel (it streams four
// panels side by side for one or two rows), else one.
int64_t PanelsPerItem(Path path, int64_t rows, const PackedMatrix& w) {
  if (path == Path::kDot || path == Path::kAmx) return Bf16DotPanelUnit(rows);
  if (path == Path::kBf16Gemm) return 2;
  if (rows > 2) return 1;
  if (path != Path::kGgml) return 4;
  const int64_t panel_bytes = static_cast<int64_t>(w.PanelColumnBytes()) * w.cols;
  return std::max<int64_t>(4, kDecodeItemBytes / std::max<int64_t>(1, panel_bytes));
}

// One expert's rows against panels [p, p_end) of w, by its path (x_int8: the whole batch;
// x_ggml: the expert's rows from row ggml_first).
void Product(Path path, const float* x, const uint16_t* x_bf16, const Int8Rows& x_int8,
             const Q8Rows& x_ggml, int64_t ggml_first, int64_t first, int64_t rows,
             const PackedMatrix& w, int64_t p, int64_t p_end, float* y,
             const NextPanels& next = {}) {
  if (path == Path::kGgml) {
    if (x_ggml.Fits(w)) {
      GgmlPanels(x_ggml, ggml_first, rows, w, p, p_end, y);
    } else {  // gate and up with different block layouts (not in llama.cpp's mixes)
      thread_local Q8Rows own;
      QuantizeRowsQ8(x, rows, w, own, /*parallel=*/false);
      GgmlPanels(own, 0, rows, w, p, p_end, y);
    }
  } else if (path == Path::kInt8) {
    Int8Panels(x_int8.Codes(first), x_int8.stride, x_int8.Scales(first), rows, w, p, p_end, y);
  } else if (path == Path::kAmx) {
    AmxBf16Panels(ActiveAmxBackend(), x_bf16, rows, w, p, p_end, y);
  } else if (path == Path::kDot) {
    Bf16DotPanels(x_bf16, rows, w, p, p_end, y, next);
  } else {
    LinearPanels(x, path == Path::kBf16Gemm ? x_bf16 : nullptr, rows, w, p, p_end, y);
  }
}

// Runs body(i) for items [0, count) on all threads. Each thread starts on a contiguous share of
// near-equal estimated cost (ThreadPool::ParallelFor splits by count, and experts' items differ
// in rows) and walks it from the front; a thread done with its share takes items from the back
// of the share with the most left. The estimate alone left one thread waiting for the other 5%
// of an int8 batch-32 decode step; handing out items one by one from a shared counter instead
// was 15% slower: the cores no longer streamed contiguous memory. Each item writes its own
// outputs, so which thread runs it does not change a bit.
template <typename Cost, typename Body>
void BalancedFor(size_t count, Cost cost, Body body) {
  ThreadPool& pool = ThreadPool::Global();
  const size_t threads = static_cast<size_t>(pool.size());
  std::vector<double> prefix(count + 1, 0.0);
  for (size_t i = 0; i < count; ++i)
    prefix[i + 1] = prefix[i] + cost(i);
  // Share t's items not taken yet: [front, back), packed in one word so that both ends move
  // under one compare-exchange.
  auto pack = [](uint64_t front, uint64_t back) { return front | back << 32; };
  std::vector<std::atomic<uint64_t>> shares(threads);
  size_t begin = 0;
  for (size_t t = 0; t < threads; ++t) {
    const size_t end =
        t + 1 == threads ? count
                         : static_cast<size_t>(std::lower_bound(prefix.begin(), prefix.end(),
                                                                prefix[count] * (t + 1) / threads) -
                                               prefix.begin());
    shares[t].store(pack(begin, std::max(begin, end)), std::memory_order_relaxed);
    begin = std::max(begin, end);
  }
  // Takes one item of share t from the front or the back; false when the share is empty.
  auto take = [&](size_t t, bool from_back, size_t* item) {
    uint64_t word = shares[t].load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = word & 0xffffffffu, back = word >> 32;
      if (front >= back) return false;
      const uint64_t next = from_back ? pack(front, back - 1) : pack(front + 1, back);
      if (shares[t].compare_exchange_weak(word, next, std::memory_order_relaxed)) {
        *item = from_back ? back - 1 : front;
        return true;
      }
    }
  };
  pool.ParallelFor(threads, [&](size_t first, size_t last) {
    size_t item = 0;
    for (size_t t = first; t < last; ++t)
      while (take(t, false, &item))
        body(item);
    for (;;) {
      size_t victim = threads, most = 0;
      for (size_t t = 0; t < threads; ++t) {
        const uint64_t word = shares[t].load(std::memory_order_relaxed);
        const uint64_t front = word & 0xffffffffu, back = word >> 32;
        if (back > front && back - front > most) most = back - front, victim = t;
      }
      if (victim == threads) return;
      if (take(victim, true, &item)) body(item);
    }
  });
}

// The routed down pass's column shares at prompt sizes, sized by the speed each ran at before.
// Every expert has down's shape, yet equal shares were not equal work: in a 32 × 64-token prompt
// of the bf16 bench model (Xeon with AMX, 2 threads) the thread with the upper half of the
// columns finished ~9% of the loop later, every layer (each 3 MiB matrix has its last third in
// 4 KiB pages, the rest in a huge page: the likely cause). Each share's cost per
// panel relative to the call's mean is smoothed from call to call, and the panels split in
// inverse proportion, each share within [1/2, 3/2] of the equal one. Which thread takes which
// columns changes no bit: a column's sums over the experts are its own, in ascending order.
class RoutedShares {
 public:
  // Panels [bounds[t], bounds[t + 1]) for share t of `threads`.
  std::vector<int64_t> Bounds(int64_t panels, size_t threads) {
    std::lock_guard lock(mutex_);
    if (cost_.size() != threads) cost_.assign(threads, 1.0);
    double total = 0;
    for (double c : cost_)
      total += 1.0 / c;
    std::vector<int64_t> bounds(threads + 1, 0);
    double at = 0;
    for (size_t t = 0; t < threads; ++t) {
      at += 1.0 / cost_[t] / total;
      bounds[t + 1] = t + 1 == threads ? panels : static_cast<int64_t>(std::lround(at * panels));
      bounds[t + 1] = std::clamp(bounds[t + 1], bounds[t], panels);
    }
    return bounds;
  }
  // The seconds each share of `bounds` took.
  void Update(const std::vector<int64_t>& bounds, const std::vector<double>& seconds) {
    const size_t threads = seconds.size();
    std::vector<double> per_panel(threads, 0.0);
    double mean = 0;
    for (size_t t = 0; t < threads; ++t) {
      const int64_t count = bounds[t + 1] - bounds[t];
      if (count <= 0 || seconds[t] <= 0) return;  // nothing to compare
      per_panel[t] = seconds[t] / static_cast<double>(count);
      mean += per_panel[t] / static_cast<double>(threads);
    }
    std::lock_guard lock(mutex_);
    if (cost_.size() != threads) return;
    for (size_t t = 0; t < threads; ++t)
      cost_[t] = std::clamp(0.5 * cost_[t] + 0.5 * per_panel[t] / mean, 2.0 / 3.0, 2.0);
  }
  void Set(const std::vector<double>& costs) {
    std::lock_guard lock(mutex_);
    cost_ = costs;
  }

 private:
  std::mutex mutex_;
  std::vector<double> cost_;  // per share: cost per panel relative to the shares' mean
};

RoutedShares& PromptRoutedShares() {
  static RoutedShares shares;
  return shares;
}

// Rows from which the routed down pass sizes its shares by speed (a prompt's): below, equal
// shares, as decode steps' few rows take the weights' streaming time, not their own.
constexpr int64_t kMeasuredShareRows = 1024;

// An item's cost in row-panels, with streaming the panel's weights worth a few rows.
constexpr double kStreamRows = 3;

// Phase 1's rows for the fused AMX pass, at prefill sizes: each source row (x's row i, or
// source_rows[i]) rounded to bf16 once and written to every expert row that takes it, the rows
// spread over the threads by source. The stores go past the caches: the pass reads these rows
// only after all of them are written, and a prompt's tens of megabytes (five copies of each
// token's row) would only push out what the caches hold; without the read of each line before
// it is written, and with one read of each source row instead of one per copy, the rounding of
// a 32 × 64-token prompt took a third of the time.
void RoundRowsForExperts(const float* x, int64_t hidden, const std::vector<int64_t>& offsets,
                         const int64_t* source_rows, const std::vector<ExpertPanels>& experts,
                         std::vector<CacheLineArray<uint16_t>>& x_amx) {
  const int64_t experts_count = static_cast<int64_t>(experts.size());
  const int64_t rows = offsets[experts_count], stride = AmxBf16RowStride(hidden);
  auto source = [&](int64_t i) { return source_rows != nullptr ? source_rows[i] : i; };
  std::vector<uint16_t*> target(static_cast<size_t>(rows), nullptr);
  for (int64_t e = 0; e < experts_count; ++e) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (count == 0 || experts[e].gate == nullptr) continue;
    uint16_t* rows_e = x_amx[e].get();
    // The rows past count that tile loads read.
    std::fill(rows_e + count * stride, rows_e + AmxBf16Elements(count, hidden), uint16_t{0});
    for (int64_t r = 0; r < count; ++r)
      target[offsets[e] + r] = rows_e + r * stride;
  }
  // The expert rows of each source row, by a counting sort on the source.
  int64_t sources = 0;
  for (int64_t i = 0; i < rows; ++i)
    if (target[i] != nullptr) sources = std::max(sources, source(i) + 1);
  std::vector<int64_t> start(static_cast<size_t>(sources + 1), 0);
  for (int64_t i = 0; i < rows; ++i)
    if (target[i] != nullptr) ++start[source(i) + 1];
  for (int64_t t = 0; t < sources; ++t)
    start[t + 1] += start[t];
  std::vector<uint16_t*> outs(static_cast<size_t>(start[sources]));
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < rows; ++i)
    if (target[i] != nullptr) outs[next[source(i)]++] = target[i];
  ThreadPool::Global().ParallelFor(static_cast<size_t>(sources), [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t)
      AmxToBf16RowFanOut(ActiveAmxBackend(), x + t * hidden, hidden, outs.data() + start[t],
                         start[t + 1] - start[t]);
  });
}

}  // namespace

void SetRoutedShareCostsForTesting(const std::vector<double>& costs) {
  PromptRoutedShares().Set(costs);
}

bool GroupedExpertFfn(const float* x, const std::vector<int64_t>& offsets,
                      const std::vector<ExpertPanels>& experts, int64_t hidden, float* out,
                      const int64_t* source_rows, const AmxRoutedRows* routed_sum) {
  const int64_t experts_count = static_cast<int64_t>(experts.size());
  int64_t width = 0;
  for (const auto& e : experts)
    if (e.gate) width = e.gate->rows;
  if (width == 0) return false;
  const int64_t rows = offsets[experts_count];
  auto source_row = [&](int64_t i) {
    return x + (source_rows != nullptr ? source_rows[i] : i) * hidden;
  };
  // Experts on the dot kernel, or with enough rows for the bf16 GEMM, take their rows rounded
  // to bf16 once.
  std::vector<std::vector<uint16_t>> x_bf16(static_cast<size_t>(experts_count));
  // The AMX kernel's rows: written whole by AmxToBf16Rows (no zero fill).
  std::vector<CacheLineArray<uint16_t>> x_amx(static_cast<size_t>(experts_count));
  // Experts with GGML blocks: their rows quantized for their weights' block layout, all in
  // x_ggml_all where every such expert has the same layout (one call for the batch: at one
  // token the per-expert calls were most of the setup between the layer's two phases), else
  // each in its own.
  std::vector<Q8Rows> x_ggml(static_cast<size_t>(experts_count));
  Q8Rows x_ggml_all;
  bool ggml_all = false;
  std::vector<Path> path(static_cast<size_t>(experts_count), Path::kF32);
  auto rows_bf16 = [&](int64_t e) -> const uint16_t* {
    return path[e] == Path::kAmx ? x_amx[e].get() : x_bf16[e].data();
  };
  auto choose = [&](int64_t e, const PackedMatrix& w) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (count == 0 || experts[e].gate == nullptr) return Path::kF32;
    if (w.dtype == DType::kI8) return Path::kInt8;
    if (w.dtype == DType::kGgml) return Path::kGgml;
    if (UseAmxBf16(w)) return Path::kAmx;
    if (UseBf16Dot(w)) return Path::kDot;
    return UseBf16Gemm(count, w) ? Path::kBf16Gemm : Path::kF32;
  };
  // Whether one quantization of every row serves all the experts: each with rows takes GGML
  // blocks of one activation layout.
  auto one_ggml_layout = [&](bool down) {
    const PackedMatrix* first = nullptr;
    for (int64_t e = 0; e < experts_count; ++e) {
      if (offsets[e + 1] == offsets[e]) continue;
      if (path[e] != Path::kGgml) return false;
      const PackedMatrix& w = down ? *experts[e].down : *experts[e].gate;
      if (first == nullptr) {
        first = &w;
      } else if (!SameActivationLayout(w, *first)) {
        return false;
      }
    }
    return first != nullptr;
  };
  auto round_rows = [&](const float* source, int64_t e, int64_t cols, bool down) {
    const int64_t count = offsets[e + 1] - offsets[e];
    if (path[e] == Path::kGgml) {
      if (ggml_all) return;
      // For gate's layout, which up shares in llama.cpp's files (else Product requantizes).
      QuantizeRowsQ8(source + offsets[e] * cols, count, down ? *experts[e].down : *experts[e].gate,
                     x_ggml[e], /*parallel=*/false);
    } else if (path[e] == Path::kDot) {
      x_bf16[e].resize(static_cast<size_t>(count * cols));
      ToBf16RowsForDot(source + offsets[e] * cols, count, cols, x_bf16[e].data());
    } else if (path[e] == Path::kAmx) {
      x_amx[e] = UninitializedCacheLineArray<uint16_t>(AmxBf16Elements(count, cols));
      if (source_rows != nullptr && !down) {  // the source rows themselves, and the zero rows
        const int64_t stride = AmxBf16RowStride(cols);
        for (int64_t r = 0; r < count; ++r)
          AmxToBf16Row(ActiveAmxBackend(), source_row(offsets[e] + r), cols,
                       x_amx[e].get() + r * stride);
        std::fill(x_amx[e].get() + count * stride, x_amx[e].get() + AmxBf16Elements(count, cols),
                  uint16_t{0});
      } else {
        AmxToBf16Rows(ActiveAmxBackend(), source + offsets[e] * cols, count, cols, x_amx[e].get());
      }
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
      const int64_t step = PanelsPerItem(path[e], count, w);
      for (int64_t p = 0; p < w.panels; p += step)
        items.push_back({static_cast<int32_t>(e), static_cast<int32_t>(p),
                         static_cast<int32_t>(std::min(w.panels, p + step))});
    }
    return items;
  };

  for (int64_t e = 0; e < experts_count; ++e)
    if (experts[e].gate) path[e] = choose(e, *experts[e].gate);
  // Where every expert with rows has gate and up as panels of bf16 pairs and takes the AMX
  // kernel for down too, phase 1 writes down's bf16 rows itself (AmxBf16GateUpPanels): no f32
  // rows of gate and up, no SiLU pass and no rounding pass over them (at a 32 × 64-token prompt
  // of the bf16 bench model, 100 MB written and read again per layer), the same bits. Its
  // experts' rows are rounded to bf16 straight from the source rows: no f32 copy in expert order.
  bool fused = false;
  for (int64_t e = 0; e < experts_count; ++e) {
    if (offsets[e + 1] == offsets[e] || experts[e].gate == nullptr) continue;
    fused = path[e] == Path::kAmx && AmxGateUpFuses(*experts[e].gate, *experts[e].up) &&
            choose(e, *experts[e].down) == Path::kAmx;
    if (!fused) break;
  }
  if (source_rows != nullptr && !fused) {
    // The other paths read f32 rows in expert order. Kept from call to call (a prompt's
    // thousands of rows are tens of megabytes: MoeForwardRouted says why); by pointer for the
    // workers.
    thread_local std::vector<float> gathered;
    if (gathered.size() < static_cast<size_t>(rows * hidden))
      gathered.resize(static_cast<size_t>(rows * hidden));
    float* const to = gathered.data();
    ThreadPool::Global().ParallelForIf(
        rows * hidden >= 65536, static_cast<size_t>(rows), [&](size_t begin, size_t end) {
          for (size_t i = begin; i < end; ++i)
            std::copy_n(source_row(static_cast<int64_t>(i)), hidden, to + i * hidden);
        });
    x = to;
    source_rows = nullptr;
  }
  // Int8 experts take the whole batch quantized once (rows are quantized independently).
  Int8Rows x_int8;
  auto quantize_all = [&](const float* source, int64_t cols) {
    if (std::find(path.begin(), path.end(), Path::kInt8) != path.end())
      QuantizeRowsInt8(source, rows, cols, x_int8);
  };
  quantize_all(x, hidden);
  // The GGML rows in one call where the layouts allow (the first expert's matrix stands for all).
  auto quantize_ggml_all = [&](const float* source, bool down) {
    ggml_all = one_ggml_layout(down);
    if (!ggml_all) return;
    for (int64_t e = 0; e < experts_count; ++e)
      if (offsets[e + 1] > offsets[e]) {
        const PackedMatrix& w = down ? *experts[e].down : *experts[e].gate;
        QuantizeRowsQ8(source, rows, w, x_ggml_all, /*parallel=*/rows * w.cols >= 65536);
        return;
      }
  };
  quantize_ggml_all(x, false);
  if (fused && rows * hidden >= 65536) {
    for (int64_t e = 0; e < experts_count; ++e)
      if (offsets[e + 1] > offsets[e] && experts[e].gate != nullptr)
        x_amx[e] = UninitializedCacheLineArray<uint16_t>(
            AmxBf16Elements(offsets[e + 1] - offsets[e], hidden));
    RoundRowsForExperts(x, hidden, offsets, source_rows, experts, x_amx);
  } else {
    // A few decode rows are quantized faster than the pool wakes.
    ThreadPool::Global().ParallelForIf(rows * hidden >= 65536, static_cast<size_t>(experts_count),
                                       [&](size_t begin, size_t end) {
                                         for (size_t e = begin; e < end; ++e)
                                           round_rows(x, static_cast<int64_t>(e), hidden, false);
                                       });
  }

  // Phase 1: gate and up panels, then SiLU(gate)·up on the same columns.
  std::vector<WorkItem> items = build_items(false);
  auto item_cost = [&](size_t i) {
    const int64_t e = items[i].expert;
    return static_cast<double>(items[i].panel_end - items[i].panel) *
           (static_cast<double>(offsets[e + 1] - offsets[e]) + kStreamRows);
  };
  if (fused) {
    std::vector<CacheLineArray<uint16_t>> x_down(static_cast<size_t>(experts_count));
    const int64_t stride = AmxBf16RowStride(width);
    for (int64_t e = 0; e < experts_count; ++e) {
      const int64_t count = offsets[e + 1] - offsets[e];
      if (count == 0 || experts[e].gate == nullptr) continue;
      x_down[e] = UninitializedCacheLineArray<uint16_t>(AmxBf16Elements(count, width));
      // The rows past count that tile loads read (AmxToBf16Rows zeroes them as well).
      std::fill(x_down[e].get() + count * stride, x_down[e].get() + AmxBf16Elements(count, width),
                uint16_t{0});
    }
    BalancedFor(items.size(), item_cost, [&](size_t i) {
      const int64_t e = items[i].expert;
      AmxBf16GateUpPanels(ActiveAmxBackend(), x_amx[e].get(), offsets[e + 1] - offsets[e],
                          *experts[e].gate, *experts[e].up, items[i].panel, items[i].panel_end,
                          x_down[e].get());
    });
    if (routed_sum != nullptr) {
      // Each thread its share of down's columns for every expert, experts in ascending order,
      // adding into the tokens' sums: each token's terms come in FinalizeRouting's order, and
      // the expert rows are never written (at a prompt's thousands of rows, 80 MB a layer
      // written and read back). Every expert has down's shape: equal shares, or at prompt sizes
      // shares sized by their speed (RoutedShares).
      int64_t panels = 0;
      for (const auto& e : experts)
        if (e.down) panels = e.down->panels;
      const size_t threads = static_cast<size_t>(ThreadPool::Global().size());
      const bool measured = rows >= kMeasuredShareRows && threads > 1;
      std::vector<int64_t> bounds(threads + 1, 0);
      if (measured) {
        bounds = PromptRoutedShares().Bounds(panels, threads);
      } else {
        for (size_t t = 0; t <= threads; ++t)
          bounds[t] = panels * static_cast<int64_t>(t) / static_cast<int64_t>(threads);
      }
      std::vector<double> seconds(threads, 0.0);
      ThreadPool::Global().ParallelFor(threads, [&](size_t begin, size_t end) {
        for (size_t t = begin; t < end; ++t) {
          const double start = NowSeconds();
          const int64_t p0 = bounds[t], p1 = bounds[t + 1];
          for (int64_t e = 0; e < experts_count && p0 < p1; ++e) {
            const int64_t first = offsets[e], count = offsets[e + 1] - first;
            if (count == 0 || experts[e].gate == nullptr) continue;
            AmxRoutedRows rows = *routed_sum;
            rows.token += first;
            rows.weight += first;
            rows.first += first;
            AmxBf16RoutedPanels(ActiveAmxBackend(), x_down[e].get(), count, *experts[e].down, p0,
                                p1, rows);
          }
          seconds[t] = NowSeconds() - start;
        }
      });
      if (measured) PromptRoutedShares().Update(bounds, seconds);
      return true;
    }
    items = build_items(true);
    BalancedFor(items.size(), item_cost, [&](size_t i) {
      const int64_t e = items[i].expert, first = offsets[e];
      AmxBf16Panels(ActiveAmxBackend(), x_down[e].get(), offsets[e + 1] - first, *experts[e].down,
                    items[i].panel, items[i].panel_end, out + first * hidden);
    });
    return false;
  }
  // The unfused path's f32 gate and up rows. Every row of an expert held here is written before
  // it is read: no zero fill (at a prompt's thousands of rows, tens of megabytes on one thread
  // while the others wait). The rows of an expert not held here are zeroed, so that a
  // whole-batch quantization reads numbers.
  auto hidden_rows = UninitializedArray<float>(rows * width);
  auto up_rows = UninitializedArray<float>(rows * width);
  for (int64_t e = 0; e < experts_count; ++e)
    if (experts[e].gate == nullptr)
      std::fill(hidden_rows.get() + offsets[e] * width, hidden_rows.get() + offsets[e + 1] * width,
                0.0f);
  BalancedFor(items.size(), item_cost, [&](size_t i) {
    const int64_t e = items[i].expert, p = items[i].panel, p_end = items[i].panel_end;
    const int64_t first = offsets[e], count = offsets[e + 1] - first;
    const ExpertPanels& w = experts[e];
    const uint16_t* xb = rows_bf16(e);
    float* gate = hidden_rows.get() + first * width;
    float* up = up_rows.get() + first * width;
    const Q8Rows& xq = ggml_all ? x_ggml_all : x_ggml[e];
    const int64_t q_first = ggml_all ? first : 0;
    // What this thread most likely runs next (its share is walked front to back), for the
    // kernels that fetch ahead.
    const NextPanels after_gate{w.up, p, p_end};
    NextPanels after_up;
    if (i + 1 < items.size())
      after_up = {experts[items[i + 1].expert].gate, items[i + 1].panel, items[i + 1].panel_end};
    Product(path[e], x + first * hidden, xb, x_int8, xq, q_first, first, count, *w.gate, p, p_end,
            gate, after_gate);
    Product(path[e], x + first * hidden, xb, x_int8, xq, q_first, first, count, *w.up, p, p_end, up,
            after_up);
    const int64_t c0 = p * kPanelRows, c1 = std::min(width, p_end * kPanelRows);
    for (int64_t r = 0; r < count; ++r)
      SiluMul(gate + r * width + c0, up + r * width + c0, c1 - c0);
  });

  // Phase 2: down.
  for (int64_t e = 0; e < experts_count; ++e)
    path[e] = experts[e].gate ? choose(e, *experts[e].down) : Path::kF32;
  quantize_ggml_all(hidden_rows.get(), true);
  ThreadPool::Global().ParallelForIf(
      rows * width >= 65536, static_cast<size_t>(experts_count), [&](size_t begin, size_t end) {
        for (size_t e = begin; e < end; ++e)
          round_rows(hidden_rows.get(), static_cast<int64_t>(e), width, true);
      });
  quantize_all(hidden_rows.get(), width);
  items = build_items(true);
  BalancedFor(items.size(), item_cost, [&](size_t i) {
    const int64_t e = items[i].expert, p = items[i].panel, p_end = items[i].panel_end;
    const int64_t first = offsets[e], count = offsets[e + 1] - first;
    const PackedMatrix& down = *experts[e].down;
    NextPanels after;
    if (i + 1 < items.size())
      after = {experts[items[i + 1].expert].down, items[i + 1].panel, items[i + 1].panel_end};
    Product(path[e], hidden_rows.get() + first * width, rows_bf16(e), x_int8,
            ggml_all ? x_ggml_all : x_ggml[e], ggml_all ? first : 0, first, count, down, p, p_end,
            out + first * hidden, after);
  });
  return false;
}

}  // namespace sy::kernels
