// Sampling the next token from one request's F32 logits, on the host.
//
// Order of operations (vLLM / Hugging Face semantics):
//   1. logprobs, if asked, from the RAW logits: log_softmax before any
//      penalty or temperature. This is vLLM's default (--logprobs-mode
//      raw_logprobs, since the V1 engine); its old V0 engine and HF's
//      output_scores report processed values instead.
//   1b. the step's LogitMask (a token constraint's allowed set; the tokens
//      min_tokens bans) sets the other logits to -inf, then logit_bias adds
//      its biases (OpenAI/vLLM: before penalties and temperature).
//   2. repetition_penalty (HF/CTRL style) over every token seen in the prompt
//      AND the output: a positive logit is divided by the penalty, a
//      negative one multiplied. Applied once per distinct token.
//   3. frequency_penalty * count + presence_penalty * (count > 0) subtracted
//      (OpenAI style), counting OUTPUT tokens only.
//   4. temperature < 1e-5 (vLLM's epsilon) means greedy: argmax of the
//      penalized logits, ties to the lowest token id; nothing below runs and
//      no random number is drawn.
//   5. logits / temperature, then top-k, top-p, min-p in that order, each
//      over the distribution the previous step left, as HF's
//      TemperatureLogitsWarper -> TopK -> TopP -> MinP chain does:
//      - top_k keeps every token whose logit is >= the k-th largest (ties
//        at the boundary all stay, as in HF and vLLM);
//      - top_p keeps a token when the probability mass of the tokens before
//        it (descending probability, ties by lower id) is < top_p, so the
//        smallest prefix whose mass reaches top_p, renormalised after top-k;
//      - min_p keeps tokens with p >= min_p * p_max.
//      vLLM applies min_p before top-k/top-p; SGLang applies top-p to the
//      mass before top-k. These differ only in which tail tokens survive
//      when several filters are combined; Strata follows HF.
//   6. one uniform draw from the request's own RNG, inverse CDF over the
//      kept tokens (in double precision).
//
// Reproducibility: each request owns a Sampler and so its RNG, which
// advances exactly once per non-greedy Sample(). The same seed, params and
// logits give the same tokens whatever else is in the batch, on any machine
// (the generator and the double conversion are Strata's, not the C++
// library's implementation-defined distributions).
//
// Cost for a vocabulary V (measured by sampler_bench at V = 151,936: about
// 0.1 ms greedy, 0.4-0.6 ms with filters, per token on one core): a few
// vectorised O(V) passes (max, masked exp weights, log-sum-exp) and no
// full-vocabulary sort. top-k: a k-entry heap that skips whole vectors
// (nth_element for k > 1024). top-p: tokens collected by falling weight
// bands until the mass suffices, so only that prefix is sorted. Penalties:
// one copy plus O(distinct history tokens).
//
// This file is also the spec of Backend::SampleRows (backend/sampling.h):
// the engine samples through it (engine/batch_sampler.h), the CPU backend
// by running this code, the CUDA backend with kernels that reproduce it.
//
// Thread-safety: a Sampler is used by one thread at a time (it keeps
// scratch buffers); different requests' Samplers are independent.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/sampling.h"  // kMaxLogprobs, SampleResult, PenaltyToken
#include "util/status.h"

namespace strata {

struct SamplingParams {
  float temperature = 1.f;              // < kGreedyTemperature (e.g. 0): greedy
  int top_k = -1;                       // -1 or 0: off
  float top_p = 1.f;                    // (0, 1]; 1: off
  float min_p = 0.f;                    // [0, 1]; 0: off
  float repetition_penalty = 1.f;       // > 0; 1: off. Prompt and output tokens.
  float frequency_penalty = 0.f;        // [-2, 2]; output tokens only
  float presence_penalty = 0.f;         // [-2, 2]; output tokens only
  std::optional<uint64_t> seed;         // unset: a random seed per request
  std::vector<int32_t> stop_token_ids;  // finish on these (besides EOS), enforced by the engine
  bool ignore_eos = false;              // keep generating past EOS, enforced by the engine
  // OpenAI logit_bias: added to these tokens' logits, each in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM min_tokens: EOS and stop_token_ids are not sampled before this
  // many output tokens, enforced by the engine (a LogitMask ban).
  int min_tokens = 0;
  int logprobs = -1;    // -1: none; N >= 0: the sampled token's logprob plus the top N
  int max_tokens = 16;  // output tokens at most (vLLM's default), enforced by the engine

  bool IsGreedy() const { return temperature < kGreedyTemperature; }
  // True when Sample() reads the TokenHistory; the engine may skip keeping
  // one otherwise.
  bool UsesPenalties() const {
    return repetition_penalty != 1.f || frequency_penalty != 0.f || presence_penalty != 0.f;
  }
  // Anything that rewrites the logits before sampling (a copy is made).
  bool AdjustsLogits() const { return UsesPenalties() || !logit_bias.empty(); }
  // Every out-of-range field in one InvalidArgument naming the fields (with
  // their OpenAI/vLLM names) and the allowed range; OK otherwise.
  Status Validate() const;
};

// What the penalties need from a request's tokens: each distinct token of
// the prompt or the output, with how often the output holds it. Updated
// incrementally (AddOutputToken per generated token) so sampling never
// rescans the sequence; kept as a flat array that a device sampler reads
// as it is (SampleRowParams::penalties). Ids need not be < vocab: Sample()
// ignores ids outside the logits.
class TokenHistory {
 public:
  TokenHistory() = default;
  explicit TokenHistory(std::span<const int32_t> prompt) { AddPromptTokens(prompt); }

  // For chunked prompts: call once per chunk, in any order.
  void AddPromptTokens(std::span<const int32_t> tokens);
  void AddOutputToken(int32_t token);

  // Distinct tokens, in first-seen order.
  std::span<const PenaltyToken> tokens() const { return tokens_; }
  int64_t num_output_tokens() const { return num_output_tokens_; }

 private:
  PenaltyToken& Entry(int32_t token);

  std::vector<PenaltyToken> tokens_;
  std::unordered_map<int32_t, size_t> index_;  // token id -> its entry in tokens_
  int64_t num_output_tokens_ = 0;
};

// Steps 2 and 3 above, in place: the penalties of params over history.
// Ids in history outside [0, vocab) are ignored.
void ApplyPenalties(const SamplingParams& params, const TokenHistory& history, float* logits,
                    int64_t vocab);

struct TokenProb {
  int32_t token_id = 0;
  double prob = 0;
};

// Raw logprobs (step 1 above) of token_id under logits, with its rank and
// the top `top` alternatives: what Sample() reports for the token it picked,
// for any token (prompt logprobs score the prompt's own tokens).
// REQUIRES: vocab >= 1; 0 <= token_id < vocab; top <= kMaxLogprobs.
void ComputeTokenLogprobs(const float* logits, int64_t vocab, int32_t token_id, int top,
                          SampleResult* out);

// What the engine restricts in one step (step 1b above).
struct LogitMask {
  // Empty: every token; else one bit per token id (bit id % 32 of word
  // id / 32; ids past the words are not allowed): TokenConstraint::Allowed.
  std::span<const uint32_t> allowed;
  std::span<const int32_t> banned;  // never these (min_tokens: EOS, stop ids)
  bool empty() const { return allowed.empty() && banned.empty(); }
};

class Sampler {
 public:
  // Seed: params.seed if set; else default_seed if set (an engine started
  // with a global seed passes a distinct one per request, so whole runs
  // replay); else a random seed.
  // REQUIRES: params.Validate() is OK.
  Sampler(const SamplingParams& params, std::optional<uint64_t> default_seed);

  // Picks the next token: NextDraw() then SampleWithDraw(). history is read
  // only when params.UsesPenalties().
  // Logits that are NaN never win; if no logit is finite the result is the
  // greedy argmax (token 0 when all are -inf or NaN) or, under a mask, the
  // lowest allowed id: a masked-out token is never returned while the mask
  // allows any.
  // REQUIRES: vocab >= 1; logits has vocab entries.
  SampleResult Sample(const float* logits, int64_t vocab, const TokenHistory& history,
                      const LogitMask& mask = {});

  // Sample() split at its one random number, for the device seam
  // (backend/sampling.h): NextDraw() advances the stream as Sample() would
  // (a uniform in [0, 1) when non-greedy; 0 and no advance when greedy),
  // and SampleWithDraw() is Sample() given that number, drawing nothing.
  double NextDraw() { return params_.IsGreedy() ? 0.0 : NextUniform(); }
  SampleResult SampleWithDraw(const float* logits, int64_t vocab, const TokenHistory& history,
                              const LogitMask& mask, double uniform);

  // The distribution a non-greedy Sample() would draw from (steps 2-5):
  // the kept tokens with their renormalised probabilities, in draw order.
  // Draws nothing. For tests and debugging; greedy params give the argmax
  // with probability 1.
  std::vector<TokenProb> Distribution(const float* logits, int64_t vocab,
                                      const TokenHistory& history, const LogitMask& mask = {});

  // Advances the random stream past one Sample() that happened elsewhere
  // (PD: the prefill sampled the first token with the same seed), so a
  // seeded request draws the same tokens as when served in one process.
  void SkipSample() { (void)NextDraw(); }

  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }

 private:
  struct Candidate {
    int32_t id;
    float weight;  // exp((logit - max) / temperature), unnormalised
  };

  // xoshiro256** seeded through splitmix64: small, fast, fully specified.
  uint64_t NextU64();
  double NextUniform();  // [0, 1) with 53 random bits

  // Masked, biased and penalized logits: logits itself when none of that
  // applies, else a copy.
  const float* Adjust(const float* logits, int64_t vocab, const TokenHistory& history,
                      const LogitMask& mask);

  // The tokens temperature/top-k/top-p/min-p keep, with unnormalised
  // weights exp((logit - max) / temperature). Dense: weights_[i] for every
  // token (0 when removed). Sparse (top-p): candidates_[0 .. count), in
  // draw order. none: no logit is finite (the caller takes the argmax).
  struct Kept {
    bool none = false;
    bool dense = true;
    size_t count = 0;  // sparse only
    double mass = 0;   // sum of the kept weights
  };
  Kept BuildCandidates(const float* x, int64_t vocab);
  // The kept token at cumulative mass target (0 <= target < kept.mass).
  int32_t Draw(const Kept& kept, double target) const;
  void ComputeLogprobs(const float* logits, int64_t vocab, SampleResult* out);

  SamplingParams params_;
  uint64_t seed_ = 0;
  uint64_t rng_[4] = {};
  // Scratch reused across steps (grown to the vocabulary on first use).
  std::vector<float> penalized_;
  std::vector<float> values_;       // top-k selection for large k
  std::vector<float> weights_;      // dense weights, padded to whole vectors
  std::vector<double> block_mass_;  // sums of weights_ per kWeightBlock tokens
  std::vector<Candidate> candidates_;
};

}  // namespace strata
