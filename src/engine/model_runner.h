// ModelRunner: turns one scheduled step (which sequences, which of their
// tokens) into a ForwardBatch in backend memory, runs the model, and returns
// a view of the requested logits, left in backend memory (the engine samples
// them there: BatchSampler, and copies to the host only what it must). It owns the KV pool views and the
// per-step metadata staging buffers, and nothing about request lifetimes:
// page tables belong to the sequences (the scheduler's side).
//
// Not thread-safe: the engine thread calls Run().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_pool.h"
#include "cache/page_table.h"
#include "model/model.h"

namespace strata {

// One sequence's part of a step: tokens[0..num_tokens) at positions
// start_pos.. are computed; their KV is written into `table`'s slots.
// REQUIRES: table->capacity() >= start_pos + num_tokens, and positions
// [0, start_pos) already hold this sequence's KV.
struct StepItem {
  const PageTable* table = nullptr;
  const int32_t* tokens = nullptr;
  int32_t num_tokens = 0;
  int32_t start_pos = 0;
  bool want_logits = false;  // logits of the last token of this chunk (to sample)
  // Logits of every token of this chunk (prompt logprobs: position p scores
  // token p + 1). With want_logits, the last of these rows is the one to
  // sample from.
  bool prompt_logits = false;
  // Rows of logits this item gets.
  int32_t num_logit_rows() const { return prompt_logits ? num_tokens : want_logits ? 1 : 0; }
};

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend, KvPool& pool, int32_t max_batch_tokens);

  // Enqueues one forward step. On success *logits views, in backend memory,
  // for each item num_logit_rows() rows of vocab_size F32 (its tokens'
  // order), in item order; valid until the next Run(). The backend may still
  // be computing them: read them through backend ops (SampleRows,
  // CopyToHost), which run in issue order.
  Status Run(std::span<const StepItem> items, Tensor* logits);

  int32_t max_batch_tokens() const { return max_batch_tokens_; }
  int64_t vocab_size() const { return model_.config().vocab_size; }

 private:
  // Grows `buf` to at least `bytes`.
  Status Reserve(Buffer& buf, size_t bytes);

  Model& model_;
  Backend& backend_;
  KvPool& pool_;
  int32_t max_batch_tokens_;
  std::vector<KvLayerView> kv_;
  Buffer tokens_, positions_, slots_, page_tables_, logit_rows_, logits_, seqs_;
  // Host staging, reused every step.
  std::vector<int32_t> h_tokens_, h_positions_, h_pages_, h_logit_rows_;
  std::vector<int64_t> h_slots_;
  std::vector<AttentionSeq> h_seqs_;
};

}  // namespace strata
