#include "disagg/page_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "disagg/page_ops_test_util.h"

namespace strata::disagg {
namespace {

TEST(PageRunOffsetTest, HandComputedOffsets) {
  const KvLayout l = TwoGroups(1);
  ASSERT_EQ(l.BytesPerPagePerTensor(0), 16u);
  ASSERT_EQ(l.BytesPerPagePerTensor(1), 32u);
  // Group 0, 10 pages: run 16 B, T = 2. (layer 1, V, page 3) = ((1*2+1)*10+3)*16.
  EXPECT_EQ(PageRunOffset(l, 10, 0, 1, 1, 3), 33u * 16);
  EXPECT_EQ(PageRunOffset(l, 10, 0, 0, 0, 0), 0u);
  // Group 1, 10 pages: run 32 B, T = 1. (layer 2, K, page 9) = (2*10+9)*32.
  EXPECT_EQ(PageRunOffset(l, 10, 1, 2, 0, 9), 29u * 32);

  const KvLayout l16 = TwoGroups(16);
  EXPECT_EQ(l16.BytesPerPagePerTensor(0), 256u);
  EXPECT_EQ(PageRunOffset(l16, 7, 0, 1, 0, 5), ((1 * 2 + 0) * 7 + 5) * 256u);
}

// PagesOfRange inverts PageRunOffset: the ops of a page list touch exactly
// those pages, and byte ranges across runs and slices give the pages they
// cover.
TEST(PagesOfRangeTest, InvertsTheOpsOfAPageListAndCoversRanges) {
  const KvLayout l = TwoGroups(16);
  const int64_t n = 9;
  const std::vector<int32_t> src = {0, 1, 2, 3}, dst = {7, 2, 3, 5};
  auto ops = PageWriteOps(l, {n, 0}, {n, 0}, src, dst);
  ASSERT_TRUE(ops.ok());
  for (const WriteOp& op : *ops) {
    auto pages = PagesOfRange(l, n, op.dst_region, op.dst_offset, op.length);
    ASSERT_TRUE(pages.ok()) << pages.status().ToString();
    for (int32_t p : *pages)
      EXPECT_TRUE(p == 7 || p == 2 || p == 3 || p == 5) << "op touches page " << p;
  }
  // One run of group 0 (256 B) at (layer 0, K, page 4): just page 4.
  EXPECT_EQ(*PagesOfRange(l, n, 0, 4 * 256, 256), (std::vector<int32_t>{4}));
  // One byte past a run's end reaches the next page; a range crossing from
  // the last page of one [layer][tensor] slice into the next wraps to 0.
  EXPECT_EQ(*PagesOfRange(l, n, 0, 4 * 256, 257), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(*PagesOfRange(l, n, 0, 8 * 256 + 10, 300), (std::vector<int32_t>{0, 8}));
  // A whole slice or more: every page.
  EXPECT_EQ(PagesOfRange(l, n, 1, 0, n * 512)->size(), static_cast<size_t>(n));
  EXPECT_TRUE(PagesOfRange(l, n, 0, 100, 0)->empty());
  // Past the buffer (group 0: 2 layers x 2 tensors x 9 pages x 256 B), or no such group.
  EXPECT_FALSE(PagesOfRange(l, n, 0, 2 * 2 * 9 * 256 - 10, 11).ok());
  EXPECT_TRUE(PagesOfRange(l, n, 0, 2 * 2 * 9 * 256 - 10, 10).ok());
  EXPECT_FALSE(PagesOfRange(l, n, 2, 0, 1).ok());
}

TEST(PageRunOffsetTest, AgreesWithKvPoolMemoryPagePtr) {
  for (int page_size : {1, 16}) {
    const KvLayout l = TwoGroups(page_size);
    KvPoolMemory mem;
    mem.layout = &l;
    mem.num_pages = 5;
    std::vector<char> b0(1 << 16), b1(1 << 16);
    mem.group_base = {b0.data(), b1.data()};
    for (int g = 0; g < 2; ++g) {
      const PoolGroupSpec& s = l.groups[static_cast<size_t>(g)];
      for (int layer = 0; layer < s.num_layers; ++layer) {
        for (int t = 0; t < (s.has_v ? 2 : 1); ++t) {
          for (int64_t p = 0; p < mem.num_pages; ++p) {
            EXPECT_EQ(static_cast<uint64_t>(mem.PagePtr(g, layer, t, p) - mem.group_base[g]),
                      PageRunOffset(l, mem.num_pages, g, layer, t, p));
          }
        }
      }
    }
  }
}

TEST(PageWriteOpsTest, ExactOpsForTwoGroups) {
  const KvLayout l = TwoGroups(1);
  const PoolRegions src{10, 0};
  const PoolRegions dst{20, 5};  // the receiver registered something before its pool
  const std::vector<int32_t> sp = {3};
  const std::vector<int32_t> dp = {17};
  auto ops = PageWriteOps(l, src, dst, sp, dp);
  ASSERT_TRUE(ops.ok()) << ops.status().ToString();
  // group 0: 2 layers x 2 tensors; group 1: 3 layers x 1 tensor.
  ASSERT_EQ(ops->size(), 7u);
  const WriteOp& first = (*ops)[0];
  EXPECT_EQ(first.src_region, 0);
  EXPECT_EQ(first.dst_region, 5);
  EXPECT_EQ(first.src_offset, 3u * 16);
  EXPECT_EQ(first.dst_offset, 17u * 16);
  EXPECT_EQ(first.length, 16u);
  const WriteOp& v_of_layer1 = (*ops)[3];  // group 0, layer 1, V
  EXPECT_EQ(v_of_layer1.src_offset, ((1 * 2 + 1) * 10 + 3) * 16u);
  EXPECT_EQ(v_of_layer1.dst_offset, ((1 * 2 + 1) * 20 + 17) * 16u);
  const WriteOp& latent2 = (*ops)[6];  // group 1, layer 2, K
  EXPECT_EQ(latent2.src_region, 1);
  EXPECT_EQ(latent2.dst_region, 6);
  EXPECT_EQ(latent2.src_offset, (2 * 10 + 3) * 32u);
  EXPECT_EQ(latent2.dst_offset, (2 * 20 + 17) * 32u);
  EXPECT_EQ(latent2.length, 32u);
}

TEST(PageWriteOpsTest, MergesRunsWhereBothSidesAdvance) {
  const KvLayout l = TwoGroups(16);
  // src 1,2,3 -> dst 7,8,9 merge; src 4 -> dst 11 breaks (dst jumps);
  // src 9 -> dst 12 breaks (src jumps); src 10 -> dst 13 merges with it.
  const std::vector<int32_t> sp = {1, 2, 3, 4, 9, 10};
  const std::vector<int32_t> dp = {7, 8, 9, 11, 12, 13};
  auto ops = PageWriteOps(l, {16, 0}, {16, 0}, sp, dp);
  ASSERT_TRUE(ops.ok()) << ops.status().ToString();
  ASSERT_EQ(ops->size(), 3u * 7);  // 3 runs per (group, layer, tensor)
  const uint64_t run = l.BytesPerPagePerTensor(0);
  EXPECT_EQ((*ops)[0].length, 3 * run);
  EXPECT_EQ((*ops)[0].src_offset, 1 * run);
  EXPECT_EQ((*ops)[0].dst_offset, 7 * run);
  EXPECT_EQ((*ops)[1].length, 1 * run);
  EXPECT_EQ((*ops)[2].length, 2 * run);
  EXPECT_EQ((*ops)[2].src_offset, 9 * run);
  EXPECT_EQ((*ops)[2].dst_offset, 12 * run);
  // Reversed pages never merge.
  const std::vector<int32_t> rev = {3, 2, 1};
  auto rops = PageWriteOps(l, {16, 0}, {16, 0}, rev, rev);
  ASSERT_TRUE(rops.ok());
  EXPECT_EQ(rops->size(), 3u * 7);
}

// Applies the ops with memcpy between two fake pools and checks that every
// destination page holds its source page and every other byte is untouched.
TEST(PageWriteOpsTest, AppliedOpsMoveExactlyThePages) {
  std::mt19937 rng(7);
  for (int page_size : {1, 16}) {
    const KvLayout l = TwoGroups(page_size);
    KvPoolMemory src, dst;
    src.layout = dst.layout = &l;
    src.num_pages = 12;
    dst.num_pages = 9;
    std::vector<std::vector<char>> sb(2), db(2), before(2);
    for (int g = 0; g < 2; ++g) {
      const size_t per_page = l.BytesPerPage(g);
      sb[g].resize(per_page * src.num_pages);
      db[g].resize(per_page * dst.num_pages);
      for (char& c : sb[g]) c = static_cast<char>(rng());
      for (char& c : db[g]) c = static_cast<char>(rng());
      before[g] = db[g];
      src.group_base.push_back(sb[g].data());
      dst.group_base.push_back(db[g].data());
    }
    const std::vector<int32_t> sp = {0, 1, 2, 11, 5, 6};
    const std::vector<int32_t> dp = {4, 5, 6, 0, 8, 2};
    auto ops = PageWriteOps(l, {src.num_pages, 0}, {dst.num_pages, 0}, sp, dp);
    ASSERT_TRUE(ops.ok()) << ops.status().ToString();
    for (const WriteOp& op : *ops) {
      ASSERT_LE(op.src_offset + op.length, sb[op.src_region].size());
      ASSERT_LE(op.dst_offset + op.length, db[op.dst_region].size());
      std::memcpy(db[op.dst_region].data() + op.dst_offset,
                  sb[op.src_region].data() + op.src_offset, op.length);
    }
    for (int g = 0; g < 2; ++g) {
      const PoolGroupSpec& s = l.groups[g];
      const size_t run = l.BytesPerPagePerTensor(g);
      for (int layer = 0; layer < s.num_layers; ++layer) {
        for (int t = 0; t < (s.has_v ? 2 : 1); ++t) {
          for (int64_t p = 0; p < dst.num_pages; ++p) {
            const char* got = dst.PagePtr(g, layer, t, p);
            const auto it = std::find(dp.begin(), dp.end(), p);
            const char* want = it == dp.end() ? before[g].data() + (got - dst.group_base[g])
                                              : src.PagePtr(g, layer, t, sp[it - dp.begin()]);
            EXPECT_EQ(std::memcmp(got, want, run), 0)
                << "page_size " << page_size << " group " << g << " layer " << layer << " tensor "
                << t << " dst page " << p;
          }
        }
      }
    }
  }
}

TEST(PageWriteOpsTest, RejectsBadPagesNamingThem) {
  const KvLayout l = TwoGroups(1);
  const std::vector<int32_t> ok = {0, 1};
  const std::vector<int32_t> out_of_src = {0, 10};
  const std::vector<int32_t> negative = {-1, 0};
  const std::vector<int32_t> dup = {4, 4};
  const std::vector<int32_t> one = {0};

  auto r = PageWriteOps(l, {10, 0}, {10, 0}, out_of_src, ok);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sender page 10 (index 1)"), std::string::npos)
      << r.status().message();

  r = PageWriteOps(l, {10, 0}, {10, 0}, ok, negative);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("receiver page -1 (index 0)"), std::string::npos)
      << r.status().message();

  r = PageWriteOps(l, {10, 0}, {10, 0}, ok, dup);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("receiver page 4 appears twice"), std::string::npos)
      << r.status().message();

  r = PageWriteOps(l, {10, 0}, {10, 0}, ok, one);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  KvLayout bad = l;
  bad.page_size = 0;
  r = PageWriteOps(bad, {10, 0}, {10, 0}, ok, ok);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(PageWriteOpsTest, EmptyTransferHasNoOps) {
  auto r = PageWriteOps(TwoGroups(16), {4, 0}, {4, 0}, {}, {});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

}  // namespace
}  // namespace strata::disagg
