#include "router/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

namespace strata::router {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Policy> Make(const std::string& name, uint64_t seed = 1) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  auto p = Policy::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(*p);
}

TEST(PolicyTest, UnknownNameListsTheAllowedOnes) {
  PolicyOptions o;
  o.name = "fastest";
  auto p = Policy::Create(o);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("round_robin, random, least_load, cache_aware"));
}

TEST(PolicyTest, RoundRobinRotatesAndSkipsMissingWorkersWithoutRepeating) {
  auto p = Make("round_robin");
  std::vector<Candidate> all = {{0, 0}, {1, 0}, {2, 0}};
  std::vector<int> got;
  for (int i = 0; i < 6; ++i) got.push_back(p->Pick(all, ""));
  EXPECT_EQ(got, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  // Worker 1 drops out after 0 was picked: the next is 2, then 0 again.
  std::vector<Candidate> some = {{0, 0}, {2, 0}};
  EXPECT_EQ(p->Pick(all, ""), 0);
  EXPECT_EQ(p->Pick(some, ""), 2);
  EXPECT_EQ(p->Pick(some, ""), 0);
}

TEST(PolicyTest, RandomCoversEveryCandidate) {
  auto p = Make("random", 42);
  std::vector<Candidate> all = {{3, 0}, {5, 0}, {7, 0}};
  std::map<int, int> n;
  for (int i = 0; i < 3000; ++i) n[p->Pick(all, "")]++;
  ASSERT_EQ(n.size(), 3u);
  for (auto [w, k] : n) EXPECT_GT(k, 800) << w;
}

TEST(PolicyTest, LeastLoadPicksTheSmallestLoadFirstOnTies) {
  auto p = Make("least_load");
  EXPECT_EQ(p->Pick(std::vector<Candidate>{{0, 5}, {1, 2}, {2, 9}}, ""), 1);
  EXPECT_EQ(p->Pick(std::vector<Candidate>{{0, 3}, {1, 3}}, ""), 0);
}

TEST(PrefixBlockHashesTest, ChainedSoEqualHashesMeanEqualPrefixes) {
  const std::string a(200, 'x');
  std::string b = a;
  b[10] = 'y';  // differs in block 0: every later hash differs too
  auto ha = PrefixBlockHashes(a, 64, 64), hb = PrefixBlockHashes(b, 64, 64);
  ASSERT_EQ(ha.size(), 4u);  // 64 + 64 + 64 + 8
  for (size_t k = 0; k < ha.size(); ++k) EXPECT_NE(ha[k], hb[k]) << k;
  std::string c = a;
  c[150] = 'z';  // block 2
  auto hc = PrefixBlockHashes(c, 64, 64);
  EXPECT_EQ(hc[0], ha[0]);
  EXPECT_EQ(hc[1], ha[1]);
  EXPECT_NE(hc[2], ha[2]);
  // Same block contents at another position hash differently (the chain).
  EXPECT_NE(ha[1], ha[0]);
  EXPECT_EQ(PrefixBlockHashes(std::string(100000, 'q')).size(), kAffinityMaxBlocks);
  EXPECT_TRUE(PrefixBlockHashes("").empty());
}

TEST(CacheAwarePolicyTest, SamePrefixSticksToItsWorkerAndNewPrefixesGoToTheLeastLoaded) {
  PolicyOptions o;
  o.balance_abs_threshold = 4;
  o.balance_rel_threshold = 1.5;
  CacheAwarePolicy p(o);
  const std::string sys(300, 's');
  // No match: the least loaded (worker 1).
  EXPECT_EQ(p.Pick(std::vector<Candidate>{{0, 3}, {1, 1}}, sys + " question one"), 1);
  // The same long prefix with another tail follows it, even if worker 1 is
  // now a little busier (within the thresholds).
  EXPECT_EQ(p.Pick(std::vector<Candidate>{{0, 1}, {1, 4}}, sys + " question two"), 1);
  // A different prompt: least loaded.
  EXPECT_EQ(p.Pick(std::vector<Candidate>{{0, 1}, {1, 4}}, "another conversation entirely"), 0);
  // The affinity target is far above the least loaded (by > 4 and > 1.5x):
  // the least loaded takes it, and from then on owns the prefix.
  EXPECT_EQ(p.Pick(std::vector<Candidate>{{0, 2}, {1, 20}}, sys + " question three"), 0);
  EXPECT_EQ(p.Pick(std::vector<Candidate>{{0, 3}, {1, 2}}, sys + " question four"), 0);
  // The owner is not a candidate now (unhealthy): the longest prefix whose
  // owner is one, else the least loaded.
  EXPECT_EQ(p.Pick(std::vector<Candidate>{{1, 5}, {2, 0}}, sys + " question five"), 2);
}

TEST(CacheAwarePolicyTest, LongerMatchWinsAndMemoryIsBounded) {
  PolicyOptions o;
  o.max_entries = 8;
  CacheAwarePolicy p(o);
  const std::string base(64 * 3, 'a');
  std::vector<Candidate> c = {{0, 0}, {1, 0}};
  // Three blocks on worker 1 (no match: the least loaded).
  ASSERT_EQ(p.Pick(std::vector<Candidate>{{0, 1}, {1, 0}}, base), 1);
  // The first block alone moves to worker 0 (worker 1 far too busy).
  ASSERT_EQ(p.Pick(std::vector<Candidate>{{0, 0}, {1, 100}}, base.substr(0, 64) + "elsewhere"), 0);
  // A prompt sharing all three blocks goes to 1: the longest match wins.
  EXPECT_EQ(p.Pick(c, base + "tail"), 1);
  // ... and that request made worker 1 the last to serve block 0 as well.
  EXPECT_EQ(p.Pick(c, base.substr(0, 64) + "elsewhere, again"), 1);
  for (int i = 0; i < 100; ++i)
    p.Pick(c, std::string(64 * 4, static_cast<char>('A' + i % 50)) + std::to_string(i));
  EXPECT_LE(p.entries(), 8u);
}

}  // namespace
}  // namespace strata::router
