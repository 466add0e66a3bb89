#include "model/rope.h"

#include <cmath>

namespace strata {

StatusOr<std::vector<float>> ComputeInvFreq(const RopeConfig& rope, int dim) {
  if (dim <= 0 || dim % 2) return InvalidArgument("rotary dimension must be even and positive, got " + std::to_string(dim));
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    float p = static_cast<float>(std::pow(static_cast<double>(rope.theta), static_cast<double>(exponent)));
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
  return Unimplemented("rope type '" + rope.type +
                       "' is not supported (supported: default, linear, llama3)");
}

}  // namespace strata
