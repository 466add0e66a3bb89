// Engine: runs generation requests to completion over a paged KV pool with
// continuous batching. Each step is three calls, as in nano-vllm:
//   Schedule()    decide which sequences run and how many tokens each
//                 (decode tokens first, then prompt chunks, under a per-step
//                 token budget), reserving their KV pages;
//   runner.Run()  one forward pass over the whole batch;
//   Postprocess() sample, append, stream, finish and free pages.
// This version serves offline use (`strata generate`, benchmarks, parity
// tests) from one thread; the server wraps the same loop with an inbox.
//
// Greedy outputs do not depend on batch composition: every kernel computes a
// row from that row's data alone.
// Not thread-safe: one thread drives an Engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_pool.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "model/model_dir.h"

namespace strata {

struct EngineOptions {
  int32_t page_size = 16;
  // Tokens of KV the pool holds (0: enough for max_running_requests full
  // contexts, capped at 1 GiB of KV).
  int64_t max_total_tokens = 0;
  int32_t max_running_requests = 64;
  // Per-step token budget: prompt chunks are cut to fit (chunked prefill).
  int32_t chunked_prefill_size = 512;
  DType kv_dtype = DType::kF32;
  int64_t context_length = 0;  // 0: the model's max_position_embeddings
};

struct StepOutput {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top_logprobs;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  // Called after each generated token (optional), e.g. to stream text.
  std::function<void(const StepOutput&)> on_token;
};

struct GenerationResult {
  std::vector<int32_t> output;
  std::vector<StepOutput> steps;
  std::string finish_reason;  // "stop" (EOS / stop token) or "length"
  int64_t prompt_tokens = 0;
};

struct EngineStats {
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  double prefill_seconds = 0;  // steps that carried only prompt tokens
  double decode_seconds = 0;   // steps that carried only decode tokens
  double mixed_seconds = 0;
  int64_t steps = 0;
};

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(LoadedModel& model, Backend& backend,
                                                  const EngineOptions& options);
  ~Engine();

  // Runs every request to completion. Fails only on a request that can never
  // run (prompt longer than the context or the KV pool) or an internal error;
  // pages are freed either way.
  StatusOr<std::vector<GenerationResult>> Generate(std::vector<GenerationRequest> requests);

  const EngineStats& stats() const { return stats_; }
  const KvPool& pool() const { return *pool_; }
  int64_t context_length() const { return context_length_; }

 private:
  struct Sequence;
  Engine(LoadedModel& model, Backend& backend, const EngineOptions& options);
  bool Schedule(std::vector<Sequence*>& running, std::vector<StepItem>* items,
                std::vector<Sequence*>* item_seqs);
  void Postprocess(const std::vector<Sequence*>& item_seqs, const std::vector<StepItem>& items,
                   const std::vector<float>& logits);
  void Finish(Sequence& s, const char* reason);

  LoadedModel& model_;
  Backend& backend_;
  EngineOptions options_;
  int64_t context_length_ = 0;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<ModelRunner> runner_;
  EngineStats stats_;
};

}  // namespace strata
