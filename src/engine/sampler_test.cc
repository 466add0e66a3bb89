#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace strata {
namespace {

const TokenHistory kNoHistory;

// Logits whose softmax is exactly probs (up to float rounding).
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

SamplingParams Random(uint64_t seed = 7) {
  SamplingParams p;
  p.seed = seed;
  return p;
}

std::set<int32_t> KeptTokens(const SamplingParams& params, const std::vector<float>& logits,
                             const TokenHistory& h = kNoHistory) {
  Sampler s(params, std::nullopt);
  std::set<int32_t> kept;
  for (const TokenProb& tp :
       s.Distribution(logits.data(), static_cast<int64_t>(logits.size()), h)) {
    kept.insert(tp.token_id);
  }
  return kept;
}

std::map<int32_t, double> Probs(const SamplingParams& params, const std::vector<float>& logits) {
  Sampler s(params, std::nullopt);
  std::map<int32_t, double> out;
  for (const TokenProb& tp :
       s.Distribution(logits.data(), static_cast<int64_t>(logits.size()), kNoHistory)) {
    out[tp.token_id] = tp.prob;
  }
  return out;
}

// ---- parameters ----

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams().Validate().ok()); }

TEST(SamplingParamsTest, ValidateNamesEveryBadField) {
  SamplingParams p;
  p.temperature = -1;
  p.top_k = -2;
  p.top_p = 0;
  p.min_p = 1.5f;
  p.repetition_penalty = 0;
  p.frequency_penalty = 3;
  p.presence_penalty = std::nanf("");
  p.logprobs = 21;
  p.max_tokens = 0;
  Status s = p.Validate();
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const char* field : {"temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                            "frequency_penalty", "presence_penalty", "logprobs", "max_tokens"}) {
    EXPECT_NE(s.message().find(field), std::string::npos) << field << " missing: " << s.message();
  }
}

// ---- greedy ----

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, std::nullopt);
  std::vector<float> logits = {0.5f, 2.f, -1.f, 2.f, 1.9f};
  EXPECT_EQ(s.Sample(logits.data(), 5, kNoHistory).token_id, 1);
  logits[4] = 2.5f;
  EXPECT_EQ(s.Sample(logits.data(), 5, kNoHistory).token_id, 4);
  p.temperature = 1e-6f;  // below vLLM's epsilon: greedy too
  Sampler tiny(p, std::nullopt);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(tiny.Sample(logits.data(), 5, kNoHistory).token_id, 4);
}

TEST(SamplerTest, GreedySeesPenalties) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 1.f;
  Sampler s(p, std::nullopt);
  std::vector<float> logits = {1.f, 1.5f, 0.f};
  TokenHistory h;
  EXPECT_EQ(s.Sample(logits.data(), 3, h).token_id, 1);
  h.AddOutputToken(1);  // 1.5 - 1 = 0.5 < 1
  EXPECT_EQ(s.Sample(logits.data(), 3, h).token_id, 0);
}

TEST(SamplerTest, NaNNeverWins) {
  std::vector<float> logits = {std::nanf(""), 0.f, std::nanf(""), -1.f};
  SamplingParams g;
  g.temperature = 0;
  EXPECT_EQ(Sampler(g, std::nullopt).Sample(logits.data(), 4, kNoHistory).token_id, 1);
  Sampler r(Random(), std::nullopt);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = r.Sample(logits.data(), 4, kNoHistory).token_id;
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> none = {-inf, -inf, std::nanf("")};
  EXPECT_EQ(r.Sample(none.data(), 3, kNoHistory).token_id, 0);
}

// ---- seeds ----

std::vector<int32_t> SampleSteps(Sampler& s, int steps, uint64_t logits_seed, int64_t vocab = 50) {
  std::mt19937 gen(static_cast<uint32_t>(logits_seed));
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<int32_t> out;
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int i = 0; i < steps; ++i) {
    for (float& l : logits) l = nd(gen);
    out.push_back(s.Sample(logits.data(), vocab, kNoHistory).token_id);
  }
  return out;
}

TEST(SamplerTest, SameSeedSameTokensRegardlessOfOtherRequests) {
  Sampler alone(Random(42), std::nullopt);
  const std::vector<int32_t> expected = SampleSteps(alone, 100, 1);

  // The same request batched with others: other samplers advance between
  // its steps, and it must not notice.
  Sampler a(Random(42), std::nullopt);
  Sampler other1(Random(43), std::nullopt);
  Sampler other2(SamplingParams(), std::nullopt);  // unseeded
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(50), noise(50, 0.f);
  std::vector<int32_t> got;
  for (int i = 0; i < 100; ++i) {
    for (float& l : logits) l = nd(gen);
    for (int j = 0; j < i % 3; ++j) other1.Sample(noise.data(), 50, kNoHistory);
    other2.Sample(noise.data(), 50, kNoHistory);
    got.push_back(a.Sample(logits.data(), 50, kNoHistory).token_id);
  }
  EXPECT_EQ(got, expected);

  Sampler different(Random(41), std::nullopt);
  EXPECT_NE(SampleSteps(different, 100, 1), expected);
}

TEST(SamplerTest, SeedPrecedence) {
  SamplingParams unseeded;
  Sampler from_default(unseeded, 42);
  EXPECT_EQ(from_default.seed(), 42u);
  Sampler explicit_wins(Random(5), 42);
  EXPECT_EQ(explicit_wins.seed(), 5u);
  Sampler seeded(Random(42), std::nullopt);
  EXPECT_EQ(SampleSteps(from_default, 30, 3), SampleSteps(seeded, 30, 3));
  // Unseeded requests get different random seeds (a collision is 2^-64).
  EXPECT_NE(Sampler(unseeded, std::nullopt).seed(), Sampler(unseeded, std::nullopt).seed());
}

TEST(SamplerTest, SeededStreamIsPinned) {
  // The generator and the double conversion are Strata's own, so a seed
  // means the same tokens on every machine and compiler. A change here
  // breaks every user's reproducible run: do it knowingly.
  Sampler s(Random(2024), std::nullopt);
  std::vector<float> logits = LogitsOf({0.1, 0.2, 0.3, 0.4});
  std::vector<int32_t> got;
  for (int i = 0; i < 16; ++i) got.push_back(s.Sample(logits.data(), 4, kNoHistory).token_id);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 3, 0, 1, 3, 1, 2, 1, 2, 0, 3, 3, 3, 2, 3, 1}));
}

// ---- distribution ----

// Pearson's chi-square of observed counts against probabilities.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

TEST(SamplerTest, DrawsFollowTheSoftmax) {
  const std::vector<double> probs = {0.05, 0.1, 0.15, 0.3, 0.4};
  std::vector<float> logits = LogitsOf(probs);
  for (float& l : logits) l += 3.f;  // softmax is shift-invariant
  Sampler s(Random(123), std::nullopt);
  const int n = 20000;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits.data(), 5, kNoHistory).token_id];
  // 4 degrees of freedom: P(chi2 > 30) ~ 5e-6. Seeded, so deterministic;
  // the loose bound keeps a change of generator from flaking, while a wrong
  // distribution (e.g. off by one token, or temperature ignored) gives
  // hundreds.
  EXPECT_LT(ChiSquare(counts, probs, n), 30.0)
      << counts[0] << " " << counts[1] << " " << counts[2] << " " << counts[3] << " " << counts[4];
}

TEST(SamplerTest, TemperatureSharpensAndFlattens) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  const std::vector<float> logits = LogitsOf(probs);
  for (float t : {0.5f, 2.f}) {
    SamplingParams p = Random(9);
    p.temperature = t;
    std::vector<double> want;
    double z = 0;
    for (double q : probs) z += std::pow(q, 1.0 / t);
    for (double q : probs) want.push_back(std::pow(q, 1.0 / t) / z);
    auto got = Probs(p, logits);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "T=" << t << " token " << i;

    Sampler s(p, std::nullopt);
    const int n = 20000;
    std::vector<int> counts(4, 0);
    for (int i = 0; i < n; ++i) ++counts[s.Sample(logits.data(), 4, kNoHistory).token_id];
    EXPECT_LT(ChiSquare(counts, want, n), 30.0) << "T=" << t;
  }
}

// ---- filters: exact masks on small vocabularies ----

TEST(SamplerTest, TopKKeepsTheKLargest) {
  std::vector<float> logits = {1.f, 4.f, 3.f, 0.f, 2.f};
  SamplingParams p = Random();
  p.top_k = 2;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{1, 2}));
  p.top_k = 1;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{1}));
  p.top_k = 5;
  EXPECT_EQ(KeptTokens(p, logits).size(), 5u);
  p.top_k = 100;  // larger than the vocabulary: off
  EXPECT_EQ(KeptTokens(p, logits).size(), 5u);
  p.top_k = 0;  // off
  EXPECT_EQ(KeptTokens(p, logits).size(), 5u);
  // Renormalised over the kept tokens.
  p.top_k = 2;
  auto probs = Probs(p, logits);
  EXPECT_NEAR(probs[1], std::exp(4.0) / (std::exp(4.0) + std::exp(3.0)), 1e-6);
}

TEST(SamplerTest, TopKKeepsTiesAtTheBoundary) {
  std::vector<float> logits = {3.f, 2.f, 2.f, 1.f};
  SamplingParams p = Random();
  p.top_k = 2;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  // Exclusive prefix masses in order 0, 1, 2, 3: 0, 0.5, 0.8, 0.95.
  std::vector<float> logits = LogitsOf({0.3, 0.5, 0.05, 0.15});
  SamplingParams p = Random();
  p.top_p = 0.45f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{1}));
  p.top_p = 0.75f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1}));
  p.top_p = 0.85f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1, 3}));
  p.top_p = 0.99f;
  EXPECT_EQ(KeptTokens(p, logits).size(), 4u);
  p.top_p = 0.75f;
  auto probs = Probs(p, logits);
  EXPECT_NEAR(probs[1], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(probs[0], 0.3 / 0.8, 1e-6);
}

TEST(SamplerTest, TopPAppliesAfterTemperature) {
  // T = 0.5 squares the probabilities: 0.5, 0.3, 0.2 -> 0.25, 0.09, 0.04 (/ 0.38).
  std::vector<float> logits = LogitsOf({0.5, 0.3, 0.2});
  SamplingParams p = Random();
  p.top_p = 0.6f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1}));  // 0.5 < 0.6
  p.temperature = 0.5f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0}));  // 0.25 / 0.38 = 0.66 >= 0.6
}

TEST(SamplerTest, TopPRenormalisesAfterTopK) {
  // HF order: top-k leaves {0, 1} with masses 4/7, 3/7; top_p 0.55 then
  // keeps only token 0 (4/7 >= 0.55). Measuring top-p against the full
  // mass (0.4 < 0.55) would keep both.
  std::vector<float> logits = LogitsOf({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = Random();
  p.top_k = 2;
  p.top_p = 0.55f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0}));
  p.top_p = 0.6f;  // 4/7 = 0.571 < 0.6
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, MinPKeepsTokensAboveAFractionOfTheMax) {
  std::vector<float> logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = Random();
  p.min_p = 0.2f;  // threshold 0.1
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.5f;  // threshold 0.25
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1}));
  p.min_p = 1.f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0}));
  p.min_p = 0.5f;
  auto probs = Probs(p, logits);
  EXPECT_NEAR(probs[0], 0.5 / 0.8, 1e-6);
  // After temperature 2 the probabilities are ~ sqrt: 0.15 -> ratio
  // sqrt(0.3) = 0.55 >= 0.5.
  p.temperature = 2.f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, MinPAppliesAfterTopP) {
  // HF: top_p 0.6 over {0.5, 0.3, 0.2} keeps {0, 1}; min_p 0.5 (threshold
  // 0.25) keeps both. Applying min_p first (vLLM) would leave {0.625,
  // 0.375}, and top_p 0.6 would then keep only token 0.
  std::vector<float> logits = LogitsOf({0.5, 0.3, 0.2});
  SamplingParams p = Random();
  p.top_p = 0.6f;
  p.min_p = 0.5f;
  EXPECT_EQ(KeptTokens(p, logits), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, FilteredDrawsFollowTheRenormalisedDistribution) {
  std::vector<float> logits = LogitsOf({0.02, 0.35, 0.08, 0.25, 0.3});
  SamplingParams p = Random(77);
  p.top_k = 3;  // {1, 4, 3}, masses 0.35, 0.3, 0.25 of 0.9
  const int n = 20000;
  Sampler s(p, std::nullopt);
  std::vector<int> counts(5, 0);
  for (int i = 0; i < n; ++i) ++counts[s.Sample(logits.data(), 5, kNoHistory).token_id];
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  EXPECT_LT(ChiSquare({counts[1], counts[3], counts[4]}, {0.35 / 0.9, 0.25 / 0.9, 0.3 / 0.9}, n),
            25.0);
}

TEST(SamplerTest, LargeVocabularyTopP) {
  // 150k tokens, a peaked head and a long flat tail: the top-p prefix is
  // found without sorting the whole vocabulary, and equals the reference.
  const int64_t vocab = 150000;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = nd(gen);
  for (int i = 0; i < 1000; ++i) logits[(i * 7919) % vocab] += 9.f;
  SamplingParams p = Random(3);
  p.top_p = 0.9f;
  Sampler s(p, std::nullopt);
  std::vector<TokenProb> dist = s.Distribution(logits.data(), vocab, kNoHistory);

  // Reference: full sort in double.
  std::vector<int32_t> order(vocab);
  for (int32_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double mx = logits[order[0]];
  double z = 0;
  for (float l : logits) z += std::exp(l - mx);
  double mass = 0;
  size_t want = 0;
  while (want < order.size() && mass < 0.9 * z) mass += std::exp(logits[order[want++]] - mx);
  ASSERT_EQ(dist.size(), want);
  for (size_t i = 0; i < want; ++i) ASSERT_EQ(dist[i].token_id, order[i]) << i;
  EXPECT_GT(want, 256u);  // the walk had to grow past its first sorted chunk

  const int32_t t = s.Sample(logits.data(), vocab, kNoHistory).token_id;
  EXPECT_TRUE(
      std::any_of(dist.begin(), dist.end(), [&](const TokenProb& tp) { return tp.token_id == t; }));
}

TEST(SamplerTest, LargeVocabularyTopKMatchesReference) {
  // Heap selection (k <= 1024, skipping vectors) and nth_element (larger k)
  // both find the k-th largest logit; duplicates at the boundary all stay.
  const int64_t vocab = 100003;  // not a multiple of the vector width
  std::mt19937 gen(8);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = std::round(nd(gen) * 64) / 64;  // many exact ties
  logits[vocab - 1] = 10.f;                                   // the max in the tail lanes
  logits[5] = std::nanf("");
  std::vector<float> sorted;
  for (float l : logits) {
    if (!std::isnan(l)) sorted.push_back(l);
  }
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  for (int k : {1, 50, 1024, 1025, 5000}) {
    SamplingParams p = Random();
    p.top_k = k;
    p.temperature = 8.f;  // keep every weight far above underflow
    Sampler s(p, std::nullopt);
    auto dist = s.Distribution(logits.data(), vocab, kNoHistory);
    const float kth = sorted[k - 1];
    const size_t want = static_cast<size_t>(
        std::count_if(sorted.begin(), sorted.end(), [&](float l) { return l >= kth; }));
    EXPECT_EQ(dist.size(), want) << "k=" << k;
    for (const TokenProb& tp : dist) ASSERT_GE(logits[tp.token_id], kth) << "k=" << k;
  }
}

// ---- penalties ----

TEST(PenaltiesTest, RepetitionPenaltyOverPromptAndOutput) {
  SamplingParams p;
  p.repetition_penalty = 2.f;
  TokenHistory h(std::vector<int32_t>{0, 0, 1});
  h.AddOutputToken(2);
  h.AddOutputToken(2);
  std::vector<float> l = {3.f, -3.f, 1.f, 5.f, -1.f};
  ApplyPenalties(p, h, l.data(), 5);
  // Applied once per distinct token, divide positive / multiply negative.
  EXPECT_EQ(l, (std::vector<float>{1.5f, -6.f, 0.5f, 5.f, -1.f}));
}

TEST(PenaltiesTest, FrequencyAndPresenceCountOutputOnly) {
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  TokenHistory h(std::vector<int32_t>{0, 3});
  for (int32_t t : {1, 1, 1, 3, 4}) h.AddOutputToken(t);
  EXPECT_EQ(h.num_output_tokens(), 5);
  std::vector<float> l = {1.f, 1.f, 1.f, 1.f, -1.f};
  ApplyPenalties(p, h, l.data(), 5);
  EXPECT_FLOAT_EQ(l[0], 1.f);                     // prompt only: untouched
  EXPECT_FLOAT_EQ(l[1], 1.f - 3 * 0.5f - 0.25f);  // 3 times in the output
  EXPECT_FLOAT_EQ(l[2], 1.f);
  EXPECT_FLOAT_EQ(l[3], 1.f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[4], -1.f - 0.5f - 0.25f);
}

TEST(PenaltiesTest, AllThreeTogetherAndOutOfRangeIds) {
  SamplingParams p;
  p.repetition_penalty = 1.25f;
  p.frequency_penalty = -0.5f;  // negative: encourages repeats
  p.presence_penalty = 1.f;
  TokenHistory h(std::vector<int32_t>{1, 99, -3});
  h.AddOutputToken(0);
  h.AddOutputToken(0);
  h.AddOutputToken(1000);
  std::vector<float> l = {2.f, -2.f, 0.f};
  ApplyPenalties(p, h, l.data(), 3);
  EXPECT_FLOAT_EQ(l[0], 2.f / 1.25f + 2 * 0.5f - 1.f);  // repetition first, then OpenAI penalties
  EXPECT_FLOAT_EQ(l[1], -2.f * 1.25f);
  EXPECT_FLOAT_EQ(l[2], 0.f);
}

TEST(PenaltiesTest, SamplerUsesPenalizedLogitsButLeavesInputAlone) {
  SamplingParams p = Random();
  p.repetition_penalty = 4.f;
  std::vector<float> logits = LogitsOf({0.5, 0.5});
  TokenHistory h(std::vector<int32_t>{0});
  Sampler s(p, std::nullopt);
  auto dist = s.Distribution(logits.data(), 2, h);
  // log 0.5 < 0, so token 0's logit is multiplied by 4: odds 0.5^4 / 0.5.
  const double l0 = 4 * std::log(0.5), l1 = std::log(0.5);
  const double want0 = std::exp(l0) / (std::exp(l0) + std::exp(l1));
  ASSERT_EQ(dist.size(), 2u);
  EXPECT_NEAR(dist[0].prob, want0, 1e-6);
  EXPECT_FLOAT_EQ(logits[0], static_cast<float>(std::log(0.5)));
}

// ---- logprobs ----

std::vector<double> LogSoftmax(const std::vector<float>& l) {
  double mx = -INFINITY;
  for (float v : l) mx = std::max<double>(mx, v);
  double z = 0;
  for (float v : l) z += std::exp(v - mx);
  std::vector<double> out;
  for (float v : l) out.push_back(v - mx - std::log(z));
  return out;
}

TEST(LogprobsTest, MatchDoublePrecisionLogSoftmaxOfRawLogits) {
  const int64_t vocab = 5000;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = nd(gen);
  const std::vector<double> ref = LogSoftmax(logits);
  std::vector<int32_t> order(vocab);
  for (int32_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });

  // Penalties and temperature change what is sampled, not the reported
  // logprobs (raw, vLLM's default).
  SamplingParams p = Random(1);
  p.logprobs = 5;
  p.temperature = 0.7f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  TokenHistory h(std::vector<int32_t>{order[0], order[1]});
  h.AddOutputToken(order[2]);
  Sampler s(p, std::nullopt);
  for (int step = 0; step < 20; ++step) {
    SampleResult r = s.Sample(logits.data(), vocab, h);
    EXPECT_NEAR(r.logprob, ref[r.token_id], 1e-5);
    int64_t rank = 0;
    for (double v : ref) rank += v >= ref[r.token_id];
    EXPECT_EQ(r.rank, rank);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top_logprobs[i].token_id, order[i]);
      EXPECT_NEAR(r.top_logprobs[i].logprob, ref[order[i]], 1e-5);
    }
  }
}

TEST(LogprobsTest, ZeroMeansSampledTokenOnlyAndTiesGoToLowerIds) {
  std::vector<float> logits = {1.f, 3.f, 2.f, 3.f, 2.f, 3.f};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 0;
  SampleResult r = Sampler(p, std::nullopt).Sample(logits.data(), 6, kNoHistory);
  EXPECT_EQ(r.token_id, 1);
  EXPECT_TRUE(r.top_logprobs.empty());
  EXPECT_NEAR(r.logprob, LogSoftmax(logits)[1], 1e-6);
  EXPECT_EQ(r.rank, 3);  // three tokens share the top logit

  p.logprobs = 4;
  r = Sampler(p, std::nullopt).Sample(logits.data(), 6, kNoHistory);
  ASSERT_EQ(r.top_logprobs.size(), 4u);
  const std::vector<int32_t> ids = {r.top_logprobs[0].token_id, r.top_logprobs[1].token_id,
                                    r.top_logprobs[2].token_id, r.top_logprobs[3].token_id};
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 5, 2}));

  p.logprobs = 20;  // more than the vocabulary
  r = Sampler(p, std::nullopt).Sample(logits.data(), 6, kNoHistory);
  EXPECT_EQ(r.top_logprobs.size(), 6u);
  EXPECT_EQ(r.top_logprobs.back().token_id, 0);
}

TEST(LogprobsTest, NoneRequestedLeavesThemEmpty) {
  std::vector<float> logits = {0.f, 1.f};
  SampleResult r = Sampler(Random(), std::nullopt).Sample(logits.data(), 2, kNoHistory);
  EXPECT_TRUE(r.top_logprobs.empty());
  EXPECT_EQ(r.rank, 0);
}

// ---- masks, logit_bias, min_tokens bans ----

std::vector<uint32_t> MaskOf(int64_t vocab, std::initializer_list<int32_t> ids) {
  std::vector<uint32_t> m(static_cast<size_t>((vocab + 31) / 32), 0u);
  for (int32_t id : ids) m[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  return m;
}

TEST(LogitMaskTest, GreedyTakesTheBestAllowedToken) {
  std::vector<float> l(100, 0.f);
  l[3] = 9.f;
  l[70] = 2.f;
  l[40] = 1.f;
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, std::nullopt);
  const auto mask = MaskOf(100, {40, 70});
  EXPECT_EQ(s.Sample(l.data(), 100, kNoHistory, LogitMask{mask, {}}).token_id, 70);
  EXPECT_EQ(s.Sample(l.data(), 100, kNoHistory).token_id, 3);  // unmasked: unchanged
  EXPECT_EQ(l[3], 9.f);                                        // the input is left alone
}

TEST(LogitMaskTest, SparseGreedyTiesGoLowAndNaNNeverWins) {
  std::vector<float> l(4096, 0.f);
  l[100] = 3.f;
  l[200] = 3.f;
  l[300] = std::nanf("");
  l[4000] = 50.f;  // not allowed
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, std::nullopt);
  EXPECT_EQ(
      s.Sample(l.data(), 4096, kNoHistory, LogitMask{MaskOf(4096, {300, 200, 100}), {}}).token_id,
      100);
  EXPECT_EQ(s.Sample(l.data(), 4096, kNoHistory, LogitMask{MaskOf(4096, {300, 7}), {}}).token_id,
            7);
  const int32_t banned[] = {100};
  EXPECT_EQ(
      s.Sample(l.data(), 4096, kNoHistory, LogitMask{MaskOf(4096, {100, 200}), banned}).token_id,
      200);
}

TEST(LogitMaskTest, SampledDrawsStayInsideTheMaskAndRenormalise) {
  std::vector<float> l(1000);
  std::mt19937 rng(1);
  for (float& x : l) x = std::normal_distribution<float>(0, 3)(rng);
  const auto mask = MaskOf(1000, {5, 500, 999});
  Sampler s(Random(3), std::nullopt);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 3000; ++i)
    seen[s.Sample(l.data(), 1000, kNoHistory, LogitMask{mask, {}}).token_id]++;
  for (const auto& [id, n] : seen) EXPECT_TRUE(id == 5 || id == 500 || id == 999) << id;
  auto d = s.Distribution(l.data(), 1000, kNoHistory, LogitMask{mask, {}});
  double total = 0;
  for (const TokenProb& tp : d) total += tp.prob;
  EXPECT_EQ(d.size(), 3u);
  EXPECT_NEAR(total, 1.0, 1e-9);
  // Each kept token's share is its softmax over the three.
  const double z = std::exp(l[5]) + std::exp(l[500]) + std::exp(l[999]);
  for (const TokenProb& tp : d) EXPECT_NEAR(tp.prob, std::exp(l[tp.token_id]) / z, 1e-5);
}

TEST(LogitMaskTest, AllowedTokensWithMinusInfinityLogitsStillWin) {
  std::vector<float> l(64, 1.f);
  l[33] = -std::numeric_limits<float>::infinity();
  const auto mask = MaskOf(64, {33});
  for (float t : {0.f, 1.f}) {
    SamplingParams p = Random();
    p.temperature = t;
    Sampler s(p, std::nullopt);
    EXPECT_EQ(s.Sample(l.data(), 64, kNoHistory, LogitMask{mask, {}}).token_id, 33);
  }
}

TEST(LogitMaskTest, BannedTokensAreNeverSampledAndLogprobsStayRaw) {
  std::vector<float> l = {5.f, 4.f, 1.f};
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 1;
  Sampler s(p, std::nullopt);
  const int32_t banned[] = {0};
  SampleResult r = s.Sample(l.data(), 3, kNoHistory, LogitMask{{}, banned});
  EXPECT_EQ(r.token_id, 1);
  ASSERT_EQ(r.top_logprobs.size(), 1u);
  EXPECT_EQ(r.top_logprobs[0].token_id, 0);  // raw logprobs: before the mask
}

TEST(LogitMaskTest, TheAllowedSetWinsOverBansThatLeaveNothing) {
  // A complete grammar allows only EOS (7); min_tokens bans it: EOS still.
  std::vector<float> l(64, 0.f);
  l[3] = 5.f;
  const auto mask = MaskOf(64, {7});
  const int32_t banned[] = {7};
  for (float t : {0.f, 1.f}) {
    SamplingParams p = Random();
    p.temperature = t;
    Sampler s(p, std::nullopt);
    EXPECT_EQ(s.Sample(l.data(), 64, kNoHistory, LogitMask{mask, banned}).token_id, 7);
  }
}

TEST(LogitBiasTest, BiasShiftsLogitsBeforeSampling) {
  std::vector<float> l = {3.f, 2.f, 1.f};
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{2, 5.f}};
  Sampler s(p, std::nullopt);
  EXPECT_EQ(s.Sample(l.data(), 3, kNoHistory).token_id, 2);
  p.logit_bias = {{0, -100.f}};
  Sampler s2(p, std::nullopt);
  EXPECT_EQ(s2.Sample(l.data(), 3, kNoHistory).token_id, 1);
  p.logit_bias = {{7, 100.f}};  // past the vocabulary: ignored
  Sampler s3(p, std::nullopt);
  EXPECT_EQ(s3.Sample(l.data(), 3, kNoHistory).token_id, 0);
  // Sampled: the distribution is the softmax of the biased logits.
  SamplingParams q = Random();
  q.logit_bias = {{1, std::log(2.f)}};
  Sampler s4(q, std::nullopt);
  auto d = s4.Distribution(l.data(), 3, kNoHistory);
  std::map<int32_t, double> pr;
  for (const TokenProb& tp : d) pr[tp.token_id] = tp.prob;
  EXPECT_NEAR(pr[1] / pr[0], 2 * std::exp(-1.0), 1e-5);
}

TEST(SamplingParamsTest, MinTokensAndLogitBiasRanges) {
  SamplingParams p;
  p.max_tokens = 4;
  p.min_tokens = 5;
  EXPECT_FALSE(p.Validate().ok());
  p.min_tokens = 4;
  EXPECT_TRUE(p.Validate().ok());
  p.logit_bias = {{1, 101.f}};
  EXPECT_FALSE(p.Validate().ok());
  p.logit_bias = {{-1, 1.f}};
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace strata
