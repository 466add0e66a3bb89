#include "engine/request.h"

namespace strata {

RequestOutput RequestHandle::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  RequestOutput out;
  out.prompt_logprobs = std::move(pending_.prompt_logprobs);
  pending_.prompt_logprobs.clear();
  out.tokens = std::move(pending_.tokens);
  pending_.tokens.clear();
  out.finished = pending_.finished;
  out.finish_reason = pending_.finish_reason;
  out.error = pending_.error;
  out.prompt_tokens = pending_.prompt_tokens;
  out.cached_tokens = pending_.cached_tokens;
  out.completion_tokens = pending_.completion_tokens;
  out.started = pending_.started;
  out.started_at = pending_.started_at;
  return out;
}

bool RequestHandle::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.finished;
}

void RequestHandle::Push(GeneratedToken token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.tokens.push_back(std::move(token));
    pending_.completion_tokens++;
  }
  Notify();
}

// No notification: the prompt's last chunk also samples the first token,
// whose Push() notifies; until then the consumer has nothing to send.
void RequestHandle::PushPromptLogprobs(std::vector<PromptLogprob> logprobs) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& v = pending_.prompt_logprobs;
  v.insert(v.end(), std::make_move_iterator(logprobs.begin()),
           std::make_move_iterator(logprobs.end()));
}

void RequestHandle::SetStarted(int64_t prompt_tokens, int64_t cached_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.started = true;
  pending_.started_at = std::chrono::steady_clock::now();
  pending_.prompt_tokens = prompt_tokens;
  pending_.cached_tokens = cached_tokens;
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return nullptr;
}

void RequestHandle::Finish(FinishReason reason, Status error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.finished) return;
    pending_.finished = true;
    pending_.finish_reason = reason;
    pending_.error = std::move(error);
  }
  Notify();
}

}  // namespace strata
