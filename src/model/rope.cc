#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace strata {

StatusOr<std::vector<float>> ComputeInvFreq(const RopeConfig& rope, int dim) {
  if (dim <= 0 || dim % 2)
    return InvalidArgument("rotary dimension must be even and positive, got " +
                           std::to_string(dim));
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    float p = static_cast<float>(
        std::pow(static_cast<double>(rope.theta), static_cast<double>(exponent)));
    inv[i] = 1.0f / p;
  }
  if (rope.type == "default") return inv;
  if (rope.type == "linear") {
    if (rope.factor <= 0) return InvalidArgument("rope_scaling.factor must be > 0 for linear rope");
    for (float& f : inv) f = static_cast<float>(f / rope.factor);
    return inv;
  }
  if (rope.type == "llama3") {
    if (rope.original_max_position_embeddings <= 0)
      return InvalidArgument("llama3 rope needs original_max_position_embeddings > 0");
    if (rope.high_freq_factor <= rope.low_freq_factor)
      return InvalidArgument("llama3 rope needs high_freq_factor > low_freq_factor");
    const double old_ctx = static_cast<double>(rope.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rope.low_freq_factor;
    const double high_wavelen = old_ctx / rope.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rope.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / rope.factor + smooth * f);
      }
    }
    return inv;
  }
  if (rope.type == "yarn") {
    // transformers' _compute_yarn_parameters: blend interpolated (inv / factor)
    // and extrapolated (inv) frequencies with a linear ramp over the dims
    // between the correction range of beta_fast and beta_slow rotations.
    if (rope.factor <= 0) return InvalidArgument("yarn rope needs factor > 0");
    if (rope.original_max_position_embeddings <= 0)
      return InvalidArgument("yarn rope needs original_max_position_embeddings > 0");
    const double base = rope.theta,
                 ctx = static_cast<double>(rope.original_max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(ctx / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
    if (rope.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // as transformers: no singular ramp
    const float lo = static_cast<float>(low), hi = static_cast<float>(high);
    const float factor = static_cast<float>(rope.factor);
    for (int i = 0; i < dim / 2; ++i) {
      // base ** (2i / dim) in float32, as for the default table above.
      const float pos_freq = static_cast<float>(
          std::pow(base, static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(dim))));
      const float extrapolation = 1.0f / pos_freq;
      const float interpolation = 1.0f / (factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - lo) / (hi - lo), 0.0f, 1.0f);
      const float extrapolation_factor = 1.0f - ramp;
      inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
    return inv;
  }
  return Unimplemented("rope type '" + rope.type +
                       "' is not supported (supported: default, linear, llama3, yarn)");
}

double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

float RopeAttentionScaling(const RopeConfig& rope) {
  if (rope.type != "yarn") return 1.0f;
  if (rope.attention_factor) return static_cast<float>(*rope.attention_factor);
  if (rope.mscale != 0 && rope.mscale_all_dim != 0) {
    return static_cast<float>(YarnMscale(rope.factor, rope.mscale) /
                              YarnMscale(rope.factor, rope.mscale_all_dim));
  }
  return static_cast<float>(YarnMscale(rope.factor, 1.0));
}

}  // namespace strata
