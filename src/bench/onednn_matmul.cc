#include "bench/onednn_matmul.h"

#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <random>
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

double OnednnMatmul::MedianSeconds(int64_t m, int repetitions) {
  State& s = *state_;
  const dnnl::memory::dims src_dims = {m, s.k}, weight_dims = {s.k, s.n}, dst_dims = {m, s.n};
  const dnnl::memory::desc src_md(src_dims, dt::bf16, tag::ab);
  const dnnl::memory::desc any_weights(weight_dims, dt::bf16, tag::any);
  const dnnl::memory::desc dst_md(dst_dims, dt::f32, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_weights, dst_md), s.engine);
  implementation_ = pd.impl_info_str();
  const dnnl::matmul matmul(pd);
  // Each copy reordered into the layout the primitive wants (not timed).
  std::vector<dnnl::memory> weights;
  for (auto& w : s.weights) {
    dnnl::memory user({weight_dims, dt::bf16, tag::ba}, s.engine, w.data());
    dnnl::memory packed(pd.weights_desc(), s.engine);
    dnnl::reorder(user, packed).execute(s.stream, user, packed);
    weights.push_back(packed);
  }
  std::vector<uint16_t> x(static_cast<size_t>(m * s.k));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x)
    v = F32ToBF16(normal(rng));
  std::vector<float> y(static_cast<size_t>(m * s.n));
  dnnl::memory src(src_md, s.engine, x.data()), dst(dst_md, s.engine, y.data());
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
