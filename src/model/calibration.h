// Calibration for `switchyard quantize --calibrate`: how much each input column of each linear
// layer matters, measured as the mean square of the activations it multiplies on real text —
// llama.cpp's "importance matrix". The quantizers then choose each group's scale to minimize
// Σ_j E[x_j²] · (w_j − ŵ_j)², the expected squared error of the layer's outputs if the inputs'
// columns were uncorrelated, instead of the weights' plain squared error.
//
// The forward pass reports what each linear layer multiplies through LinearInputObserver (one
// branch on a null pointer where nothing observes: serving never does). Any model switchyard
// loads can be the one observed — the source checkpoint, or for a model too large to hold in fp8,
// a 4-bit copy of it (its activations differ from the source's by the 4-bit rounding) — and the
// results are keyed by the Hugging Face module names, whatever format it was loaded from.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tensor/matrix.h"

namespace sy {

class Model;

class LinearInputObserver {
 public:
  virtual ~LinearInputObserver() = default;
  // `rows` input rows of `cols` values, `stride` apart, about to be multiplied by `w`.
  virtual void Observe(const Matrix& w, const float* x, int64_t rows, int64_t cols,
                       int64_t stride) = 0;
};

// The observer the forward pass reports to; null unless a calibration is running. Set it only
// while no forward pass runs.
LinearInputObserver*& ActiveLinearInputObserver();

inline void ObserveLinearInput(const Matrix& w, const float* x, int64_t rows, int64_t cols,
                               int64_t stride) {
  if (LinearInputObserver* o = ActiveLinearInputObserver(); o != nullptr)
    o->Observe(w, x, rows, cols, stride);
}
inline bool ObservingLinearInputs() {
  return ActiveLinearInputObserver() != nullptr;
}

// Per input column, the sum of squares of what a matrix multiplied, and how many rows.
class SquareSums : public LinearInputObserver {
 public:
  struct Sums {
    std::vector<double> squares;
    int64_t rows = 0;
  };
  void Observe(const Matrix& w, const float* x, int64_t rows, int64_t cols,
               int64_t stride) override;
  const std::unordered_map<const Matrix*, Sums>& sums() const { return sums_; }

 private:
  std::mutex mutex_;
  std::unordered_map<const Matrix*, Sums> sums_;
};

// Mean squares per input column, by weight name ("model.layers.3.mlp.experts.5.down_proj.weight"),
// and how many rows each saw: a routed expert only the tokens routed to it.
struct Importance {
  std::map<std::string, std::vector<float>> mean_squares;
  std::map<std::string, int64_t> rows;
  int64_t tokens = 0;
  // Null when `weight` was not observed (or saw no rows).
  const std::vector<float>* Find(const std::string& weight) const;
  // What the quantizers weigh `weight`'s columns by: its mean squares, each floored at 1% of
  // their mean so that columns the calibration text never exercised keep some weight. Empty when
  // not observed or not `cols` long.
  std::vector<float> Weights(const std::string& weight, int64_t cols) const;
};

// Runs `model` over `sequences` (each a prefill of its own) with a SquareSums observing, then names
// what it saw by walking the model's weights. The MTP module is not run. `progress(done, total)`
// after each sequence.
Result<Importance> CollectImportance(Model& model,
                                     const std::vector<std::vector<int32_t>>& sequences,
                                     const std::function<void(size_t, size_t)>& progress = {});

// Cuts `tokens` into windows of `length` (the last one shorter, dropped under 2 tokens), at most
// `max_tokens` in all.
std::vector<std::vector<int32_t>> CalibrationWindows(const std::vector<int32_t>& tokens,
                                                     int64_t length, int64_t max_tokens);

}  // namespace sy
