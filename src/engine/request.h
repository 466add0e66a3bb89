// What flows between the server's I/O threads and the engine thread for one
// request: the request itself (EngineRequest) and its output channel
// (RequestHandle), shared by both sides.
//
// The engine appends generated tokens to the handle and calls its notifier;
// the I/O side takes them with Take(), detokenizes, matches stop strings and
// writes to the socket. Neither side ever blocks on the other: the notifier
// must only post work elsewhere (e.g. to the connection's executor).
// Cancel() (client gone, stop string seen, deadline) is picked up by the
// engine at its next step, which frees the request's pages.
//
// Thread-safety: RequestHandle is fully thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_constraint.h"
#include "util/status.h"

namespace strata {

class KvExport;  // engine/kv_handoff.h
class KvImport;

using SteadyTime = std::chrono::steady_clock::time_point;

// Why a request ended: decided by the engine, carried as this enum through
// the server, and turned into the OpenAI string only on the wire
// (FinishReasonName).
enum class FinishReason {
  kNone,    // not finished
  kStop,    // EOS or a stop token (stop strings: the server decides)
  kLength,  // max_tokens, the context length or the KV pool's capacity
  kAbort,   // cancelled (client gone), deadline, server shutdown
  kError,   // failed: RequestOutput::error says why (e.g. queue time limit)
};
// "stop", "length", "abort", "error"; nullptr for kNone (sent as null).
const char* FinishReasonName(FinishReason reason);

struct EngineRequest {
  std::string id;  // for logs and errors
  std::vector<int32_t> prompt;
  SamplingParams params;
  SteadyTime arrival = std::chrono::steady_clock::now();
  // Abort (FinishReason::kAbort) if not finished by then.
  SteadyTime deadline = SteadyTime::max();
  // Fail with Unavailable ("queue time limit") if prefill has not started by
  // then: a request that would wait longer is refused, not served late.
  SteadyTime queue_deadline = SteadyTime::max();
  // Called from the engine thread after new output is available. Must not
  // block. Optional.
  std::function<void()> notify;
  // Structured outputs (engine/token_constraint.h): the tokens each step may
  // sample; null: unconstrained. Owned by this request alone.
  std::shared_ptr<TokenConstraint> constraint;
  // PD disaggregation (engine/kv_handoff.h): a prefill server's request
  // sends its KV to a decode (kv_export); a decode server's receives it
  // (kv_import). At most one is set; neither for colocated serving.
  std::shared_ptr<KvExport> kv_export;
  std::shared_ptr<KvImport> kv_import;
  // vLLM's prompt_logprobs: -1 none; N >= 0: the logprob of every prompt
  // token after the first (given the tokens before it), with its rank and
  // the top N alternatives, computed in the prefill. The prompt is then
  // computed whole: its cached prefix has no logits, so the prefix cache
  // is not read for it (its pages are still cached for others).
  int prompt_logprobs = -1;
};

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0;  // filled when params.logprobs >= 0
  std::vector<TokenLogprob> top;
};

// One prompt token's logprob (EngineRequest::prompt_logprobs): raw
// log_softmax of the logits before it, as for generated tokens.
struct PromptLogprob {
  int32_t id = 0;
  float logprob = 0;
  int64_t rank = 0;  // tokens with logprob >= this one's, itself included (vLLM's rank)
  std::vector<TokenLogprob> top;
};

// Everything a handle accumulated since the last Take().
struct RequestOutput {
  // Prompt tokens 1.. in order (prompt_logprobs), before the first token.
  std::vector<PromptLogprob> prompt_logprobs;
  std::vector<GeneratedToken> tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status error;  // set when the request failed (e.g. queue timeout: kUnavailable)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache
  int64_t completion_tokens = 0;  // total so far
  bool started = false;           // the engine began computing this request
  SteadyTime started_at;          // when prefill started (valid when started)
};

class RequestHandle {
 public:
  explicit RequestHandle(std::function<void()> notify = nullptr) : notify_(std::move(notify)) {}

  // Asks the engine to stop this request; idempotent.
  void Cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // Consumer side: takes what accumulated (tokens move out; the flags and
  // counters are copied).
  RequestOutput Take();
  bool finished() const;

  // Engine side.
  void Push(GeneratedToken token);
  void PushPromptLogprobs(std::vector<PromptLogprob> logprobs);
  void SetStarted(int64_t prompt_tokens, int64_t cached_tokens);
  void Finish(FinishReason reason, Status error = OkStatus());

 private:
  void Notify() {
    if (notify_) notify_();
  }
  mutable std::mutex mu_;
  RequestOutput pending_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> notify_;
};

}  // namespace strata
