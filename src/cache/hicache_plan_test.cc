#include "cache/hicache_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

namespace strata {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A DeepSeek-V4-like pool: three groups of different bytes per page (a
// compressed MLA latent, the sparse-attention indexer keys, a sliding-window
// K+V cache), 61 layers each, page size 64, bf16.
KvLayout ThreeGroupLayout() {
  KvLayout l;
  l.page_size = 64;
  PoolGroupSpec latent{"compressed_latent", 61, 1, 576, DType::kBF16, /*has_v=*/false};
  PoolGroupSpec indexer{"indexer", 61, 1, 128, DType::kBF16, /*has_v=*/false};
  PoolGroupSpec swa{"sliding_window",      61, 1, 128, DType::kBF16, /*has_v=*/true,
                    /*sliding_window=*/128};
  l.groups = {latent, indexer, swa};
  return l;
}

HostMemoryFacts OneNode(uint64_t total, uint64_t free) {
  HostMemoryFacts f;
  f.nodes = {{0, total, free}};
  f.allowed_nodes = {0};
  f.mem_available_bytes = free;
  return f;
}

HiCacheOptions Ratio(double r) {
  HiCacheOptions o;
  o.enabled = true;
  o.ratio = r;
  o.ratio_explicit = true;
  return o;
}

HiCacheOptions Size(double gb) {
  HiCacheOptions o;
  o.enabled = true;
  o.size_gb = gb;
  return o;
}

// The incident: a 160 GB device pool, --hicache-ratio 2 (320 GB) on a node
// with 240 GB free of 256 GB, a GPU model (no weights in host memory).
TEST(HiCachePlanTest, TheIncidentIsRefusedWithEveryNumberAndWhatFits) {
  const KvLayout l = ThreeGroupLayout();
  ASSERT_EQ(l.BytesPerPage(0), 4497408u);
  ASSERT_EQ(l.BytesPerPage(1), 999424u);
  ASSERT_EQ(l.BytesPerPage(2), 1998848u);
  ASSERT_EQ(l.BytesPerPage(), 7495680u);
  const int64_t device_pages = int64_t{160} * 1000000000 / l.BytesPerPage();  // 160 GB
  ASSERT_EQ(device_pages, 21345);
  const HostMemoryFacts facts = OneNode(256 * kGB, 240 * kGB);
  const uint64_t reserve = DefaultHostReserveBytes(facts, -1, 0);
  EXPECT_EQ(reserve, 12800000000u);  // 5% of 256 GB beats 2 GiB
  auto p = PlanHostTier(l, device_pages, Ratio(2), facts, reserve);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  const std::string m = p.status().message();
  // 240 GB - 12.8 GB = 227.2 GB = 30310.9 pages; 30310 / 21345 = 1.42.
  EXPECT_THAT(m, HasSubstr("At most --hicache-ratio 1.42 or --hicache-size 227.2 fits")) << m;
  EXPECT_THAT(m, HasSubstr("--hicache-ratio 2 asks for 42690 host pages = 319.99 GB")) << m;
  EXPECT_THAT(m,
              HasSubstr("compressed_latent 191.99 GB, indexer 42.67 GB, sliding_window 85.33 GB"))
      << m;
  EXPECT_THAT(m, HasSubstr("device pool of 21345 pages = 160.00 GB")) << m;
  EXPECT_THAT(m, HasSubstr("compressed_latent 96.00 GB, indexer 21.33 GB, sliding_window 42.67 GB"))
      << m;
  EXPECT_THAT(m, HasSubstr("240.00 GB free on NUMA node 0")) << m;
  EXPECT_THAT(m, HasSubstr("reserve of 12.80 GB")) << m;
  EXPECT_THAT(m, HasSubstr("leaving 227.20 GB")) << m;
  EXPECT_THAT(m, HasSubstr("GB = 10^9 bytes")) << m;
  EXPECT_THAT(m, Not(HasSubstr("cgroup"))) << m;
  // The figures it names are the largest that fit: each one is accepted,
  // one step above is refused.
  EXPECT_TRUE(PlanHostTier(l, device_pages, Ratio(1.42), facts, reserve).ok());
  EXPECT_FALSE(PlanHostTier(l, device_pages, Ratio(1.43), facts, reserve).ok());
  EXPECT_TRUE(PlanHostTier(l, device_pages, Size(227.2), facts, reserve).ok());
  EXPECT_FALSE(PlanHostTier(l, device_pages, Size(227.3), facts, reserve).ok());
}

TEST(HiCachePlanTest, TheIncidentsSizeIsAcceptedAndSplitByBytesPerPage) {
  const KvLayout l = ThreeGroupLayout();
  const HostMemoryFacts facts = OneNode(256 * kGB, 240 * kGB);
  const uint64_t reserve = DefaultHostReserveBytes(facts, -1, 0);
  auto p = PlanHostTier(l, 21345, Size(150), facts, reserve);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->host_pages, 20011);  // floor(150e9 / 7495680)
  ASSERT_EQ(p->group_bytes.size(), 3u);
  EXPECT_EQ(p->group_bytes[0], 89997631488u);
  EXPECT_EQ(p->group_bytes[1], 19999473664u);
  EXPECT_EQ(p->group_bytes[2], 39998947328u);
  EXPECT_EQ(p->total_bytes, 149996052480u);
  EXPECT_LE(p->total_bytes, 150 * kGB);
  EXPECT_GT(p->total_bytes + l.BytesPerPage(), 150 * kGB);  // only the partial page is dropped
  // In proportion to bytes per page: 4497408 : 999424 : 1998848 = 4.5 : 1 : 2.
  for (int g = 0; g < 3; ++g)
    EXPECT_DOUBLE_EQ(static_cast<double>(p->group_bytes[g]) / p->total_bytes,
                     static_cast<double>(l.BytesPerPage(g)) / l.BytesPerPage())
        << g;
  EXPECT_EQ(p->available_bytes, 240 * kGB);
  EXPECT_EQ(p->reserve_bytes, reserve);
  EXPECT_EQ(p->numa_node, -1);
  // 150 GB under a 160 GB device pool: accepted, with a warning.
  ASSERT_EQ(p->warnings.size(), 1u);
  EXPECT_THAT(p->warnings[0], HasSubstr("no larger than the device pool (21345 pages)"));
  EXPECT_THAT(DescribeHostTierPlan(*p, l), HasSubstr("20011 pages = 150.00 GB"));
}

TEST(HiCachePlanTest, RatioSetsHostPagesFromDevicePages) {
  const KvLayout l = ThreeGroupLayout();
  const HostMemoryFacts facts = OneNode(2000 * kGB, 1900 * kGB);
  auto p = PlanHostTier(l, 1000, Ratio(2.5), facts, 0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->host_pages, 2500);
  EXPECT_EQ(p->total_bytes, 2500 * l.BytesPerPage());
  EXPECT_TRUE(p->warnings.empty());
  // The default ratio (not given explicitly) is 2, and a size overrides it
  // without an error: only an explicit ratio conflicts.
  HiCacheOptions def;
  def.enabled = true;
  EXPECT_EQ(PlanHostTier(l, 1000, def, facts, 0)->host_pages, 2000);
  EXPECT_EQ(PlanHostTier(l, 1000, Size(1), facts, 0)->host_pages, 133);  // 1e9 / 7495680
  // floor, never rounding up.
  EXPECT_EQ(PlanHostTier(l, 3, Ratio(1.5), facts, 0)->host_pages, 4);
}

TEST(HiCachePlanTest, RatioAtMostOneIsRefusedSayingItExtendsNothing) {
  const KvLayout l = ThreeGroupLayout();
  const HostMemoryFacts facts = OneNode(2000 * kGB, 1900 * kGB);
  for (double r : {1.0, 0.5, 0.0, -2.0}) {
    auto p = PlanHostTier(l, 1000, Ratio(r), facts, 0);
    ASSERT_FALSE(p.ok()) << r;
    EXPECT_THAT(p.status().message(), HasSubstr("must exceed 1")) << r;
    EXPECT_THAT(p.status().message(), HasSubstr("extends nothing")) << r;
    EXPECT_THAT(p.status().message(), HasSubstr("1000 pages")) << r;
  }
}

TEST(HiCachePlanTest, RatioAndSizeTogetherNameBothFlags) {
  const KvLayout l = ThreeGroupLayout();
  HiCacheOptions o = Ratio(2);
  o.size_gb = 10;
  auto p = PlanHostTier(l, 1000, o, OneNode(2000 * kGB, 1900 * kGB), 0);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(),
              HasSubstr("--hicache-ratio and --hicache-size were both given"));
  EXPECT_THAT(p.status().message(), HasSubstr("Give one of them"));
}

TEST(HiCachePlanTest, BadSizesAndDevicePools) {
  const KvLayout l = ThreeGroupLayout();
  const HostMemoryFacts facts = OneNode(2000 * kGB, 1900 * kGB);
  auto neg = PlanHostTier(l, 1000, Size(-1), facts, 0);
  ASSERT_FALSE(neg.ok());
  EXPECT_THAT(neg.status().message(), HasSubstr("expected a positive number of GB"));
  auto tiny = PlanHostTier(l, 1000, Size(0.001), facts, 0);  // 1 MB < one 7.5 MB page
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(tiny.status().message(), HasSubstr("--hicache-size 0.001 holds no page"));
  EXPECT_THAT(tiny.status().message(), HasSubstr("7495680 bytes"));
  auto none = PlanHostTier(l, 0, Ratio(2), facts, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("the device pool has 0 pages"));
  KvLayout bad = l;
  bad.groups[1].num_layers = 0;
  EXPECT_FALSE(PlanHostTier(bad, 1000, Ratio(2), facts, 0).ok());
  // Absurd ratios are over budget (with the numbers), not an overflow.
  auto huge = PlanHostTier(l, 1000, Ratio(1e300), facts, 0);
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("does not fit"));
}

TEST(HiCachePlanTest, NumaNodeMustExistAndBeAllowed) {
  const KvLayout l = ThreeGroupLayout();
  HostMemoryFacts facts;
  facts.nodes = {{0, 512 * kGB, 400 * kGB}, {1, 512 * kGB, 300 * kGB}, {2, 512 * kGB, 500 * kGB}};
  facts.allowed_nodes = {0, 1};
  HiCacheOptions o = Ratio(2);
  o.numa_node = 99;
  auto missing = PlanHostTier(l, 1000, o, facts, 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("--numa-node 99: this machine has no such NUMA node"));
  EXPECT_THAT(missing.status().message(),
              HasSubstr("nodes: 0-2; this process may allocate from: 0-1"));
  o.numa_node = 2;
  auto forbidden = PlanHostTier(l, 1000, o, facts, 0);
  ASSERT_FALSE(forbidden.ok());
  EXPECT_THAT(forbidden.status().message(),
              HasSubstr("--numa-node 2: this process may not allocate from"));
  o.numa_node = 1;
  auto ok = PlanHostTier(l, 1000, o, facts, 0);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->available_bytes, 300 * kGB);  // node 1 alone
  EXPECT_EQ(ok->numa_node, 1);
  // Without --numa-node: the allowed nodes together.
  o.numa_node = -1;
  EXPECT_EQ(PlanHostTier(l, 1000, o, facts, 0)->available_bytes, 700 * kGB);
}

TEST(HiCachePlanTest, OverBudgetOnSeveralNodesSaysWhichAndOnOneNodeSuggestsAnother) {
  const KvLayout l = ThreeGroupLayout();
  HostMemoryFacts facts;
  facts.nodes = {{0, 128 * kGB, 100 * kGB}, {1, 128 * kGB, 100 * kGB}};
  auto all = PlanHostTier(l, 21345, Ratio(2), facts, 4 * kGB);
  ASSERT_FALSE(all.ok());
  EXPECT_THAT(all.status().message(), HasSubstr("200.00 GB free on the allowed NUMA nodes 0-1"));
  EXPECT_THAT(all.status().message(), Not(HasSubstr("--numa-node")));
  HiCacheOptions o = Ratio(2);
  o.numa_node = 1;
  auto one = PlanHostTier(l, 21345, o, facts, 4 * kGB);
  ASSERT_FALSE(one.ok());
  EXPECT_THAT(one.status().message(), HasSubstr("100.00 GB free on NUMA node 1"));
  EXPECT_THAT(one.status().message(), HasSubstr("choose another --numa-node"));
}

TEST(HiCachePlanTest, ACgroupLimitThatBindsIsNamed) {
  const KvLayout l = ThreeGroupLayout();
  HostMemoryFacts facts = OneNode(256 * kGB, 240 * kGB);
  facts.cgroup_limit_bytes = 100 * kGB;
  facts.cgroup_usage_bytes = 10 * kGB;
  facts.cgroup_path = "/sys/fs/cgroup/strata";
  auto p = PlanHostTier(l, 21345, Ratio(2), facts, 12800000000u);
  ASSERT_FALSE(p.ok());
  const std::string m = p.status().message();
  EXPECT_THAT(
      m, HasSubstr("240.00 GB free on NUMA node 0, but the memory cgroup /sys/fs/cgroup/strata "
                   "(limit 100.00 GB, 10.00 GB in use) leaves only 90.00 GB (that limit binds)"))
      << m;
  EXPECT_THAT(m, HasSubstr("leaving 77.20 GB")) << m;
  // 77.2e9 / 7495680 = 10299 pages: no ratio above 1 fits, a size does.
  EXPECT_THAT(m, HasSubstr("No --hicache-ratio above 1 fits")) << m;
  EXPECT_THAT(m, HasSubstr("at most --hicache-size 77.2 fits")) << m;
  EXPECT_TRUE(PlanHostTier(l, 21345, Size(77.2), facts, 12800000000u).ok());
}

TEST(HiCachePlanTest, WhenTheReserveTakesEverythingNothingFits) {
  const KvLayout l = ThreeGroupLayout();
  const HostMemoryFacts facts = OneNode(16 * kGB, 10 * kGB);
  auto p = PlanHostTier(l, 100, Ratio(2), facts, 12 * kGB);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("Nothing fits"));
  EXPECT_THAT(p.status().message(), HasSubstr("leaving 0.00 GB"));
}

TEST(HiCachePlanTest, DefaultReserveIsTwoGiBOrFivePercentPlusHostResidentWeightsAndPools) {
  EXPECT_EQ(DefaultHostReserveBytes(OneNode(16 * kGB, 10 * kGB), -1, 0), 2 * kGiB);
  EXPECT_EQ(DefaultHostReserveBytes(OneNode(16 * kGB, 10 * kGB), -1, 5 * kGB), 2 * kGiB + 5 * kGB);
  EXPECT_EQ(DefaultHostReserveBytes(OneNode(1000 * kGB, 10 * kGB), -1, 0), 50 * kGB);
  HostMemoryFacts two;
  two.nodes = {{0, 400 * kGB, 1}, {1, 600 * kGB, 1}};
  EXPECT_EQ(DefaultHostReserveBytes(two, -1, 0), 50 * kGB);  // both nodes' total
  EXPECT_EQ(DefaultHostReserveBytes(two, 1, 0), 30 * kGB);   // node 1's total
}

TEST(HiCachePlanTest, PolicyNamesRoundTripAndBadNamesListTheChoices) {
  for (auto p : {HiCacheWritePolicy::kWriteThrough, HiCacheWritePolicy::kWriteThroughSelective,
                 HiCacheWritePolicy::kWriteBack})
    EXPECT_EQ(*ParseWritePolicy(WritePolicyName(p)), p);
  for (auto p :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout})
    EXPECT_EQ(*ParsePrefetchPolicy(PrefetchPolicyName(p)), p);
  EXPECT_STREQ(WritePolicyName(HiCacheWritePolicy::kWriteThroughSelective),
               "write_through_selective");
  auto w = ParseWritePolicy("write-back");
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(),
              HasSubstr("--hicache-write-policy: 'write-back' is not one of write_through, "
                        "write_through_selective, write_back"));
  auto f = ParsePrefetchPolicy("eager");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("not one of best_effort, wait_complete, timeout"));
}

// Over many machines and pools, the named ratio and size fit and one step
// above them does not.
TEST(HiCachePlanTest, TheNamedLargestFiguresAreExactlyTheLargestThatFit) {
  KvLayout small;  // 4 KiB pages: fine-grained sizes, many pages
  small.page_size = 16;
  small.groups = {{"full_attention", 2, 2, 16, DType::kF32}};
  uint64_t seed = 12345;
  auto next = [&] { return (seed = seed * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  int checked_ratio = 0, checked_size = 0;
  for (const KvLayout& l : {ThreeGroupLayout(), small}) {
    for (int i = 0; i < 300; ++i) {
      const int64_t device_pages = 1 + static_cast<int64_t>(next() % (i % 2 ? 40000 : 300));
      const uint64_t free = (next() % 500 + 1) * kGB + next() % kGB;
      const HostMemoryFacts facts = OneNode(600 * kGB, free);
      const uint64_t reserve = DefaultHostReserveBytes(facts, -1, next() % 4 * kGB);
      auto p = PlanHostTier(l, device_pages, Size(100000), facts, reserve);
      ASSERT_FALSE(p.ok());
      const std::string m = p.status().message();
      std::smatch r;
      // The text the operator would type, and the step above it.
      if (std::regex_search(m, r, std::regex("--hicache-ratio (\\d+)\\.(\\d\\d) or"))) {
        const int64_t r100 = std::stoll(r[1]) * 100 + std::stoll(r[2]);
        EXPECT_TRUE(PlanHostTier(l, device_pages, Ratio(r100 / 100.0), facts, reserve).ok()) << m;
        EXPECT_FALSE(PlanHostTier(l, device_pages, Ratio((r100 + 1) / 100.0), facts, reserve).ok())
            << m;
        ++checked_ratio;
      }
      if (std::regex_search(m, r, std::regex("--hicache-size (\\d+)\\.(\\d) fits"))) {
        const int64_t s10 = std::stoll(r[1]) * 10 + std::stoll(r[2]);
        EXPECT_TRUE(PlanHostTier(l, device_pages, Size(s10 / 10.0), facts, reserve).ok()) << m;
        EXPECT_FALSE(PlanHostTier(l, device_pages, Size((s10 + 1) / 10.0), facts, reserve).ok())
            << m;
        ++checked_size;
      }
    }
  }
  EXPECT_GT(checked_ratio, 300);
  EXPECT_GT(checked_size, 500);
}

}  // namespace
}  // namespace strata
