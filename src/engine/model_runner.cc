#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace strata {

namespace {

// Bytes of each per-step buffer, in member order: tokens, positions, slots,
// page tables, logit rows, logits, sequences.
std::vector<uint64_t> BufferBytes(const RunnerLimits& l, int64_t vocab) {
  const uint64_t t = static_cast<uint64_t>(std::max(1, l.max_batch_tokens));
  const uint64_t s = static_cast<uint64_t>(std::max(1, l.max_seqs));
  const uint64_t r = static_cast<uint64_t>(std::max(1, l.max_logit_rows));
  const uint64_t pages = s * static_cast<uint64_t>(std::max<int64_t>(1, l.max_pages_per_seq));
  return {t * sizeof(int32_t), t * sizeof(int32_t), t * sizeof(int64_t), pages * sizeof(int32_t),
          r * sizeof(int32_t), r * static_cast<uint64_t>(vocab) * sizeof(float),
          s * sizeof(AttentionSeq)};
}

}  // namespace

uint64_t ModelRunner::DeviceBytes(const RunnerLimits& limits, int64_t vocab) {
  uint64_t total = 0;
  for (uint64_t b : BufferBytes(limits, vocab)) total += ArenaBlockBytes(b);
  return total;
}

ModelRunner::ModelRunner(Model& model, Backend& backend, KvPool& pool, const RunnerLimits& limits)
    : model_(model), backend_(backend), pool_(pool), limits_(limits) {
  const KvLayout& layout = pool.layout();
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
    for (int l = 0; l < layout.groups[g].num_layers; ++l) kv_.push_back(pool.Layer(g, l));
}

StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(Model& model, Backend& backend,
                                                           KvPool& pool,
                                                           const RunnerLimits& limits) {
  if (limits.max_batch_tokens < 1 || limits.max_seqs < 1 || limits.max_logit_rows < 1 ||
      limits.max_pages_per_seq < 1)
    return InvalidArgument("ModelRunner: every limit must be >= 1");
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, backend, pool, limits));
  const std::vector<uint64_t> bytes = BufferBytes(limits, model.config().vocab_size);
  Buffer* bufs[] = {&r->tokens_,     &r->positions_, &r->slots_, &r->page_tables_,
                    &r->logit_rows_, &r->logits_,    &r->seqs_};
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto b = backend.Allocate(bytes[i]);
    if (!b.ok())
      return b.status().Annotate("allocating the per-step buffers (" + std::to_string(bytes[i]) +
                                 " bytes)");
    *bufs[i] = std::move(b).value();
  }
  return r;
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
  const int64_t vocab = vocab_size();
  const size_t nl = h_logit_rows_.size();
  const RunnerLimits& lim = limits_;
  if (n > lim.max_batch_tokens || h_seqs_.size() > static_cast<size_t>(lim.max_seqs) ||
      nl > static_cast<size_t>(lim.max_logit_rows) ||
      h_pages_.size() * sizeof(int32_t) > page_tables_.bytes())
    return Internal("ModelRunner: a step of " + std::to_string(n) + " tokens, " +
                    std::to_string(h_seqs_.size()) + " sequences, " + std::to_string(nl) +
                    " logit rows and " + std::to_string(h_pages_.size()) +
                    " page-table entries exceeds the runner's limits (" +
                    std::to_string(lim.max_batch_tokens) + ", " + std::to_string(lim.max_seqs) +
                    ", " + std::to_string(lim.max_logit_rows) + ", " +
                    std::to_string(page_tables_.bytes() / sizeof(int32_t)) + ")");
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
  for (const AttentionSeq& s : h_seqs_) b.max_kv_len = std::max(b.max_kv_len, s.kv_len);
  Tensor out = logits_.AsTensor(DType::kF32, static_cast<int64_t>(nl), vocab);
  RETURN_IF_ERROR(model_.Forward(b, kv_, out));
  *logits = out;
  return OkStatus();
}

}  // namespace strata
