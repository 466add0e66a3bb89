// Pieces every architecture file shares (decoder.cc, deepseek_v3.cc): the
// check that a checkpoint holds nothing the model left unbound, and the
// final norm + LM head over the rows that want logits.
// Stateless functions; call them from the thread that owns the model.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "model/weights.h"

namespace strata {

// InvalidArgument listing (the first five of) `extra`, the tensors
// `architecture` does not use, with `hint` appended; OK when empty:
//   "checkpoint has tensors that LlamaForCausalLM does not use: a, b (hint)"
Status RejectExtraTensors(const std::vector<std::string>& extra, const std::string& architecture,
                          const std::string& hint);

// The tensors never bound (WeightStore::Unused) other than the rotary
// inv_freq buffers old exporters saved (derived from config.json, so they
// are not extra).
std::vector<std::string> UnusedTensors(const WeightStore& w);

// logits = lm_head(final_norm(x[rows that want logits])): `last` is scratch
// of at least num_logit_rows x hidden F32. Nothing when no row wants logits.
void LogitsOfRows(Backend& backend, const Tensor& x, const ForwardBatch& batch,
                  const Tensor& final_norm, const Tensor& lm_head, float eps, Tensor last,
                  Tensor logits);

}  // namespace strata
