#include "cache/page_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

namespace strata {

// Reaches into the allocator to break invariants on purpose.
class PageAllocatorTestPeer {
 public:
  static std::vector<int32_t>& free_list(PageAllocator& a) { return a.free_; }
  static std::vector<int32_t>& refcounts(PageAllocator& a) { return a.refcount_; }
};

namespace {

TEST(PageAllocatorTest, FreshAllocatorHandsOutPagesInOrder) {
  PageAllocator a(4);
  EXPECT_EQ(a.num_pages(), 4);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_used(), 0);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(3, &pages).ok());
  EXPECT_EQ(pages, (std::vector<int32_t>{0, 1, 2}));
  for (int32_t p : pages) EXPECT_EQ(a.refcount(p), 1);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.num_used(), 3);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageAllocatorTest, AllocateAppendsToExistingVector) {
  PageAllocator a(4);
  std::vector<int32_t> pages = {42};
  ASSERT_TRUE(a.Allocate(2, &pages).ok());
  EXPECT_EQ(pages, (std::vector<int32_t>{42, 0, 1}));
  ASSERT_TRUE(a.Allocate(0, &pages).ok());
  EXPECT_EQ(pages.size(), 3u);
}

TEST(PageAllocatorTest, ExhaustionHasNoSideEffects) {
  PageAllocator a(5);
  std::vector<int32_t> held;
  ASSERT_TRUE(a.Allocate(3, &held).ok());
  EXPECT_TRUE(a.CanAllocate(2));
  EXPECT_FALSE(a.CanAllocate(3));

  std::vector<int32_t> out = {7};
  Status s = a.Allocate(3, &out);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("asked for 3, 2 of 5 free"), std::string::npos) << s.message();
  EXPECT_EQ(out, (std::vector<int32_t>{7}));  // untouched
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(a.CheckIntegrity().ok());

  // What was free is still exactly what comes out next.
  ASSERT_TRUE(a.Allocate(2, &out).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{7, 3, 4}));
  EXPECT_FALSE(a.CanAllocate(1));
  EXPECT_TRUE(a.CanAllocate(0));
  EXPECT_EQ(a.Allocate(1, &out).code(), StatusCode::kResourceExhausted);
}

TEST(PageAllocatorTest, FreedPagesAreReusedLastInFirstOut) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(4, &pages).ok());
  EXPECT_TRUE(a.Unref(1));
  EXPECT_TRUE(a.Unref(3));
  std::vector<int32_t> again;
  ASSERT_TRUE(a.Allocate(2, &again).ok());
  EXPECT_EQ(again, (std::vector<int32_t>{3, 1}));
}

TEST(PageAllocatorTest, RefcountKeepsSharedPageUntilLastOwner) {
  PageAllocator a(2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(1, &pages).ok());
  const int32_t p = pages[0];
  a.Ref(p);
  a.Ref(p);
  EXPECT_EQ(a.refcount(p), 3);
  EXPECT_FALSE(a.Unref(p));
  EXPECT_FALSE(a.Unref(p));
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(a.CheckIntegrity().ok());
  EXPECT_TRUE(a.Unref(p));
  EXPECT_EQ(a.refcount(p), 0);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageAllocatorTest, ZeroPagesIsUsableAndAlwaysExhausted) {
  PageAllocator a(0);
  EXPECT_TRUE(a.CanAllocate(0));
  EXPECT_FALSE(a.CanAllocate(1));
  std::vector<int32_t> out;
  EXPECT_EQ(a.Allocate(1, &out).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(a.CheckIntegrity().ok());
}

TEST(PageAllocatorTest, RandomOperationsKeepInvariants) {
  // A model of refcounts checked against the allocator after every step.
  PageAllocator a(16);
  std::vector<int32_t> model(16, 0);
  std::vector<int32_t> owned;  // one entry per reference held
  std::mt19937 rng(1234);
  for (int step = 0; step < 2000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0) {
      const int64_t n = static_cast<int64_t>(rng() % 5);
      std::vector<int32_t> got;
      const bool fits = a.CanAllocate(n);
      Status s = a.Allocate(n, &got);
      ASSERT_EQ(s.ok(), fits);
      for (int32_t p : got) {
        ASSERT_EQ(model[p], 0) << "handed out a used page";
        model[p] = 1;
        owned.push_back(p);
      }
    } else if (op == 1 && !owned.empty()) {
      const int32_t p = owned[rng() % owned.size()];
      a.Ref(p);
      ++model[p];
      owned.push_back(p);
    } else if (!owned.empty()) {
      const size_t i = rng() % owned.size();
      const int32_t p = owned[i];
      owned.erase(owned.begin() + static_cast<std::ptrdiff_t>(i));
      EXPECT_EQ(a.Unref(p), --model[p] == 0);
    }
    ASSERT_TRUE(a.CheckIntegrity().ok()) << "step " << step;
    int64_t used = 0;
    for (int32_t p = 0; p < 16; ++p) {
      ASSERT_EQ(a.refcount(p), model[p]);
      used += model[p] > 0;
    }
    ASSERT_EQ(a.num_used(), used);
  }
}

TEST(PageAllocatorTest, CheckIntegrityCatchesDuplicateOnFreeList) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(1, &pages).ok());
  PageAllocatorTestPeer::free_list(a).push_back(2);  // counts still add up
  Status s = a.CheckIntegrity();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("twice on the free list"), std::string::npos) << s.message();
}

TEST(PageAllocatorTest, CheckIntegrityCatchesUsedPageOnFreeList) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(1, &pages).ok());
  PageAllocatorTestPeer::free_list(a).push_back(pages[0]);  // a use-after-free waiting to happen
  Status s = a.CheckIntegrity();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("on the free list with refcount 1"), std::string::npos) << s.message();
}

TEST(PageAllocatorTest, CheckIntegrityCatchesLeakedPage) {
  PageAllocator a(4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(1, &pages).ok());
  PageAllocatorTestPeer::refcounts(a)[pages[0]] = 0;  // dropped without returning to the free list
  Status s = a.CheckIntegrity();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("leaked"), std::string::npos) << s.message();
}

TEST(PageAllocatorTest, CheckIntegrityCatchesOutOfRangeAndNegative) {
  {
    PageAllocator a(4);
    PageAllocatorTestPeer::free_list(a).back() = 9;
    EXPECT_EQ(a.CheckIntegrity().code(), StatusCode::kInternal);
  }
  {
    PageAllocator a(4);
    std::vector<int32_t> pages;
    ASSERT_TRUE(a.Allocate(1, &pages).ok());
    PageAllocatorTestPeer::refcounts(a)[pages[0]] = -1;
    Status s = a.CheckIntegrity();
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find("negative"), std::string::npos) << s.message();
  }
}

TEST(PageAllocatorDeathTest, DoubleFreeAborts) {
  PageAllocator a(2);
  std::vector<int32_t> pages;
  ASSERT_TRUE(a.Allocate(1, &pages).ok());
  EXPECT_TRUE(a.Unref(pages[0]));
  EXPECT_DEATH(a.Unref(pages[0]), "double free");
  EXPECT_DEATH(a.Ref(pages[0]), "Ref of free page");
  EXPECT_DEATH(a.Ref(7), "outside");
}

}  // namespace
}  // namespace strata
