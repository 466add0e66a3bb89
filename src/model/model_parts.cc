#include "model/model_parts.h"

namespace strata {

Status RejectExtraTensors(const std::vector<std::string>& extra, const std::string& architecture,
                          const std::string& hint) {
  if (extra.empty()) return OkStatus();
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
  if (extra.size() > 5) list += ", ... (" + std::to_string(extra.size()) + " in all)";
  return InvalidArgument("checkpoint has tensors that " + architecture + " does not use: " + list +
                         " (" + hint + ")");
}

std::vector<std::string> UnusedTensors(const WeightStore& w) {
  std::vector<std::string> out;
  for (const std::string& name : w.Unused())
    if (name.find("rotary_emb.inv_freq") == std::string::npos) out.push_back(name);
  return out;
}

void LogitsOfRows(Backend& backend, const Tensor& x, const ForwardBatch& batch,
                  const Tensor& final_norm, const Tensor& lm_head, float eps, Tensor last,
                  Tensor logits) {
  if (batch.num_logit_rows <= 0) return;
  backend.GatherRows(x, batch.logit_rows, last);
  backend.RmsNorm(last, final_norm, eps, last);
  backend.Linear(last, lm_head, nullptr, logits);
}

}  // namespace strata
