#include "cache/window_backing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <random>
#include <vector>

namespace strata {

// Reaches into the backing to break invariants on purpose.
class WindowBackingTestPeer {
 public:
  static std::vector<int32_t>& slot_of(WindowBacking& w) { return w.slot_of_; }
  static std::vector<int32_t>& page_of(WindowBacking& w) { return w.page_of_; }
  static PageAllocator& slots(WindowBacking& w) { return w.slots_; }
};

namespace {

TEST(WindowBackingTest, FreshBackingHasOnlyTombstones) {
  WindowBacking w(8, 3);
  EXPECT_EQ(w.num_page_ids(), 8);
  EXPECT_EQ(w.num_slots(), 3);
  EXPECT_EQ(w.num_free_slots(), 3);
  for (int32_t p = 0; p < 8; ++p) {
    EXPECT_FALSE(w.backed(p));
    EXPECT_EQ(w.slot(p), -1);
  }
  EXPECT_TRUE(w.CheckIntegrity().ok());
}

TEST(WindowBackingTest, BackGivesSlotsInOrder) {
  WindowBacking w(8, 3);
  const std::vector<int32_t> pages = {5, 2};
  ASSERT_TRUE(w.Back(pages).ok());
  EXPECT_EQ(w.slot(5), 0);
  EXPECT_EQ(w.slot(2), 1);
  EXPECT_EQ(w.page_of_slot()[1], 2);
  EXPECT_EQ(w.page_of_slot()[2], -1);
  EXPECT_EQ(w.num_free_slots(), 1);
  EXPECT_EQ(w.slot_of_page()[5], 0);
  EXPECT_EQ(w.slot_of_page()[0], -1);
  EXPECT_TRUE(w.CheckIntegrity().ok());
}

TEST(WindowBackingTest, BackIsAllOrNothing) {
  WindowBacking w(8, 3);
  ASSERT_TRUE(w.Back(std::vector<int32_t>{0, 1}).ok());
  EXPECT_FALSE(w.CanBack(2));
  const Status s = w.Back(std::vector<int32_t>{2, 3});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("window pages"), std::string::npos) << s.message();
  EXPECT_FALSE(w.backed(2));
  EXPECT_FALSE(w.backed(3));
  EXPECT_EQ(w.num_free_slots(), 1);
  EXPECT_TRUE(w.CanBack(1));
  EXPECT_TRUE(w.Back(std::vector<int32_t>{}).ok());
  EXPECT_TRUE(w.CheckIntegrity().ok());
}

TEST(WindowBackingTest, ReleaseMakesATombstoneAndFreesTheSlot) {
  WindowBacking w(4, 2);
  ASSERT_TRUE(w.Back(std::vector<int32_t>{3}).ok());
  w.Release(3);
  EXPECT_FALSE(w.backed(3));
  EXPECT_EQ(w.num_free_slots(), 2);
  // The freed slot goes out next (LIFO), to another page.
  ASSERT_TRUE(w.Back(std::vector<int32_t>{1}).ok());
  EXPECT_EQ(w.slot(1), 0);
  // A tombstone can be backed again (a recomputed window).
  ASSERT_TRUE(w.Back(std::vector<int32_t>{3}).ok());
  EXPECT_EQ(w.slot(3), 1);
  EXPECT_TRUE(w.CheckIntegrity().ok());
}

TEST(WindowBackingDeathTest, MisuseAborts) {
  WindowBacking w(4, 2);
  ASSERT_TRUE(w.Back(std::vector<int32_t>{0}).ok());
  EXPECT_DEATH(w.Release(1), "tombstone");
  EXPECT_DEATH((void)w.Back(std::vector<int32_t>{0}), "already backed");
  EXPECT_DEATH((void)w.Back(std::vector<int32_t>{2, 2}), "twice");
  EXPECT_DEATH((void)w.slot(4), "outside");
}

TEST(WindowBackingTest, CheckIntegrityNamesEachBrokenInvariant) {
  {
    WindowBacking w(4, 2);
    ASSERT_TRUE(w.Back(std::vector<int32_t>{1}).ok());
    WindowBackingTestPeer::slot_of(w)[2] = 0;  // two pages on one slot
    const Status s = w.CheckIntegrity();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("page 2 maps to slot 0, which maps to page 1"), std::string::npos)
        << s.message();
  }
  {
    WindowBacking w(4, 2);
    ASSERT_TRUE(w.Back(std::vector<int32_t>{1}).ok());
    WindowBackingTestPeer::page_of(w)[1] = 3;  // a free slot claims a page
    const Status s = w.CheckIntegrity();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("slot 1 is free but maps to page 3"), std::string::npos)
        << s.message();
  }
  {
    WindowBacking w(4, 2);
    ASSERT_TRUE(w.Back(std::vector<int32_t>{1}).ok());
    WindowBackingTestPeer::slot_of(w)[1] = -1;  // a held slot lost its page
    const Status s = w.CheckIntegrity();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("slot 0 maps to page 1, which maps to slot -1"), std::string::npos)
        << s.message();
  }
  {
    WindowBacking w(4, 2);
    ASSERT_TRUE(w.Back(std::vector<int32_t>{1}).ok());
    WindowBackingTestPeer::slots(w).Ref(0);  // a slot shared by two pages' worth
    const Status s = w.CheckIntegrity();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("slot 0 has 2 references"), std::string::npos) << s.message();
  }
  {
    WindowBacking w(4, 2);
    WindowBackingTestPeer::slot_of(w)[0] = 7;
    const Status s = w.CheckIntegrity();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("outside [-1, 2)"), std::string::npos) << s.message();
  }
}

// Random Back/Release against a set of backed pages, checking every
// invariant and the slot budget after each step.
TEST(WindowBackingTest, RandomOperationsKeepInvariants) {
  constexpr int32_t kPages = 64, kSlots = 16;
  WindowBacking w(kPages, kSlots);
  std::set<int32_t> model;  // backed pages
  std::mt19937 rng(7);
  int refused = 0;
  for (int step = 0; step < 5000; ++step) {
    if (rng() % 2 == 0) {
      std::vector<int32_t> fresh;
      const size_t want = 1 + rng() % 3;
      for (int32_t p = static_cast<int32_t>(rng() % kPages), tries = 0;
           fresh.size() < want && tries < kPages; p = (p + 7) % kPages, ++tries)
        if (model.count(p) == 0) fresh.push_back(p);
      const bool fits = model.size() + fresh.size() <= kSlots;
      ASSERT_EQ(w.CanBack(static_cast<int64_t>(fresh.size())), fits);
      const Status s = w.Back(fresh);
      ASSERT_EQ(s.ok(), fits) << s.message();
      if (fits) model.insert(fresh.begin(), fresh.end());
      refused += !fits;
    } else if (!model.empty()) {
      auto it = model.begin();
      std::advance(it, rng() % model.size());
      w.Release(*it);
      model.erase(it);
    }
    ASSERT_TRUE(w.CheckIntegrity().ok()) << w.CheckIntegrity().message();
    ASSERT_EQ(w.num_free_slots(), kSlots - static_cast<int64_t>(model.size()));
    for (int32_t p = 0; p < kPages; ++p) ASSERT_EQ(w.backed(p), model.count(p) == 1) << p;
  }
  EXPECT_GT(refused, 0);  // the budget was reached, so refusals were exercised
}

TEST(WindowBackingTest, FirstPageInWindow) {
  // Window 4, pages of 2: the token at position 9 attends to 6..9 (page 3).
  EXPECT_EQ(FirstPageInWindow(9, 4, 2), 3);
  EXPECT_EQ(FirstPageInWindow(8, 4, 2), 2);  // 5..8: page 2 holds 5
  EXPECT_EQ(FirstPageInWindow(3, 4, 2), 0);  // 0..3
  EXPECT_EQ(FirstPageInWindow(0, 4, 2), 0);
  EXPECT_EQ(FirstPageInWindow(100, 1, 16), 6);  // only itself: page 6
  EXPECT_EQ(FirstPageInWindow(128, 128, 16), 0);  // 1..128
  EXPECT_EQ(FirstPageInWindow(144, 128, 16), 1);  // 17..144
}

}  // namespace
}  // namespace strata
