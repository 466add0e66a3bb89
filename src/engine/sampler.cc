#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "util/logging.h"

namespace strata {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Index of the largest logit, lowest id on ties; NaN never wins. 0 when no
// entry compares (all NaN).
int32_t Argmax(const float* x, int64_t vocab) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(std::max<int64_t>(best, 0));
}

// True when token a (value va) ranks before token b: larger value, then
// lower id.
inline bool RanksBefore(float va, int32_t a, float vb, int32_t b) { return va > vb || (va == vb && a < b); }

}  // namespace

Status SamplingParams::Validate() const {
  std::vector<std::string> problems;
  auto bad = [&](std::string s) { problems.push_back(std::move(s)); };
  if (!(temperature >= 0.f) || std::isinf(temperature)) {
    bad("temperature " + std::to_string(temperature) + " must be >= 0 (0 is greedy)");
  }
  if (top_k < -1) bad("top_k " + std::to_string(top_k) + " must be -1 or 0 (off) or >= 1");
  if (!(top_p > 0.f && top_p <= 1.f)) bad("top_p " + std::to_string(top_p) + " must be in (0, 1]");
  if (!(min_p >= 0.f && min_p <= 1.f)) bad("min_p " + std::to_string(min_p) + " must be in [0, 1]");
  if (!(repetition_penalty > 0.f) || std::isinf(repetition_penalty)) {
    bad("repetition_penalty " + std::to_string(repetition_penalty) + " must be > 0 (1 is off)");
  }
  if (!(frequency_penalty >= -2.f && frequency_penalty <= 2.f)) {
    bad("frequency_penalty " + std::to_string(frequency_penalty) + " must be in [-2, 2]");
  }
  if (!(presence_penalty >= -2.f && presence_penalty <= 2.f)) {
    bad("presence_penalty " + std::to_string(presence_penalty) + " must be in [-2, 2]");
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    bad("logprobs " + std::to_string(logprobs) + " must be in [0, " + std::to_string(kMaxLogprobs) +
        "] (or absent)");
  }
  if (max_tokens < 1) bad("max_tokens " + std::to_string(max_tokens) + " must be >= 1");
  if (problems.empty()) return OkStatus();
  std::string msg = "invalid sampling parameters: ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  return InvalidArgument(msg);
}

void TokenHistory::AddPromptTokens(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) counts_[t].in_prompt = true;
}

void TokenHistory::AddOutputToken(int32_t token) {
  ++counts_[token].output_count;
  ++num_output_tokens_;
}

Sampler::Sampler(const SamplingParams& params, std::optional<uint64_t> default_seed) : params_(params) {
  if (params.seed) {
    seed_ = *params.seed;
  } else if (default_seed) {
    seed_ = *default_seed;
  } else {
    std::random_device rd;
    seed_ = (uint64_t{rd()} << 32) ^ rd();
  }
  uint64_t s = seed_;
  for (uint64_t& word : rng_) word = SplitMix64(&s);
}

uint64_t Sampler::NextU64() {
  const uint64_t result = Rotl(rng_[1] * 5, 7) * 9;
  const uint64_t t = rng_[1] << 17;
  rng_[2] ^= rng_[0];
  rng_[3] ^= rng_[1];
  rng_[1] ^= rng_[2];
  rng_[0] ^= rng_[3];
  rng_[2] ^= t;
  rng_[3] = Rotl(rng_[3], 45);
  return result;
}

double Sampler::NextUniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

void ApplyPenalties(const SamplingParams& params, const TokenHistory& history, float* logits, int64_t vocab) {
  const float rep = params.repetition_penalty;
  for (const auto& [token, c] : history.counts()) {
    if (token < 0 || token >= vocab) continue;
    float& l = logits[token];
    // Every entry was seen in the prompt or the output: the repetition
    // penalty applies to all of them.
    if (rep != 1.f) l = l > 0.f ? l / rep : l * rep;
    if (c.output_count > 0) {
      l -= params.frequency_penalty * static_cast<float>(c.output_count);
      l -= params.presence_penalty;
    }
  }
}

const float* Sampler::Penalize(const float* logits, int64_t vocab, const TokenHistory& history) {
  if (!params_.UsesPenalties() || history.counts().empty()) return logits;
  penalized_.assign(logits, logits + vocab);
  ApplyPenalties(params_, history, penalized_.data(), vocab);
  return penalized_.data();
}

SampleResult Sampler::Sample(const float* logits, int64_t vocab, const TokenHistory& history) {
  STRATA_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max()) << "vocab " << vocab;
  const float* x = Penalize(logits, vocab, history);
  SampleResult result;
  if (params_.IsGreedy()) {
    result.token_id = Argmax(x, vocab);
  } else {
    // One draw per call, whatever path runs below, so a seeded request's
    // stream depends only on its own steps.
    const double u = NextUniform();
    const size_t kept = BuildCandidates(x, vocab);
    if (kept == 0) {
      result.token_id = Argmax(x, vocab);
    } else {
      double total = 0;
      for (size_t i = 0; i < kept; ++i) total += candidates_[i].weight;
      const double target = u * total;
      double cum = 0;
      result.token_id = candidates_[kept - 1].id;  // if rounding puts target on the sum
      for (size_t i = 0; i < kept; ++i) {
        cum += candidates_[i].weight;
        if (target < cum) {
          result.token_id = candidates_[i].id;
          break;
        }
      }
    }
  }
  if (params_.logprobs >= 0) ComputeLogprobs(logits, vocab, &result);
  return result;
}

std::vector<TokenProb> Sampler::Distribution(const float* logits, int64_t vocab, const TokenHistory& history) {
  STRATA_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max()) << "vocab " << vocab;
  const float* x = Penalize(logits, vocab, history);
  const size_t kept = params_.IsGreedy() ? 0 : BuildCandidates(x, vocab);
  if (kept == 0) return {TokenProb{Argmax(x, vocab), 1.0}};
  double total = 0;
  for (size_t i = 0; i < kept; ++i) total += candidates_[i].weight;
  std::vector<TokenProb> out;
  out.reserve(kept);
  for (size_t i = 0; i < kept; ++i) out.push_back({candidates_[i].id, candidates_[i].weight / total});
  return out;
}

size_t Sampler::BuildCandidates(const float* x, int64_t vocab) {
  float max = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) max = x[i] > max ? x[i] : max;  // NaN never > max
  if (!std::isfinite(max)) return 0;
  const float inv_t = 1.f / params_.temperature;

  // top-k: the k-th largest logit is the threshold; ties with it stay.
  float kth = kNegInf;
  const int64_t k = params_.top_k;
  if (k > 0 && k < vocab) {
    values_.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) values_[i] = std::isnan(x[i]) ? kNegInf : x[i];
    std::nth_element(values_.begin(), values_.begin() + (k - 1), values_.end(), std::greater<float>());
    kth = values_[k - 1];
  }

  // Candidates: the top-k set minus what min-p removes. min-p compares
  // p_i / p_max = weight_i, which renormalisation by top-k and top-p does not
  // change, so it can filter here although it applies last. top-p needs the
  // mass of the whole top-k set, min-p's removals included.
  const float min_p = params_.min_p;
  double top_k_mass = 0;
  candidates_.clear();
  for (int64_t i = 0; i < vocab; ++i) {
    if (!(x[i] >= kth)) continue;  // also drops NaN
    const float w = std::exp((x[i] - max) * inv_t);
    top_k_mass += w;
    if (w > 0.f && w >= min_p) candidates_.push_back({static_cast<int32_t>(i), w});
  }
  if (params_.top_p >= 1.f) return candidates_.size();

  // top-p: keep a token while the mass before it (weight desc, id asc) is
  // below top_p of the top-k mass. Since min-p only removes a tail, walking
  // its survivors walks the top-k order. Sort only as far as the walk goes.
  auto before = [](const Candidate& a, const Candidate& b) { return RanksBefore(a.weight, a.id, b.weight, b.id); };
  const double limit = static_cast<double>(params_.top_p) * top_k_mass;
  size_t sorted = 0;
  double mass = 0;
  size_t i = 0;
  for (; i < candidates_.size() && mass < limit; ++i) {
    if (i == sorted) {
      const size_t next = std::min(candidates_.size(), std::max<size_t>(64, sorted * 4));
      std::partial_sort(candidates_.begin() + static_cast<std::ptrdiff_t>(sorted),
                        candidates_.begin() + static_cast<std::ptrdiff_t>(next), candidates_.end(), before);
      sorted = next;
    }
    mass += candidates_[i].weight;
  }
  return std::max<size_t>(i, 1);
}

void Sampler::ComputeLogprobs(const float* logits, int64_t vocab, SampleResult* out) {
  const size_t n = static_cast<size_t>(std::min<int64_t>(params_.logprobs, vocab));
  const float chosen = logits[out->token_id];
  // Pass 1: max, rank of the chosen token, and the top n in a min-heap
  // whose front is the worst kept (a scan in id order keeps lower ids on
  // ties, so only strictly larger values replace it).
  std::vector<std::pair<float, int32_t>> heap;
  heap.reserve(n);
  // With "ranks before" as the heap's less-than, the front is the worst.
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return RanksBefore(a.first, a.second, b.first, b.second);
  };
  float max = kNegInf;
  int64_t rank = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    max = v > max ? v : max;
    rank += v >= chosen;
    if (n == 0) continue;
    if (heap.size() < n) {
      heap.push_back({v, static_cast<int32_t>(i)});
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (v > heap.front().first) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = {v, static_cast<int32_t>(i)};
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  // Pass 2: log-sum-exp.
  double sum = 0;
  if (std::isfinite(max)) {
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = logits[i];
      if (v > kNegInf) sum += std::exp(v - max);  // skips NaN and -inf
    }
  }
  const double lse = static_cast<double>(max) + std::log(sum);
  out->logprob = static_cast<float>(static_cast<double>(chosen) - lse);
  out->rank = std::max<int64_t>(rank, 1);
  std::sort_heap(heap.begin(), heap.end(), better);  // best first
  out->top_logprobs.clear();
  out->top_logprobs.reserve(heap.size());
  for (const auto& [v, id] : heap) out->top_logprobs.push_back({id, static_cast<float>(static_cast<double>(v) - lse)});
}

}  // namespace strata
