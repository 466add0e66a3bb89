// A per-request restriction on which tokens may come next: what the engine
// sees of structured outputs (response_format, guided_*, forced tool calls).
// The engine knows nothing of JSON or grammars: before sampling it asks the
// request's constraint for the allowed tokens and masks the rest; after
// choosing a token it tells the constraint. src/constrain/ implements it.
//
// PD disaggregation: the prefill samples the first token under the
// constraint, the decode builds the same constraint from the same request
// and advances it over the first token it receives, then masks the rest.
//
// Thread-safety: a constraint belongs to one request and is called by one
// thread at a time: the engine thread, or the engine's mask worker between
// the engine's handoffs to it (engine/host_worker.h), never both at once. It
// may share caches with other requests' constraints; those are internally
// synchronised.
#pragma once

#include <cstdint>
#include <span>

namespace strata {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens allowed next, one bit per token id (bit id % 32 of word
  // id / 32; ids beyond the words are not allowed). tokens_left: output
  // tokens this request may still produce, this one included, so the
  // constraint can close its structure in time. Valid until the next call
  // on this constraint. Never all zero.
  virtual std::span<const uint32_t> Allowed(int64_t tokens_left) = 0;
  // The token chosen next (sampled here, or by the PD prefill).
  virtual void Advance(int32_t token) = 0;
};

}  // namespace strata
