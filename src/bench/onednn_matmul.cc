#include "bench/onednn_matmul.h"

#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

#include "base/clock.h"
#include "tensor/dtype.h"

namespace sy::bench {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct OnednnMatmul::State {
  int64_t n, k;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::vector<std::vector<uint16_t>> weights;  // [n][k] bf16 each, i.e. weights [k, n] as "ba"
};

OnednnMatmul::OnednnMatmul(int64_t n, int64_t k, int copies, int threads)
    : state_(std::make_unique<State>()) {
  omp_set_num_threads(threads);  // oneDNN runs on OpenMP here; as many threads as ours
  state_->n = n;
  state_->k = k;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int c = 0; c < copies; ++c) {
    std::vector<uint16_t> w(static_cast<size_t>(n * k));
    for (auto& v : w)
      v = F32ToBF16(normal(rng));
    state_->weights.push_back(std::move(w));
  }
}

OnednnMatmul::~OnednnMatmul() = default;

// oneDNN's best product for activations and weights of type `type`: bf16 where the CPU has a bf16
// matmul (AVX-512 BF16, AMX); where it has none (AVX2 CPUs) creating the primitive throws, and
// the side-by-side row uses oneDNN's f32 matmul on the same values instead.
static std::optional<dnnl::matmul::primitive_desc> MatmulFor(const dnnl::engine& engine, int64_t m,
                                                             int64_t n, int64_t k, dt type) {
  const dnnl::memory::desc src_md({m, k}, type, tag::ab);
  const dnnl::memory::desc any_weights({k, n}, type, tag::any);
  const dnnl::memory::desc dst_md({m, n}, dt::f32, tag::ab);
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, any_weights, dst_md), engine);
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

double OnednnMatmul::MedianSeconds(int64_t m, int repetitions) {
  State& s = *state_;
  const dnnl::memory::dims weight_dims = {s.k, s.n};
  dt type = dt::bf16;
  auto pd = MatmulFor(s.engine, m, s.n, s.k, type);
  if (!pd) {
    type = dt::f32;
    pd = MatmulFor(s.engine, m, s.n, s.k, type);
  }
  if (!pd) throw std::runtime_error("oneDNN has neither a bf16 nor an f32 matmul on this CPU");
  const bool bf16 = type == dt::bf16;
  bf16_ = bf16;
  implementation_ = pd->impl_info_str();
  const dnnl::matmul matmul(*pd);
  // Each copy reordered into the layout the primitive wants (not timed).
  std::vector<dnnl::memory> weights;
  for (auto& w : s.weights) {
    std::vector<float> wide;
    void* data = w.data();
    if (!bf16) {
      wide.resize(w.size());
      for (size_t i = 0; i < w.size(); ++i)
        wide[i] = BF16ToF32(w[i]);
      data = wide.data();
    }
    dnnl::memory user({weight_dims, type, tag::ba}, s.engine, data);
    dnnl::memory packed(pd->weights_desc(), s.engine);
    dnnl::reorder(user, packed).execute(s.stream, user, packed);
    s.stream.wait();
    weights.push_back(packed);
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(m * s.k));
  std::vector<float> x_wide(bf16 ? 0 : x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = F32ToBF16(normal(rng));
    if (!bf16) x_wide[i] = BF16ToF32(x[i]);
  }
  std::vector<float> y(static_cast<size_t>(m * s.n));
  dnnl::memory src(pd->src_desc(), s.engine, bf16 ? static_cast<void*>(x.data()) : x_wide.data());
  dnnl::memory dst(pd->dst_desc(), s.engine, y.data());
  auto pass = [&] {
    for (auto& w : weights)
      matmul.execute(s.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}});
    s.stream.wait();
  };
  pass();
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const double start = NowSeconds();
    pass();
    times.push_back((NowSeconds() - start) / static_cast<double>(weights.size()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace sy::bench
