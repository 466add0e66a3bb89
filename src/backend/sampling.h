// The sampling seam between the engine and a backend: Backend::SampleRows
// picks the next token of many logits rows where the logits live (on the
// GPU for the CUDA backend), so only the small results cross to the host.
//
// The semantics are the host Sampler's (engine/sampler.h is the spec: order
// of operations, raw logprobs, masks, logit_bias, penalties, greedy ties to
// the lowest id, top-k -> top-p -> min-p in HF order, inverse CDF in double).
// A backend either reproduces them or hands the row to the HostRowSampler,
// which runs the host Sampler itself:
//   - the CPU backend hands every row over (logits are host memory: no copy),
//     so CPU sampling is the host Sampler, bit for bit;
//   - the CUDA backend runs kernels and hands over, after copying the row's
//     logits to the host, only the rows its kernels cannot finish
//     (cuda_backend.cc lists when).
// Randomness never lives in a backend: the caller draws each non-greedy
// row's uniform from the request's own RNG before the call (exactly once,
// as the host Sampler would), so a seed gives the same stream on every
// backend.
//
// Plain data only (no engine types), so backends need not know the engine.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace strata {

// OpenAI's top_logprobs limit and vLLM's default --max-logprobs.
inline constexpr int kMaxLogprobs = 20;
// Temperatures below this are greedy (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.f;
};

struct SampleResult {
  int32_t token_id = 0;
  // Filled only when logprobs were asked for (raw log_softmax):
  float logprob = 0.f;  // of token_id
  int64_t rank = 0;     // tokens with logprob >= this one's, itself included (vLLM's rank)
  std::vector<TokenLogprob> top_logprobs;  // top N, logprob desc, ties by lower id
};

// One distinct token of a request's prompt or output, as the penalties see
// it (TokenHistory keeps these): repetition_penalty applies to every entry,
// frequency/presence only where output_count > 0.
struct PenaltyToken {
  int32_t token_id = 0;
  int32_t output_count = 0;
};

// One row of a SampleRows call. The spans are host memory, valid for the
// call. Values are those of a validated SamplingParams.
struct SampleRowParams {
  int64_t logit_row = 0;    // row of the logits tensor
  float temperature = 1.f;  // < kGreedyTemperature: greedy
  int32_t top_k = -1;       // <= 0: off
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  // The row's draw in [0, 1) from the request's RNG; ignored when greedy.
  double uniform = 0;
  int32_t logprobs = -1;  // -1: none; N in [0, kMaxLogprobs]: the token's plus the top N
  // LogitMask: empty allowed = every token; else one bit per id (bit id % 32
  // of word id / 32; ids past the words are not allowed). banned: never these.
  std::span<const uint32_t> allowed;
  std::span<const int32_t> banned;
  std::span<const std::pair<int32_t, float>> logit_bias;  // applied in order
  // Empty unless a penalty is set (distinct ids; ids outside the vocabulary
  // are ignored).
  std::span<const PenaltyToken> penalties;
};

// What a backend calls for a row it does not sample itself.
class HostRowSampler {
 public:
  virtual ~HostRowSampler() = default;
  // Row i of the call (its index in the `rows` span), sampled on the host
  // from `logits` (vocab floats of host memory, valid for the call) with
  // the row's own uniform, exactly as engine/sampler.h specifies.
  virtual SampleResult SampleOnHost(size_t i, const float* logits) = 0;
};

}  // namespace strata
