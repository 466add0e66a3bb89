#include "engine/batch_sampler.h"

#include "util/logging.h"

namespace strata {

void BatchSampler::Clear() {
  rows_.clear();
  params_.clear();
  banned_.clear();
  host_rows_ = 0;
}

void BatchSampler::Add(Sampler& sampler, const TokenHistory& history, int64_t logit_row,
                       std::span<const uint32_t> allowed, std::span<const int32_t> banned) {
  const SamplingParams& p = sampler.params();
  Row row{&sampler, &history, banned_.size(), banned_.size() + banned.size()};
  banned_.insert(banned_.end(), banned.begin(), banned.end());
  rows_.push_back(row);
  SampleRowParams rp;
  rp.logit_row = logit_row;
  rp.temperature = p.temperature;
  rp.top_k = p.top_k;
  rp.top_p = p.top_p;
  rp.min_p = p.min_p;
  rp.repetition_penalty = p.repetition_penalty;
  rp.frequency_penalty = p.frequency_penalty;
  rp.presence_penalty = p.presence_penalty;
  rp.uniform = sampler.NextDraw();  // the row's one draw, as Sample() would take it
  rp.logprobs = p.logprobs;
  rp.allowed = allowed;
  rp.logit_bias = p.logit_bias;
  if (p.UsesPenalties()) rp.penalties = history.tokens();
  params_.push_back(rp);
}

void BatchSampler::Run(Backend& backend, const Tensor& logits, std::vector<SampleResult>* out) {
  // banned_ is complete now: point the rows at it.
  for (size_t i = 0; i < rows_.size(); ++i) {
    params_[i].banned = std::span<const int32_t>(banned_).subspan(
        rows_[i].banned_begin, rows_[i].banned_end - rows_[i].banned_begin);
  }
  vocab_ = logits.cols;
  out->resize(rows_.size());
  if (rows_.empty()) return;
  backend.SampleRows(logits, params_, *this, *out);
}

SampleResult BatchSampler::SampleOnHost(size_t i, const float* logits) {
  STRATA_CHECK(i < rows_.size());
  const Row& r = rows_[i];
  ++host_rows_;
  LogitMask mask;
  mask.allowed = params_[i].allowed;
  mask.banned = params_[i].banned;
  return r.sampler->SampleWithDraw(logits, vocab_, *r.history, mask, params_[i].uniform);
}

}  // namespace strata
