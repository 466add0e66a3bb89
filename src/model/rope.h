// Rotary-embedding frequency tables for the rope types of supported
// architectures. Every type reduces to an inv_freq table (RopeParams); the
// kernels never see the type.
#pragma once

#include <vector>

#include "model/hf_config.h"
#include "util/status.h"

namespace strata {

// inv_freq[i] for i < rotary_dim / 2, as transformers computes it in
// ROPE_INIT_FUNCTIONS (float32 results). Unimplemented for unknown types.
StatusOr<std::vector<float>> ComputeInvFreq(const RopeConfig& rope, int rotary_dim);

// The factor transformers multiplies cos and sin by (RopeParams::
// attention_scaling): yarn's attention_factor (given, or inferred from
// factor, mscale and mscale_all_dim); 1 for the other types.
float RopeAttentionScaling(const RopeConfig& rope);

// yarn's get_mscale(scale, mscale): 1 for scale <= 1, else
// 0.1 * mscale * ln(scale) + 1.
double YarnMscale(double scale, double mscale);

}  // namespace strata
