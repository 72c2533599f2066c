#include "kernels/cpu/onednn_linear.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "base/clock.h"
#include "base/thread_pool.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/fast_linear.h"
#include "kernels/cpu/panel_gemm.h"

namespace sy::kernels {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct Onednn {
  // oneDNN keeps every primitive it makes (1,024 by default) and a prefill product's primitive
  // depends on its row count, so a server seeing many prompt lengths grew by tens of MiB (the
  // 2,000-request soak: +89 MiB on a Xeon). A few dozen cover the shapes in use.
  Onednn() { dnnl::set_primitive_cache_capacity(64); }
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;  // one product at a time on the stream and the block buffers
};
Onednn& Library() {
  static Onednn library;
  return library;
}

// x [m, k] · weights [k, n] (row-major) into y [m, n] with row stride y_stride.
std::optional<dnnl::matmul::primitive_desc> MatmulFor(int64_t m, int64_t n, int64_t k,
                                                      int64_t y_stride, dt type) {
  const dnnl::memory::desc src({m, k}, type, tag::ab);
  const dnnl::memory::desc weights({k, n}, type, tag::ab);
  const dnnl::memory::desc dst({m, n}, dt::f32, dnnl::memory::dims{y_stride, 1});
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), Library().engine);
  } catch (const dnnl::error&) {
    return std::nullopt;  // no matmul of this type on this CPU (bf16 below AVX-512 BF16)
  }
}

// Output rows per block: 16 panels. At k = 7168 the bf16 block is 3.7 MB, reused by every call
// (one buffer for the process: products run one at a time).
constexpr int64_t kBlockPanels = 16;

const char* DTypeLabel(DType dtype) {
  switch (dtype) {
    case DType::kF8E4M3:
      return "fp8";
    case DType::kBF16:
      return "bf16";
    default:
      return "f32";
  }
}

struct Calibrations {
  std::mutex mutex;
  std::map<std::tuple<DType, int64_t, int64_t>, PrefillGemmDecision> decisions;
};
Calibrations& Calibrated() {
  static Calibrations calibrations;
  return calibrations;
}

}  // namespace

bool OnednnHasBf16Matmul() {
  static const bool has = MatmulFor(32, 32, 32, 32, dt::bf16).has_value();
  return has;
}

bool OnednnRunsBf16() {
  return OnednnHasBf16Matmul() && GlobalKernelOptions().bf16_dot;
}

void OnednnLinear(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  if (m <= 0) return;
  if (w.dtype == DType::kI8) throw std::invalid_argument("OnednnLinear: int8 weights");
  Onednn& library = Library();
  std::lock_guard lock(library.mutex);
  const bool bf16 = OnednnRunsBf16();
  const dt type = bf16 ? dt::bf16 : dt::f32;
  const int64_t k = w.cols, n = w.rows;
  std::vector<uint16_t> x_bf16;
  if (bf16) x_bf16 = ToBf16Rows(x, m, k);
  void* src_data = bf16 ? static_cast<void*>(x_bf16.data()) : const_cast<float*>(x);
  static std::vector<uint16_t> block_bf16;
  static std::vector<float> block_f32;
  const int64_t block_rows = kBlockPanels * kPanelRows;
  if (bf16) {
    block_bf16.resize(static_cast<size_t>(k * block_rows));
  } else {
    block_f32.resize(static_cast<size_t>(k * block_rows));
  }
  // By pointer into the OpenMP region (a thread_local there would be each thread's own).
  uint16_t* const block_b = block_bf16.data();
  float* const block_f = block_f32.data();
  // oneDNN runs on OpenMP (Debian's build), and so does the dequantization beside it: our pool
  // stays idle through the call instead of contending with OpenMP's threads for the cores.
  const int threads = static_cast<int>(ThreadPool::Global().size());
  omp_set_num_threads(threads);
  // One primitive per block width: the full blocks and a narrower last one.
  struct Prepared {
    int64_t width;
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul matmul;
  };
  std::vector<Prepared> prepared;
  for (int64_t p0 = 0; p0 < w.panels; p0 += kBlockPanels) {
    const int64_t p1 = std::min(w.panels, p0 + kBlockPanels);
    const int64_t row0 = p0 * kPanelRows;
    const int64_t width = std::min(n, p1 * kPanelRows) - row0;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = p0; p < p1; ++p) {
      if (bf16) {
        DequantizePanels(w, p, p + 1, row0, block_b, width);
      } else {
        DequantizePanels(w, p, p + 1, row0, block_f, width);
      }
    }
    auto found = std::find_if(prepared.begin(), prepared.end(),
                              [&](const Prepared& p) { return p.width == width; });
    if (found == prepared.end()) {
      auto pd = MatmulFor(m, width, k, n, type);
      if (!pd) throw std::runtime_error("oneDNN has no matmul for these types on this CPU");
      prepared.push_back({width, *pd, dnnl::matmul(*pd)});
      found = prepared.end() - 1;
    }
    dnnl::memory src(found->pd.src_desc(), library.engine, src_data);
    dnnl::memory weights(found->pd.weights_desc(), library.engine,
                         bf16 ? static_cast<void*>(block_b) : block_f);
    dnnl::memory dst(found->pd.dst_desc(), library.engine, y + row0);
    found->matmul.execute(library.stream,
                          {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    library.stream.wait();
  }
}

PrefillGemm& GlobalPrefillGemm() {
  static PrefillGemm choice = PrefillGemm::kOwn;
  return choice;
}

std::vector<PrefillGemmDecision> PrefillGemmDecisions() {
  Calibrations& c = Calibrated();
  std::lock_guard lock(c.mutex);
  std::vector<PrefillGemmDecision> out;
  for (const auto& [key, decision] : c.decisions)
    out.push_back(decision);
  return out;
}

namespace {

// OnednnLinear, or false (and one warning for the process) if oneDNN refused the product: the
// caller then runs ours, rather than a failed library call ending a server.
bool TryOnednn(const float* x, int64_t m, const PackedMatrix& w, float* y) {
  try {
    OnednnLinear(x, m, w, y);
    return true;
  } catch (const std::exception& e) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr, "switchyard: warning: oneDNN failed (%s); prefill products use ours\n",
                   e.what());
    });
    return false;
  }
}

}  // namespace

bool RunPrefillLinear(const float* x, int64_t m, const PackedMatrix& w, float* y,
                      const std::function<void()>& own) {
  switch (GlobalPrefillGemm()) {
    case PrefillGemm::kOwn:
      return false;
    case PrefillGemm::kOnednn:
      return TryOnednn(x, m, w, y);
    case PrefillGemm::kAuto:
      if (!OnednnRunsBf16()) return false;
      break;
    case PrefillGemm::kMeasure:
      break;
  }
  Calibrations& c = Calibrated();
  std::lock_guard lock(c.mutex);
  const auto key = std::make_tuple(w.dtype, w.rows, w.cols);
  auto found = c.decisions.find(key);
  if (found == c.decisions.end()) {
    // Ours, oneDNN once untimed (primitive creation, first touch of its buffers), oneDNN and
    // ours again: each side's faster run decides. y ends with our product.
    const auto timed = [](const auto& run) {
      const double start = NowSeconds();
      run();
      return NowSeconds() - start;
    };
    bool ran = true;
    const auto onednn = [&] { ran = ran && TryOnednn(x, m, w, y); };
    PrefillGemmDecision d;
    d.rows = w.rows;
    d.cols = w.cols;
    d.dtype = DTypeLabel(w.dtype);
    d.own_seconds = timed(own);
    onednn();
    d.onednn_seconds = timed(onednn);
    d.own_seconds = std::min(d.own_seconds, timed(own));
    d.onednn = ran && d.onednn_seconds < d.own_seconds;
    if (d.onednn)  // once per shape: which products left our kernels, and by how much
      std::fprintf(stderr,
                   "switchyard: note: prefill products with %lldx%lld %s weights run on oneDNN's "
                   "%s matmul (%.2fx ours, measured)\n",
                   static_cast<long long>(d.rows), static_cast<long long>(d.cols), d.dtype.c_str(),
                   OnednnRunsBf16() ? "bf16" : "f32", d.own_seconds / d.onednn_seconds);
    c.decisions.emplace(key, d);
    return true;
  }
  return found->second.onednn && TryOnednn(x, m, w, y);
}

}  // namespace sy::kernels
