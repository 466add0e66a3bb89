#include "engine/model_runner.h"

#include <cstring>

namespace strata {

ModelRunner::ModelRunner(Model& model, Backend& backend, KvPool& pool, int32_t max_batch_tokens)
    : model_(model), backend_(backend), pool_(pool), max_batch_tokens_(max_batch_tokens) {
  const KvLayout& layout = pool.layout();
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
    for (int l = 0; l < layout.groups[g].num_layers; ++l) kv_.push_back(pool.Layer(g, l));
}

Status ModelRunner::Reserve(Buffer& buf, size_t bytes) {
  if (buf.bytes() >= bytes) return OkStatus();
  ASSIGN_OR_RETURN(buf, backend_.Allocate(std::max<size_t>(bytes, 256)));
  return OkStatus();
}

Status ModelRunner::Run(std::span<const StepItem> items, Tensor* logits) {
  h_tokens_.clear();
  h_positions_.clear();
  h_slots_.clear();
  h_pages_.clear();
  h_logit_rows_.clear();
  h_seqs_.clear();
  std::vector<size_t> page_offsets;
  for (const StepItem& it : items) {
    if (it.num_tokens <= 0) return Internal("ModelRunner: empty step item");
    const int32_t q_start = static_cast<int32_t>(h_tokens_.size());
    const int64_t end = int64_t{it.start_pos} + it.num_tokens;
    if (it.table->capacity() < end) return Internal("ModelRunner: page table too small for step");
    for (int32_t i = 0; i < it.num_tokens; ++i) {
      h_tokens_.push_back(it.tokens[i]);
      h_positions_.push_back(it.start_pos + i);
      h_slots_.push_back(it.table->Slot(it.start_pos + i));
    }
    for (int32_t r = it.num_logit_rows(); r > 0; --r)
      h_logit_rows_.push_back(static_cast<int32_t>(h_tokens_.size()) - r);
    const int64_t pages_used = (end + it.table->page_size() - 1) / it.table->page_size();
    page_offsets.push_back(h_pages_.size());
    h_pages_.insert(h_pages_.end(), it.table->pages().begin(), it.table->pages().begin() + pages_used);
    AttentionSeq s;
    s.q_start = q_start;
    s.q_len = it.num_tokens;
    s.kv_len = static_cast<int32_t>(end);
    h_seqs_.push_back(s);
  }
  const int32_t n = static_cast<int32_t>(h_tokens_.size());
  if (n > max_batch_tokens_)
    return Internal("ModelRunner: step of " + std::to_string(n) + " tokens exceeds " +
                    std::to_string(max_batch_tokens_));
  const int64_t vocab = vocab_size();
  const size_t nl = h_logit_rows_.size();
  RETURN_IF_ERROR(Reserve(tokens_, n * sizeof(int32_t)));
  RETURN_IF_ERROR(Reserve(positions_, n * sizeof(int32_t)));
  RETURN_IF_ERROR(Reserve(slots_, n * sizeof(int64_t)));
  RETURN_IF_ERROR(Reserve(page_tables_, h_pages_.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(Reserve(logit_rows_, nl * sizeof(int32_t)));
  RETURN_IF_ERROR(Reserve(logits_, nl * vocab * sizeof(float)));
  RETURN_IF_ERROR(Reserve(seqs_, h_seqs_.size() * sizeof(AttentionSeq)));
  // Page-table pointers must point into backend memory.
  auto* dev_pages = static_cast<int32_t*>(page_tables_.data());
  for (size_t i = 0; i < h_seqs_.size(); ++i) h_seqs_[i].page_table = dev_pages + page_offsets[i];
  backend_.CopyToDevice(tokens_.data(), h_tokens_.data(), n * sizeof(int32_t));
  backend_.CopyToDevice(positions_.data(), h_positions_.data(), n * sizeof(int32_t));
  backend_.CopyToDevice(slots_.data(), h_slots_.data(), n * sizeof(int64_t));
  backend_.CopyToDevice(page_tables_.data(), h_pages_.data(), h_pages_.size() * sizeof(int32_t));
  backend_.CopyToDevice(logit_rows_.data(), h_logit_rows_.data(), nl * sizeof(int32_t));
  backend_.CopyToDevice(seqs_.data(), h_seqs_.data(), h_seqs_.size() * sizeof(AttentionSeq));

  ForwardBatch b;
  b.num_tokens = n;
  b.token_ids = static_cast<const int32_t*>(tokens_.data());
  b.positions = static_cast<const int32_t*>(positions_.data());
  b.kv_slots = static_cast<const int64_t*>(slots_.data());
  b.seqs = static_cast<const AttentionSeq*>(seqs_.data());
  b.num_seqs = static_cast<int32_t>(h_seqs_.size());
  b.logit_rows = static_cast<const int32_t*>(logit_rows_.data());
  b.num_logit_rows = static_cast<int32_t>(nl);
  Tensor out = logits_.AsTensor(DType::kF32, static_cast<int64_t>(nl), vocab);
  RETURN_IF_ERROR(model_.Forward(b, kv_, out));
  *logits = out;
  return OkStatus();
}

}  // namespace strata
