// BatchSampler: one step's sampling through Backend::SampleRows, so the
// logits of the sampled rows stay where the backend computed them and only
// the tokens (and logprobs) come back (backend/sampling.h).
//
// Each row's request keeps its own Sampler (engine/sampler.h): Add() draws
// the row's uniform from it at once, exactly as Sampler::Sample() would, and
// a row the backend hands back (SampleOnHost) runs Sampler::SampleWithDraw
// with that same number. So the tokens of a seed are the same whichever
// backend samples, and on the CPU backend (which hands every row back) they
// are the host Sampler's, bit for bit.
//
// Not thread-safe: the engine thread owns one and reuses it every step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/sampler.h"

namespace strata {

class BatchSampler final : public HostRowSampler {
 public:
  // Forgets the previous step's rows (keeps the scratch).
  void Clear();

  // Queues logits row `logit_row` to be sampled by `sampler`. The sampler,
  // the history and the mask's spans must stay valid until Run() returns;
  // `banned` is copied.
  void Add(Sampler& sampler, const TokenHistory& history, int64_t logit_row,
           std::span<const uint32_t> allowed, std::span<const int32_t> banned);

  // Samples every queued row from `logits` (the step's F32 logits rows in
  // backend memory, vocab columns); results in Add() order.
  void Run(Backend& backend, const Tensor& logits, std::vector<SampleResult>* out);

  size_t size() const { return rows_.size(); }
  // Rows of the last Run() that the backend handed to the host (all of them
  // on the CPU backend; on CUDA the rows its kernel cannot finish).
  size_t host_rows() const { return host_rows_; }

  SampleResult SampleOnHost(size_t i, const float* logits) override;

 private:
  struct Row {
    Sampler* sampler = nullptr;
    const TokenHistory* history = nullptr;
    size_t banned_begin = 0, banned_end = 0;  // in banned_
  };
  std::vector<Row> rows_;
  std::vector<SampleRowParams> params_;
  std::vector<int32_t> banned_;
  int64_t vocab_ = 0;
  size_t host_rows_ = 0;
};

}  // namespace strata
