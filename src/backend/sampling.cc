// Backend::SampleRows' default: every row to the host (backend/sampling.h).
#include <vector>

#include "backend/backend.h"
#include "util/logging.h"

namespace strata {

void Backend::SampleRows(const Tensor& logits, std::span<const SampleRowParams> rows,
                         HostRowSampler& host, std::span<SampleResult> out) {
  STRATA_CHECK(out.size() == rows.size() && logits.dtype == DType::kF32);
  std::vector<float> row(static_cast<size_t>(logits.cols));
  for (size_t i = 0; i < rows.size(); ++i) {
    STRATA_CHECK(rows[i].logit_row >= 0 && rows[i].logit_row < logits.rows);
    CopyToHost(row.data(), logits.row<float>(rows[i].logit_row), row.size() * sizeof(float));
    out[i] = host.SampleOnHost(i, row.data());
  }
}

}  // namespace strata
