// ModelRunner: turns one scheduled step (which sequences, which of their
// tokens) into a ForwardBatch in backend memory, runs the model, and returns
// a view of the requested logits, left in backend memory (the engine samples
// them there: BatchSampler, and copies to the host only what it must). It
// owns the KV pool views, the per-step metadata buffer and its host staging
// (one copy a step), and the recordings of decode steps it replays
// (StepRecordingOptions), and nothing about request lifetimes: page tables
// belong to the sequences (the scheduler's side).
//
// Not thread-safe: the engine thread calls Run().
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <span>
#include <utility>
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

// The most one step may hold; the runner's per-step buffers are allocated
// once, at these sizes, so a step never allocates (on the GPU they are
// blocks of the static arena, sized by startup's memory plan).
struct RunnerLimits {
  int32_t max_batch_tokens = 0;  // rows of one step (the model's max_batch_tokens)
  int32_t max_seqs = 0;          // sequences of one step (--max-running-requests)
  // Rows of logits one step returns: one per sequence that samples, plus
  // the prompt-logprob rows (Scheduler's max_prompt_logit_rows); never more
  // than max_batch_tokens.
  int32_t max_logit_rows = 0;
  int64_t max_pages_per_seq = 0;  // ceil(context length / page size)
};

// Decode steps replayed from recordings (Backend::BeginRecording: CUDA
// graphs on a GPU) instead of issued op by op. A step is a candidate when
// every item is one token that wants logits (no prompt logprobs), it holds
// at most max_seqs sequences, the backend supports recording and the model's
// Forward is replayable. Its key is (sequences, max_kv_len hint); the hint
// of a candidate is the longest context rounded up to a power of two (at
// least 64: DecodeKvLenHint), so one recording serves every step until the
// context doubles, and eager and replayed candidates see the same hint
// (the same split counts, the same bits). A key's first step runs eagerly
// (any buffer the ops grow is grown then), its second is recorded and
// replayed, later ones are replayed. A recording that fails (EndRecording's
// error) marks its key eager for good.
struct StepRecordingOptions {
  bool enabled = true;
  int32_t max_seqs = 64;         // larger decode batches run eagerly
  int32_t max_recordings = 128;  // keys beyond this many run eagerly
};

// The max_kv_len hint of a replayable decode step whose longest context is
// kv_len: the next power of two >= max(kv_len, 64).
int32_t DecodeKvLenHint(int32_t kv_len);

// What the runner's recordings did so far (tests and logs).
struct StepRecordingStats {
  int64_t recorded = 0;      // recordings made
  int64_t replayed = 0;      // steps replayed (the recording's own step included)
  int64_t failed = 0;        // recordings the backend refused (keys now eager)
  int64_t dropped = 0;       // recordings the backend dropped (recorded again later)
  int64_t eager_decode = 0;  // candidate steps issued op by op
};

class ModelRunner {
 public:
  // Allocates the per-step buffers. Errors: the backend's (out of memory).
  static StatusOr<std::unique_ptr<ModelRunner>> Create(Model& model, Backend& backend, KvPool& pool,
                                                       const RunnerLimits& limits,
                                                       const StepRecordingOptions& recording = {});
  ~ModelRunner();

  // Backend bytes Create allocates for `limits` at vocabulary `vocab`, each
  // buffer rounded as the arena rounds it (ArenaBlockBytes): what startup's
  // device memory plan counts for the runner. `windowed`: the pool has a
  // window backing (its groups' own slots and page tables go up too).
  static uint64_t DeviceBytes(const RunnerLimits& limits, int64_t vocab, bool windowed = false);

  // Enqueues one forward step. On success *logits views, in backend
  // memory, for each item num_logit_rows() rows of vocab_size F32 (its
  // tokens' order), in item order; valid until the next Run(). The backend
  // may still be computing them: read them through backend ops
  // (SampleRows, CopyToHost), which run in issue order. A step beyond the
  // limits is an Internal error (a scheduler bug).
  // REQUIRES: the previous step has finished (Backend::Synchronize since its
  // Run): its arrays went up in one copy from a pinned staging buffer that
  // this Run overwrites, and a GPU reads such a copy's source when the copy
  // runs, not when it is issued.
  Status Run(std::span<const StepItem> items, Tensor* logits);

  int32_t max_batch_tokens() const { return limits_.max_batch_tokens; }
  const RunnerLimits& limits() const { return limits_; }
  int64_t vocab_size() const { return model_.config().vocab_size; }
  const StepRecordingStats& recording_stats() const { return rec_stats_; }

 private:
  ModelRunner(Model& model, Backend& backend, KvPool& pool, const RunnerLimits& limits,
              const StepRecordingOptions& recording);
  // Forward of a candidate step: replayed, recorded or issued (see
  // StepRecordingOptions).
  Status ForwardDecode(const ForwardBatch& b, Tensor logits);

  Model& model_;
  Backend& backend_;
  KvPool& pool_;
  RunnerLimits limits_;
  std::vector<KvLayerView> kv_;
  // The step's arrays (tokens, positions, slots, logit rows, AttentionSeq,
  // page tables) packed in one buffer, uploaded in one copy from stage_
  // (pinned when the backend pins); the logits.
  Buffer meta_, logits_;
  struct FreeStage {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], FreeStage> stage_;
  bool stage_pinned_ = false;
  // Host staging, reused every step.
  std::vector<int32_t> h_tokens_, h_positions_, h_pages_, h_logit_rows_;
  std::vector<int64_t> h_slots_, h_wslots_;
  std::vector<int32_t> h_wpages_;
  std::vector<AttentionSeq> h_seqs_, h_wseqs_;
  // Recorded decode steps. A key is (sequences, max_kv_len hint): every
  // other host-side input of Forward (num_tokens, num_logit_rows, the
  // buffers' addresses, kv_) is then the same.
  StepRecordingOptions rec_opts_;
  bool can_record_ = false;  // options, backend and model allow it
  struct KeyState {
    int32_t recording = -1;  // the backend's id, once recorded
    bool seen = false;       // ran once eagerly
    bool eager = false;      // its recording failed: never again
  };
  std::map<std::pair<int32_t, int32_t>, KeyState> keys_;
  int32_t num_recordings_ = 0;
  StepRecordingStats rec_stats_;
};

}  // namespace strata
