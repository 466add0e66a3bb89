#include "cache/page_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace strata {
namespace {

TEST(PageTableTest, PagesNeededRoundsUpPerPageSize) {
  PageTable t1(1);
  EXPECT_EQ(t1.PagesNeeded(0), 0);
  EXPECT_EQ(t1.PagesNeeded(5), 5);
  PageTable t16(16);
  EXPECT_EQ(t16.PagesNeeded(0), 0);
  EXPECT_EQ(t16.PagesNeeded(1), 1);
  EXPECT_EQ(t16.PagesNeeded(16), 1);
  EXPECT_EQ(t16.PagesNeeded(17), 2);
}

TEST(PageTableTest, ReserveGrowsOnlyByMissingPages) {
  PageAllocator a(8);
  PageTable t(16);
  ASSERT_TRUE(t.Reserve(20, a).ok());
  EXPECT_EQ(t.pages().size(), 2u);
  EXPECT_EQ(t.capacity(), 32);
  EXPECT_EQ(t.num_tokens(), 0);
  t.SetNumTokens(20);
  EXPECT_EQ(t.PagesNeeded(32), 0);
  EXPECT_EQ(t.PagesNeeded(33), 1);
  ASSERT_TRUE(t.Reserve(32, a).ok());
  EXPECT_EQ(t.pages().size(), 2u);
  ASSERT_TRUE(t.Reserve(33, a).ok());
  EXPECT_EQ(t.pages().size(), 3u);
  EXPECT_EQ(a.num_used(), 3);
  t.Release(a);
  EXPECT_TRUE(t.pages().empty());
  EXPECT_EQ(t.num_tokens(), 0);
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageTableTest, ReserveFailureChangesNothing) {
  PageAllocator a(3);
  PageTable t(4);
  ASSERT_TRUE(t.Reserve(8, a).ok());
  t.SetNumTokens(8);
  const std::vector<int32_t> before = t.pages();
  EXPECT_EQ(t.Reserve(17, a).code(), StatusCode::kResourceExhausted);  // needs 3 more, 1 free
  EXPECT_EQ(t.pages(), before);
  EXPECT_EQ(t.num_tokens(), 8);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageTableTest, SlotsWithPageSizeOne) {
  PageAllocator a(8);
  std::vector<int32_t> scratch;
  ASSERT_TRUE(a.Allocate(3, &scratch).ok());  // pages 0..2 taken by someone else
  PageTable t(1);
  ASSERT_TRUE(t.Reserve(3, a).ok());
  EXPECT_EQ(t.pages(), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(t.Slot(0), 3);
  EXPECT_EQ(t.Slot(2), 5);
  int64_t slots[3];
  t.Slots(0, 3, slots);
  EXPECT_EQ(slots[0], 3);
  EXPECT_EQ(slots[1], 4);
  EXPECT_EQ(slots[2], 5);
}

TEST(PageTableTest, SlotsWithPageSizeSixteen) {
  PageAllocator a(8);
  std::vector<int32_t> scratch;
  ASSERT_TRUE(a.Allocate(5, &scratch).ok());
  ASSERT_TRUE(a.Unref(2));  // frees page 2: the table gets 2 first, then 5
  PageTable t(16);
  ASSERT_TRUE(t.Reserve(20, a).ok());
  ASSERT_EQ(t.pages(), (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(t.Slot(0), 2 * 16);
  EXPECT_EQ(t.Slot(15), 2 * 16 + 15);
  EXPECT_EQ(t.Slot(16), 5 * 16);
  EXPECT_EQ(t.Slot(19), 5 * 16 + 3);
  std::vector<int64_t> slots(6);
  t.Slots(14, 20, slots.data());
  EXPECT_EQ(slots, (std::vector<int64_t>{46, 47, 80, 81, 82, 83}));
}

TEST(PageTableTest, SharedPrefixSurvivesFirstOwnersRelease) {
  PageAllocator a(8);
  PageTable parent(4);
  ASSERT_TRUE(parent.Reserve(10, a).ok());  // 3 pages: 0, 1, 2
  parent.SetNumTokens(10);

  // The child shares the two full pages (8 tokens), then grows on its own.
  PageTable child(4);
  std::vector<int32_t> prefix(parent.pages().begin(), parent.pages().begin() + 2);
  child.AdoptSharedPrefix(prefix, a);
  EXPECT_EQ(child.num_tokens(), 8);
  EXPECT_EQ(a.refcount(0), 2);
  EXPECT_EQ(a.refcount(1), 2);
  EXPECT_EQ(a.refcount(2), 1);
  ASSERT_TRUE(child.Reserve(12, a).ok());
  EXPECT_EQ(child.pages(), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(a.num_used(), 4);

  parent.Release(a);
  EXPECT_EQ(a.refcount(0), 1);
  EXPECT_EQ(a.refcount(1), 1);
  EXPECT_EQ(a.refcount(2), 0);  // only the parent had it
  EXPECT_EQ(a.num_used(), 3);
  EXPECT_TRUE(a.CheckIntegrity().ok());

  // The shared pages are not handed out to anyone else while the child lives.
  std::vector<int32_t> others;
  ASSERT_TRUE(a.Allocate(a.num_free(), &others).ok());
  for (int32_t p : others) {
    EXPECT_NE(p, 0);
    EXPECT_NE(p, 1);
    EXPECT_NE(p, 3);
  }
  for (int32_t p : others) a.Unref(p);

  child.Release(a);
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageTableTest, TruncateFreesTrailingPagesOnly) {
  PageAllocator a(8);
  PageTable t(4);
  ASSERT_TRUE(t.Reserve(16, a).ok());
  t.SetNumTokens(14);
  t.Truncate(9, a);  // keeps ceil(9 / 4) = 3 pages
  EXPECT_EQ(t.pages().size(), 3u);
  EXPECT_EQ(t.num_tokens(), 9);
  EXPECT_EQ(a.num_used(), 3);
  t.Truncate(12, a);  // nothing past capacity to drop; num_tokens stays
  EXPECT_EQ(t.pages().size(), 3u);
  EXPECT_EQ(t.num_tokens(), 9);
  t.Truncate(0, a);
  EXPECT_TRUE(t.pages().empty());
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageTableDeathTest, ContractViolationsAbort) {
  PageAllocator a(4);
  PageTable t(4);
  ASSERT_TRUE(t.Reserve(4, a).ok());
  EXPECT_DEATH(t.SetNumTokens(5), "capacity");
  EXPECT_DEATH(t.AdoptSharedPrefix(t.pages(), a), "non-empty");
  int64_t slot;
  EXPECT_DEATH(t.Slots(0, 5, &slot), "capacity");
}

}  // namespace
}  // namespace strata
