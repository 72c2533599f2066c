#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace sy {
namespace {

// YaRN's magnitude correction m(s, μ) = 0.1·μ·ln(s) + 1 for s > 1.
double YarnMscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

RopeParams ComputeRopeParams(const ModelConfig& c) {
  RopeParams params;
  const int64_t dim = c.qk_rope_head_dim, half = dim / 2;
  const float theta = static_cast<float>(c.rope_theta);
  params.inv_freq.resize(static_cast<size_t>(half));
  params.softmax_scale = static_cast<float>(std::pow(static_cast<double>(c.qk_head_dim()), -0.5));
  if (!c.yarn) {
    for (int64_t i = 0; i < half; ++i)
      params.inv_freq[i] =
          1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    return params;
  }
  const YarnScaling& y = *c.yarn;
  const float factor = static_cast<float>(y.factor);
  // Dimension index whose wavelength fits `rotations` turns in the original context.
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(static_cast<double>(y.original_max_position_embeddings) /
                           (rotations * 2 * M_PI))) /
           (2 * std::log(c.rope_theta));
  };
  double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    float pos_freq = std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
    float extrapolation = 1.0f / pos_freq;
    float interpolation = 1.0f / (factor * pos_freq);
    float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    float extrapolation_weight = 1.0f - ramp;
    params.inv_freq[i] =
        interpolation * (1.0f - extrapolation_weight) + extrapolation * extrapolation_weight;
  }
  if (y.attention_factor) {
    params.attention_factor = static_cast<float>(*y.attention_factor);
  } else if (y.mscale && y.mscale_all_dim && *y.mscale != 0 && *y.mscale_all_dim != 0) {
    params.attention_factor = static_cast<float>(YarnMscale(y.factor, *y.mscale) /
                                                 YarnMscale(y.factor, *y.mscale_all_dim));
  } else {
    params.attention_factor = static_cast<float>(YarnMscale(y.factor, 1.0));
  }
  if (y.mscale_all_dim && *y.mscale_all_dim != 0) {
    double m = YarnMscale(y.factor, *y.mscale_all_dim);
    params.softmax_scale = static_cast<float>(params.softmax_scale * m * m);
  }
  return params;
}

}  // namespace sy
