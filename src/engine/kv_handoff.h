// The engine's seam for PD disaggregation: where a prefill server's
// computed KV pages go (KvExport) and where a decode server's come from
// (KvImport). The engine speaks page ids of its own pool only; disagg/
// implements both over the bootstrap connection and the KV transport, so
// nothing in engine/ knows about sockets. Null on an EngineRequest (the
// default) means colocated serving, unchanged.
//
// Prefill request with a KvExport:
//   kWaiting: not admitted while !Ready() (the decode has not said where to
//     write yet: the bootstrap wait); still counts as queued for admission
//     control. Poll() kFailed there (bootstrap timeout, the decode rejected
//     or went away) finishes it with that error.
//   kPrefilling: after each step, PagesComputed() with the prompt pages that
//     became whole (in order, each page once).
//   first token sampled: Complete() with the remaining prompt pages (the
//     last, partial one included) and the token; the request enters
//     kTransferring, holding its pages (writes still read them) until Poll()
//     says kDone (the decode has the KV and the token) or kFailed.
//   cancelled / deadline / error anywhere: Abort(why); the request ends at
//     once (the pages are only read by writes to a room that is failed).
//
// Decode request with a KvImport:
//   kWaiting -> admission: prefix match on the decode's own cache, pages
//     for the whole prompt reserved without preempting anyone (none: the
//     request fails at once, Unavailable "kv_full: ..."), then Reserved()
//     with the pages the prefill must fill; the request enters kAwaitingKv.
//   kAwaitingKv: Poll() each step. kDone: the prompt is computed, the first
//     token is appended (and pushed to the handle) and the request decodes
//     on. kFailed: it ends with that error; nothing of it is cached.
//   cancelled / deadline: Abort(why), and the request stays in kAwaitingKv,
//     holding its pages, until Poll() says kFailed — which the import must
//     only say once no remote write can land in those pages any more (the
//     prefill acknowledged, or is gone) — so a freed page is never written.
//
// Thread-safety: the engine calls these on its thread only; implementations
// synchronise with their own I/O threads internally. None may block.
#pragma once

#include <cstdint>
#include <span>

#include "engine/sampler.h"
#include "util/status.h"

namespace strata {

enum class FinishReason;

enum class HandoffState { kPending, kDone, kFailed };

// The prefill's first token and what the decode needs with it.
struct FirstToken {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top_logprobs;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prefix-cache hits on the prefill
  // The first token already ended the request (EOS, a stop token, or the
  // length limit): kStop / kLength; kNone otherwise.
  FinishReason finish{};
};

class KvExport {
 public:
  virtual ~KvExport() = default;
  // The decode's pages are known: the request may be admitted.
  virtual bool Ready() = 0;
  // pages[i] is the local page holding prompt page first_page + i (whole pages).
  virtual void PagesComputed(int64_t first_page, std::span<const int32_t> pages) = 0;
  // The prompt is computed and the first token sampled; pages as above,
  // through the prompt's last (possibly partial) page.
  virtual void Complete(int64_t first_page, std::span<const int32_t> pages,
                        const FirstToken& first) = 0;
  // kFailed: *error says why (a FailureReason name leads the message).
  virtual HandoffState Poll(Status* error) = 0;
  virtual void Abort(const Status& why) = 0;
};

class KvImport {
 public:
  virtual ~KvImport() = default;
  // The local pages for prompt pages [first_page, first_page + pages.size())
  // are reserved (pages before first_page are decode-side cache hits).
  virtual void Reserved(int64_t first_page, std::span<const int32_t> pages,
                        int64_t prompt_tokens) = 0;
  // kDone: *first is filled. kFailed: *error says why, and nothing writes
  // into the reserved pages any more.
  virtual HandoffState Poll(FirstToken* first, Status* error) = 0;
  virtual void Abort(const Status& why) = 0;
};

}  // namespace strata
