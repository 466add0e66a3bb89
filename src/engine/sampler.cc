#include "engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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

// True when token a (value va) ranks before token b: larger value, then
// lower id.
inline bool RanksBefore(float va, int32_t a, float vb, int32_t b) {
  return va > vb || (va == vb && a < b);
}

// ---- Vector helpers ----
// The passes over the vocabulary use GCC/Clang vector extensions: 4 floats
// per operation, SSE2 at the x86-64 baseline (NEON on ARM), without
// intrinsics or run-time dispatch. Comparisons give 0 / -1 lanes; NaN compares false everywhere.
using V4f = float __attribute__((vector_size(16)));
using V4i = int32_t __attribute__((vector_size(16)));
constexpr int64_t kLanes = 4;

inline V4f Splat(float x) { return V4f{x, x, x, x}; }
// Lanes [0, count) from p, the rest `pad`. REQUIRES: 0 < count <= kLanes.
inline V4f Load(const float* p, int64_t count, float pad) {
  V4f v;
  if (count == kLanes) {  // constant size: one plain load, no memcpy call
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  v = Splat(pad);
  std::memcpy(&v, p, static_cast<size_t>(count) * sizeof(float));
  return v;
}
inline bool Any(V4i m) {
  int32_t r = 0;
  for (int j = 0; j < kLanes; ++j) r |= m[j];
  return r != 0;
}
inline float HorizontalMax(V4f v) {
  float m = v[0];
  for (int j = 1; j < kLanes; ++j) m = v[j] > m ? v[j] : m;
  return m;
}
inline double HorizontalSum(V4f v) {
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += v[j];
  return s;
}

// exp(x) for x <= 0, relative error < 3e-7 (measured against libm over
// [-87, 0] when written; the logprobs tests bound it too). Relies on IEEE
// round-to-nearest and no -ffast-math reassociation (the magic number). Below
// kMinExp the result is meaningless: callers mask those lanes to 0
// (e^-87 ~ 1.6e-38 of the top token's weight). NaN lanes are clamped, then
// masked by the caller.
constexpr float kMinExp = -87.f;
inline V4f ExpNonPositive(V4f x) {
  x = x >= Splat(kMinExp) ? x : Splat(kMinExp);
  const V4f magic = Splat(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const V4f n = (x * 1.44269504088896341f + magic) - magic;
  const V4f r =
      x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;  // x - n ln2, two parts
  V4f p = Splat(1.f / 720);  // Taylor to r^6: |r| <= ln2 / 2 keeps the error < 1.5e-7
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const V4i bits = (__builtin_convertvector(n, V4i) + 127) << 23;  // 2^n, n in [-126, 0]
  return p * std::bit_cast<V4f>(bits);
}

// Largest non-NaN value; -inf when there is none.
float MaxIgnoringNaN(const float* x, int64_t n) {
  V4f m = Splat(kNegInf);
  for (int64_t i = 0; i < n; i += kLanes) {
    const V4f v = Load(x + i, std::min(kLanes, n - i), kNegInf);
    m = v > m ? v : m;
  }
  return HorizontalMax(m);
}

// Index of the largest logit, lowest id on ties; NaN never wins. 0 when
// every entry is NaN.
int32_t Argmax(const float* x, int64_t vocab) {
  const float max = MaxIgnoringNaN(x, vocab);
  const float* hit = std::find(x, x + vocab, max);
  return hit == x + vocab ? 0 : static_cast<int32_t>(hit - x);
}

// The k-th largest non-NaN value (-inf when fewer than k are not NaN).
// k <= kHeapSelectMax: one pass with a k-entry min-heap, skipping whole
// vectors that cannot enter it; larger k: nth_element on a copy.
constexpr int64_t kHeapSelectMax = 1024;
float KthLargest(const float* x, int64_t vocab, int64_t k, std::vector<float>* scratch) {
  if (k > kHeapSelectMax) {
    scratch->resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) (*scratch)[i] = std::isnan(x[i]) ? kNegInf : x[i];
    std::nth_element(scratch->begin(), scratch->begin() + (k - 1), scratch->end(),
                     std::greater<float>());
    return (*scratch)[k - 1];
  }
  std::vector<float>& heap = *scratch;  // min-heap: front is the k-th largest so far
  heap.clear();
  int64_t i = 0;
  for (; i < vocab && static_cast<int64_t>(heap.size()) < k; ++i) {
    if (std::isnan(x[i])) continue;
    heap.push_back(x[i]);
    std::push_heap(heap.begin(), heap.end(), std::greater<float>());
  }
  if (static_cast<int64_t>(heap.size()) < k) return kNegInf;
  for (; i < vocab; i += kLanes) {
    const int64_t count = std::min(kLanes, vocab - i);
    if (!Any(Load(x + i, count, kNegInf) > Splat(heap.front()))) continue;
    for (int64_t j = i; j < i + count; ++j) {
      if (x[j] > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
        heap.back() = x[j];
        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
      }
    }
  }
  return heap.front();
}

// Tokens per entry of block_mass_: the draw walks block sums, then one block.
constexpr int64_t kWeightBlock = 256;

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
  if (min_tokens < 0 || min_tokens > max_tokens)
    bad("min_tokens " + std::to_string(min_tokens) + " must be in [0, max_tokens " +
        std::to_string(max_tokens) + "]");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || !(bias >= -100.f && bias <= 100.f)) {
      bad("logit_bias " + std::to_string(id) + ": " + std::to_string(bias) +
          " needs a token id >= 0 and a bias in [-100, 100]");
      break;
    }
  }
  if (problems.empty()) return OkStatus();
  std::string msg = "invalid sampling parameters: ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  return InvalidArgument(msg);
}

PenaltyToken& TokenHistory::Entry(int32_t token) {
  const auto [it, inserted] = index_.try_emplace(token, tokens_.size());
  if (inserted) tokens_.push_back({token, 0});
  return tokens_[it->second];
}

void TokenHistory::AddPromptTokens(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) (void)Entry(t);
}

void TokenHistory::AddOutputToken(int32_t token) {
  ++Entry(token).output_count;
  ++num_output_tokens_;
}

Sampler::Sampler(const SamplingParams& params, std::optional<uint64_t> default_seed)
    : params_(params) {
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

void ApplyPenalties(const SamplingParams& params, const TokenHistory& history, float* logits,
                    int64_t vocab) {
  const float rep = params.repetition_penalty;
  for (const PenaltyToken& c : history.tokens()) {
    if (c.token_id < 0 || c.token_id >= vocab) continue;
    float& l = logits[c.token_id];
    // Every entry was seen in the prompt or the output: the repetition
    // penalty applies to all of them.
    if (rep != 1.f) l = l > 0.f ? l / rep : l * rep;
    if (c.output_count > 0) {
      l -= params.frequency_penalty * static_cast<float>(c.output_count);
      l -= params.presence_penalty;
    }
  }
}

const float* Sampler::Adjust(const float* logits, int64_t vocab, const TokenHistory& history,
                             const LogitMask& mask) {
  const bool penalties = params_.UsesPenalties() && !history.tokens().empty();
  if (!penalties && params_.logit_bias.empty() && mask.empty()) return logits;
  penalized_.assign(logits, logits + vocab);
  float* x = penalized_.data();
  if (!mask.allowed.empty()) {
    const int64_t covered =
        std::min<int64_t>(vocab, static_cast<int64_t>(mask.allowed.size()) * 32);
    for (int64_t w = 0; w * 32 < covered; ++w) {
      const uint32_t bits = mask.allowed[w];
      if (bits == ~0u) continue;
      const int64_t end = std::min<int64_t>(covered, w * 32 + 32);
      if (bits == 0) {  // the common case under a grammar: a whole word out
        std::fill(x + w * 32, x + end, kNegInf);
        continue;
      }
      float* xs = x + w * 32;
      if (end - w * 32 == 32) {  // a constant trip count the compiler vectorises
        for (int j = 0; j < 32; ++j) xs[j] = ((bits >> j) & 1u) ? xs[j] : kNegInf;
        continue;
      }
      for (int64_t j = 0; j < end - w * 32; ++j)
        if (!((bits >> j) & 1u)) xs[j] = kNegInf;
    }
    std::fill(x + covered, x + vocab, kNegInf);
  }
  for (int32_t id : mask.banned)
    if (id >= 0 && id < vocab) x[id] = kNegInf;
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && id < vocab) x[id] += bias;
  if (penalties) ApplyPenalties(params_, history, x, vocab);
  return x;
}

namespace {
// Under a mask, a token it allows (the lowest) when `token` is not one.
// When the bans leave nothing the allowed set wins (a complete grammar
// allows only EOS, even before min_tokens); when that is empty too, the
// token stands.
int32_t KeepAllowed(int32_t token, int64_t vocab, const LogitMask& mask) {
  auto in_set = [&](int64_t id) {
    if (mask.allowed.empty()) return true;
    return static_cast<size_t>(id >> 5) < mask.allowed.size() &&
           ((mask.allowed[id >> 5] >> (id & 31)) & 1);
  };
  auto allowed = [&](int64_t id) {
    return in_set(id) && std::find(mask.banned.begin(), mask.banned.end(), id) == mask.banned.end();
  };
  if (mask.empty() || allowed(token)) return token;
  for (int64_t id = 0; id < vocab; ++id)
    if (allowed(id)) return static_cast<int32_t>(id);
  if (mask.allowed.empty() || in_set(token)) return token;
  for (int64_t id = 0; id < vocab; ++id)
    if (in_set(id)) return static_cast<int32_t>(id);
  return token;
}
}  // namespace

namespace {
// Greedy under a sparse mask (a grammar between values allows a few
// tokens): the argmax over the allowed ids alone, ties to the lowest, NaN
// never winning; -1 when the mask is not sparse or allows nothing.
int32_t SparseMaskedArgmax(const float* logits, int64_t vocab, const LogitMask& mask) {
  const int64_t words =
      std::min<int64_t>(static_cast<int64_t>(mask.allowed.size()), (vocab + 31) / 32);
  int64_t allowed = 0;
  for (int64_t w = 0; w < words; ++w) allowed += std::popcount(mask.allowed[w]);
  if (allowed == 0 || allowed > vocab / 16) return -1;
  int32_t best = -1;
  float best_value = kNegInf;
  for (int64_t w = 0; w < words; ++w) {
    for (uint32_t bits = mask.allowed[w]; bits; bits &= bits - 1) {
      const int64_t id = w * 32 + std::countr_zero(bits);
      if (id >= vocab) break;
      if (std::find(mask.banned.begin(), mask.banned.end(), id) != mask.banned.end()) continue;
      const float v = logits[id];
      if (std::isnan(v)) continue;
      if (best < 0 || v > best_value) best = static_cast<int32_t>(id), best_value = v;
    }
  }
  return best;
}
}  // namespace

SampleResult Sampler::Sample(const float* logits, int64_t vocab, const TokenHistory& history,
                             const LogitMask& mask) {
  // One draw per call, whatever path runs, so a seeded request's stream
  // depends only on its own steps.
  const double u = NextDraw();
  return SampleWithDraw(logits, vocab, history, mask, u);
}

SampleResult Sampler::SampleWithDraw(const float* logits, int64_t vocab,
                                     const TokenHistory& history, const LogitMask& mask,
                                     double u) {
  STRATA_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max()) << "vocab " << vocab;
  SampleResult result;
  if (params_.IsGreedy() && !mask.allowed.empty() && !params_.AdjustsLogits()) {
    // No copy of the logits: only the allowed ones are read.
    const int32_t best = SparseMaskedArgmax(logits, vocab, mask);
    if (best >= 0) {
      result.token_id = best;
      if (params_.logprobs >= 0) ComputeLogprobs(logits, vocab, &result);
      return result;
    }
  }
  const float* x = Adjust(logits, vocab, history, mask);
  if (params_.IsGreedy()) {
    result.token_id = Argmax(x, vocab);
  } else {
    const Kept kept = BuildCandidates(x, vocab);
    result.token_id = kept.none ? Argmax(x, vocab) : Draw(kept, u * kept.mass);
  }
  result.token_id = KeepAllowed(result.token_id, vocab, mask);
  if (params_.logprobs >= 0) ComputeLogprobs(logits, vocab, &result);
  return result;
}

std::vector<TokenProb> Sampler::Distribution(const float* logits, int64_t vocab,
                                             const TokenHistory& history, const LogitMask& mask) {
  STRATA_CHECK(vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max()) << "vocab " << vocab;
  const float* x = Adjust(logits, vocab, history, mask);
  Kept kept;
  kept.none = true;
  if (!params_.IsGreedy()) kept = BuildCandidates(x, vocab);
  if (kept.none) return {TokenProb{KeepAllowed(Argmax(x, vocab), vocab, mask), 1.0}};
  std::vector<TokenProb> out;
  if (kept.dense) {
    for (int64_t i = 0; i < vocab; ++i) {
      if (weights_[i] > 0.f) out.push_back({static_cast<int32_t>(i), weights_[i] / kept.mass});
    }
  } else {
    for (size_t i = 0; i < kept.count; ++i)
      out.push_back({candidates_[i].id, candidates_[i].weight / kept.mass});
  }
  return out;
}

Sampler::Kept Sampler::BuildCandidates(const float* x, int64_t vocab) {
  Kept kept;
  const float max = MaxIgnoringNaN(x, vocab);
  if (!std::isfinite(max)) {
    kept.none = true;
    return kept;
  }
  const float inv_t = 1.f / params_.temperature;

  // top-k: the k-th largest logit is the threshold; ties with it stay.
  float kth = kNegInf;
  if (params_.top_k > 0 && params_.top_k < vocab)
    kth = KthLargest(x, vocab, params_.top_k, &values_);

  // Dense weights of the top-k set minus what min-p removes. min-p compares
  // p_i / p_max = weight_i, which renormalisation by top-k and top-p does
  // not change, so it can filter here although it applies last. top-p needs
  // the mass of the whole top-k set, min-p's removals included.
  const int64_t padded = (vocab + kLanes - 1) / kLanes * kLanes;
  weights_.resize(static_cast<size_t>(padded));
  block_mass_.assign(static_cast<size_t>((vocab + kWeightBlock - 1) / kWeightBlock), 0.0);
  const V4f vmax = Splat(max), vkth = Splat(kth), vmin_p = Splat(params_.min_p), zero = Splat(0.f);
  double top_k_mass = 0;
  for (int64_t b = 0; b < vocab; b += kWeightBlock) {
    V4f in_k_sum = zero, kept_sum = zero;
    for (int64_t i = b; i < std::min(vocab, b + kWeightBlock); i += kLanes) {
      const V4f v = Load(x + i, std::min(kLanes, vocab - i), kNegInf);
      const V4f d = (v - vmax) * inv_t;
      const V4i in_k = (v >= vkth) & (d >= Splat(kMinExp));  // NaN and -inf fail
      const V4f e = in_k ? ExpNonPositive(d) : zero;
      in_k_sum += e;
      const V4f w = (e >= vmin_p) & (e > zero) ? e : zero;
      kept_sum += w;
      std::memcpy(&weights_[i], &w, sizeof w);  // padded: a whole vector fits
    }
    top_k_mass += HorizontalSum(in_k_sum);
    block_mass_[b / kWeightBlock] = HorizontalSum(kept_sum);
    kept.mass += block_mass_[b / kWeightBlock];
  }
  if (params_.top_p >= 1.f) return kept;

  // top-p: keep a token while the mass before it (weight desc, id asc) is
  // below top_p of the top-k mass. Collect tokens by falling weight bands
  // (w >= 1/16, then 1/4096, ...) until the collected mass reaches the
  // limit: each band is the next stretch of the order, so only it needs
  // sorting. Since min-p only removes a tail, walking its survivors walks
  // the top-k order.
  const double limit = static_cast<double>(params_.top_p) * top_k_mass;
  candidates_.clear();
  double collected = 0;
  float hi = std::numeric_limits<float>::infinity();
  for (float lo = 1.f / 16; collected < limit; lo = lo < 1e-30f ? 0.f : lo / 256) {
    const V4f vlo = Splat(lo), vhi = Splat(hi);
    for (int64_t i = 0; i < padded; i += kLanes) {
      V4f w;
      std::memcpy(&w, &weights_[i], sizeof w);
      if (!Any((w >= vlo) & (w < vhi) & (w > zero))) continue;
      for (int64_t j = i; j < i + kLanes; ++j) {
        const float wj = weights_[j];
        if (wj >= lo && wj < hi && wj > 0.f) {
          candidates_.push_back({static_cast<int32_t>(j), wj});
          collected += wj;
        }
      }
    }
    if (lo == 0.f) break;  // everything with weight is collected
    hi = lo;
  }
  auto before = [](const Candidate& a, const Candidate& b) {
    return RanksBefore(a.weight, a.id, b.weight, b.id);
  };
  size_t sorted = 0;
  double mass = 0;
  size_t i = 0;
  for (; i < candidates_.size() && mass < limit; ++i) {
    if (i == sorted) {
      const size_t next = std::min(candidates_.size(), std::max<size_t>(64, sorted * 4));
      std::partial_sort(candidates_.begin() + static_cast<std::ptrdiff_t>(sorted),
                        candidates_.begin() + static_cast<std::ptrdiff_t>(next), candidates_.end(),
                        before);
      sorted = next;
    }
    mass += candidates_[i].weight;
  }
  kept.dense = false;
  kept.count = std::max<size_t>(i, 1);
  kept.mass = 0;
  for (size_t c = 0; c < kept.count; ++c) kept.mass += candidates_[c].weight;
  return kept;
}

int32_t Sampler::Draw(const Kept& kept, double target) const {
  double cum = 0;
  if (!kept.dense) {
    for (size_t i = 0; i < kept.count; ++i) {
      cum += candidates_[i].weight;
      if (target < cum) return candidates_[i].id;
    }
    return candidates_[kept.count - 1].id;  // rounding put target on the sum
  }
  const int64_t vocab = static_cast<int64_t>(block_mass_.size()) * kWeightBlock;
  int64_t last = -1;  // last token with weight seen, for the rounding case
  for (size_t b = 0; b < block_mass_.size(); ++b) {
    if (target >= cum + block_mass_[b]) {
      cum += block_mass_[b];
      continue;
    }
    const int64_t end =
        std::min<int64_t>(static_cast<int64_t>(weights_.size()), (b + 1) * kWeightBlock);
    for (int64_t i = static_cast<int64_t>(b) * kWeightBlock; i < end; ++i) {
      if (weights_[i] <= 0.f) continue;
      cum += weights_[i];
      last = i;
      if (target < cum) return static_cast<int32_t>(i);
    }
  }
  if (last >= 0) return static_cast<int32_t>(last);
  for (int64_t i = std::min<int64_t>(vocab, static_cast<int64_t>(weights_.size())) - 1; i >= 0;
       --i) {
    if (weights_[i] > 0.f) return static_cast<int32_t>(i);
  }
  return 0;  // unreachable: the top token always has weight 1
}

void Sampler::ComputeLogprobs(const float* logits, int64_t vocab, SampleResult* out) {
  ComputeTokenLogprobs(logits, vocab, out->token_id, params_.logprobs, out);
}

void ComputeTokenLogprobs(const float* logits, int64_t vocab, int32_t token_id, int top,
                          SampleResult* out) {
  out->token_id = token_id;
  const int64_t n = std::min<int64_t>(top, vocab);
  const float chosen = logits[token_id];
  const float max = MaxIgnoringNaN(logits, vocab);

  // Log-sum-exp and the chosen token's rank (tokens with logit >= its own).
  V4f sum = Splat(0.f);
  V4i ge = V4i{};
  const V4f vmax = Splat(max), vchosen = Splat(chosen);
  for (int64_t i = 0; i < vocab; i += kLanes) {
    const V4f v = Load(logits + i, std::min(kLanes, vocab - i), std::nanf(""));
    const V4f d = v - vmax;
    sum += d >= Splat(kMinExp) ? ExpNonPositive(d) : Splat(0.f);
    ge -= v >= vchosen;  // true lanes are -1
  }
  int64_t rank = 0;
  for (int j = 0; j < kLanes; ++j) rank += ge[j];
  const double lse =
      std::isfinite(max) ? static_cast<double>(max) + std::log(HorizontalSum(sum)) : max;
  out->logprob = static_cast<float>(static_cast<double>(chosen) - lse);
  out->rank = std::max<int64_t>(rank, 1);

  // The top n in a heap whose front is the worst kept. Scanning in id order
  // keeps lower ids on ties, so only strictly larger values replace it, and
  // a vector with no lane above the front is skipped whole.
  out->top_logprobs.clear();
  if (n <= 0) return;
  std::vector<std::pair<float, int32_t>> heap;
  heap.reserve(static_cast<size_t>(n));
  auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return RanksBefore(a.first, a.second, b.first, b.second);
  };
  auto offer = [&](int64_t i) {
    const float v = logits[i];
    if (std::isnan(v)) return;
    if (static_cast<int64_t>(heap.size()) < n) {
      heap.push_back({v, static_cast<int32_t>(i)});
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (v > heap.front().first) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = {v, static_cast<int32_t>(i)};
      std::push_heap(heap.begin(), heap.end(), better);
    }
  };
  int64_t i = 0;
  for (; i < vocab && static_cast<int64_t>(heap.size()) < n; ++i) offer(i);
  for (; i < vocab; i += kLanes) {
    const int64_t count = std::min(kLanes, vocab - i);
    if (!Any(Load(logits + i, count, kNegInf) > Splat(heap.front().first))) continue;
    for (int64_t j = i; j < i + count; ++j) offer(j);
  }
  std::sort_heap(heap.begin(), heap.end(), better);  // best first
  out->top_logprobs.reserve(heap.size());
  for (const auto& [v, id] : heap)
    out->top_logprobs.push_back({id, static_cast<float>(static_cast<double>(v) - lse)});
}

}  // namespace strata
