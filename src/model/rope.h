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

}  // namespace strata
