// oneDNN's bf16 matmul (Debian's libdnnl; its f32 matmul on CPUs without a bf16 one) at the shapes
// `bench kernels` runs, for rows side by side with our kernels in the same run. oneDNN has no fp8
// with block scales, so it gets the same weights in bf16 (twice the bytes) in its own preferred
// layout, reordered before timing, and activations already in bf16; ours convert fp8 and round
// activations inside the timed call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace sy::bench {

class OnednnMatmul {
 public:
  // `copies` distinct random [n, k] weight matrices (cycled so a pass streams past the cache).
  OnednnMatmul(int64_t n, int64_t k, int copies, int threads);
  ~OnednnMatmul();
  OnednnMatmul(const OnednnMatmul&) = delete;
  OnednnMatmul& operator=(const OnednnMatmul&) = delete;

  // Median seconds of one [m, k] × [k, n] product (y in f32) over `repetitions` passes over the
  // copies, after one warm-up pass.
  double MedianSeconds(int64_t m, int repetitions);
  // The implementation oneDNN chose for the last m (e.g. "brg:avx512_core_bf16").
  const std::string& implementation() const { return implementation_; }
  // Whether the last m ran in bf16 (else f32: the CPU has no bf16 matmul).
  bool bf16() const { return bf16_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string implementation_;
  bool bf16_ = true;
};

}  // namespace sy::bench
