#include "cache/radix_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cache/page_allocator.h"
#include "cache/page_table.h"

namespace strata {

// Reads and corrupts the tree's private state for the tests below.
class RadixTreeTestPeer {
 public:
  struct PageView {
    int32_t page;
    uint64_t last_access;
    int32_t lock_ref;
    bool operator==(const PageView&) const = default;
    friend void PrintTo(const PageView& v, std::ostream* os) {
      *os << "{page " << v.page << ", used " << v.last_access << ", locks " << v.lock_ref << "}";
    }
  };
  // Every cached page, keyed by the token prefix that ends with it.
  static std::map<std::vector<int32_t>, PageView> Dump(const RadixTree& t) {
    std::map<std::vector<int32_t>, PageView> out;
    std::function<void(int32_t, std::vector<int32_t>)> walk = [&](int32_t id,
                                                                  std::vector<int32_t> prefix) {
      const RadixTree::Node& n = t.node(id);
      const size_t ps = static_cast<size_t>(t.page_size_);
      for (size_t i = 0; i < n.device_pages.size(); ++i) {
        prefix.insert(prefix.end(), n.tokens.begin() + i * ps, n.tokens.begin() + (i + 1) * ps);
        out[prefix] = {n.device_pages[i], n.last_access, n.lock_ref};
      }
      for (const auto& [key, child] : n.children) walk(child, prefix);
    };
    walk(RadixTree::kRoot, {});
    return out;
  }
  static RadixTree::Node& Node(RadixTree& t, RadixNodeHandle h) { return t.node(h.node); }
  static std::set<RadixTree::EvictKey>& Evictable(RadixTree& t) { return t.evictable_; }
  static int64_t& EvictablePages(RadixTree& t) { return t.evictable_pages_; }
  static int64_t& NumNodes(RadixTree& t) { return t.num_nodes_; }
  static std::vector<uint8_t>& InTree(RadixTree& t) { return t.in_tree_; }
  // The first child key of h's node (to corrupt it).
  static std::map<std::vector<int32_t>, int32_t, RadixTree::PageKeyLess>& Children(
      RadixTree& t, RadixNodeHandle h) {
    return t.node(h.node).children;
  }
};

namespace {

using Tokens = std::vector<int32_t>;

// Tokens base, base+1, ... (distinct per base so sequences do not share).
Tokens Seq(int32_t base, int64_t n) {
  Tokens t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<int32_t>(i);
  return t;
}

Tokens Concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void ExpectIntact(const RadixTree& tree, const PageAllocator& alloc) {
  Status s = tree.CheckIntegrity();
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = alloc.CheckIntegrity();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A request as the engine would run it: match, lock, adopt, reserve the rest,
// compute (not here), insert, unlock, release.
struct Request {
  Tokens tokens;
  PageTable table;
  RadixNodeHandle handle;
  int64_t cached = 0;
};

std::unique_ptr<Request> Admit(RadixTree& tree, PageAllocator& alloc, const Tokens& tokens) {
  auto r = std::make_unique<Request>(Request{tokens, PageTable(tree.page_size()), {}, 0});
  RadixTree::MatchResult m = tree.MatchPrefix(tokens);
  tree.Lock(m.handle);
  r->handle = m.handle;
  r->cached = m.num_tokens;
  r->table.AdoptSharedPrefix(m.pages, alloc);
  EXPECT_TRUE(r->table.Reserve(static_cast<int64_t>(tokens.size()), alloc).ok());
  r->table.SetNumTokens(static_cast<int64_t>(tokens.size()));
  return r;
}

RadixTree::InsertResult Finish(RadixTree& tree, PageAllocator& alloc, Request& r) {
  RadixTree::InsertResult ins = tree.Insert(r.tokens, r.table.pages());
  tree.Unlock(r.handle);
  r.table.Release(alloc);
  return ins;
}

class RadixTreePageSizeTest : public ::testing::TestWithParam<int> {
 protected:
  int ps() const { return GetParam(); }
};

TEST_P(RadixTreePageSizeTest, EmptyTreeMatchesNothing) {
  PageAllocator alloc(8);
  RadixTree tree({ps()}, &alloc);
  RadixTree::MatchResult m = tree.MatchPrefix(Seq(0, 3 * ps()));
  EXPECT_EQ(m.num_tokens, 0);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_TRUE(m.handle.is_root());
  tree.Lock(m.handle);  // root: no-op
  tree.Unlock(m.handle);
  EXPECT_EQ(tree.stats().miss_tokens, 3 * ps());
  EXPECT_EQ(tree.stats().nodes, 0);
  EXPECT_EQ(tree.PrefixHash(m.handle), RadixTree::kRootHash);
  ExpectIntact(tree, alloc);
}

TEST_P(RadixTreePageSizeTest, CachesWholePagesOnlyAndSharesThem) {
  PageAllocator alloc(16);
  RadixTree tree({ps()}, &alloc);
  // 3 whole pages plus a partial one (when ps > 1).
  const Tokens prompt = Seq(100, 3 * ps() + ps() / 2);
  auto r = Admit(tree, alloc, prompt);
  EXPECT_EQ(r->cached, 0);
  const std::vector<int32_t> pages = r->table.pages();
  RadixTree::InsertResult ins = Finish(tree, alloc, *r);
  EXPECT_EQ(ins.num_cached_tokens, 0);
  EXPECT_EQ(ins.num_inserted_tokens, 3 * ps());
  EXPECT_EQ(tree.stats().cached_pages, 3);
  EXPECT_EQ(tree.stats().evictable_pages, 3);
  // The tree's reference keeps the three whole pages; the partial page is free.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(alloc.refcount(pages[static_cast<size_t>(i)]), 1);
  EXPECT_EQ(alloc.num_used(), 3);

  RadixTree::MatchResult m = tree.MatchPrefix(prompt);
  EXPECT_EQ(m.num_tokens, 3 * ps());
  EXPECT_EQ(m.pages, std::vector<int32_t>(pages.begin(), pages.begin() + 3));
  EXPECT_EQ(tree.PeekPrefixLength(prompt), 3 * ps());
  EXPECT_EQ(tree.PeekPrefixLength(Seq(100, 3 * ps() - 1)), 2 * ps());
  EXPECT_EQ(tree.stats().hit_tokens, 3 * ps());
  ExpectIntact(tree, alloc);
}

TEST_P(RadixTreePageSizeTest, InsertSplitsAtThePageWhereSequencesDiverge) {
  PageAllocator alloc(32);
  RadixTree tree({ps()}, &alloc);
  const Tokens a = Seq(0, 4 * ps());
  Tokens b = a;
  // Diverge in the last token of page 2: pages 0-1 are shared, page 2 is not.
  b[static_cast<size_t>(3 * ps() - 1)] = -7;
  b.resize(static_cast<size_t>(5 * ps()), 9);

  auto ra = Admit(tree, alloc, a);
  const std::vector<int32_t> a_pages = ra->table.pages();
  Finish(tree, alloc, *ra);
  ExpectIntact(tree, alloc);

  // b matches a's first two pages.
  auto rb = Admit(tree, alloc, b);
  EXPECT_EQ(rb->cached, 2 * ps());
  ExpectIntact(tree, alloc);
  EXPECT_EQ(tree.stats().nodes, 2);  // the match split a's node after page 1
  const std::vector<int32_t> b_pages = rb->table.pages();
  EXPECT_EQ(b_pages[0], a_pages[0]);
  EXPECT_EQ(b_pages[1], a_pages[1]);
  RadixTree::InsertResult ins = Finish(tree, alloc, *rb);
  EXPECT_EQ(ins.num_cached_tokens, 2 * ps());
  EXPECT_EQ(ins.num_inserted_tokens, 3 * ps());
  EXPECT_EQ(tree.stats().nodes, 3);
  EXPECT_EQ(tree.stats().cached_pages, 7);
  ExpectIntact(tree, alloc);

  EXPECT_EQ(tree.MatchPrefix(a).pages, a_pages);
  RadixTree::MatchResult mb = tree.MatchPrefix(b);
  EXPECT_EQ(mb.num_tokens, 5 * ps());
  EXPECT_EQ(mb.pages, b_pages);
  EXPECT_EQ(mb.handle, ins.handle);
  ExpectIntact(tree, alloc);
}

TEST_P(RadixTreePageSizeTest, DuplicatePagesOfAnAlreadyCachedPartAreNotTaken) {
  PageAllocator alloc(32);
  RadixTree tree({ps()}, &alloc);
  const Tokens prompt = Seq(5, 3 * ps());
  // Two requests compute the same prompt at the same time (neither matched).
  auto r1 = Admit(tree, alloc, prompt);
  auto r2 = Admit(tree, alloc, Concat(prompt, Seq(50, ps())));
  EXPECT_EQ(r2->cached, 0);
  const std::vector<int32_t> p1 = r1->table.pages(), p2 = r2->table.pages();
  Finish(tree, alloc, *r1);
  tree.Unlock(r2->handle);
  RadixTree::InsertResult ins = tree.Insert(r2->tokens, r2->table.pages());
  EXPECT_EQ(ins.num_cached_tokens, 3 * ps());
  EXPECT_EQ(ins.num_inserted_tokens, ps());
  // r2's copies of the first three pages belong to r2 alone.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(alloc.refcount(p2[static_cast<size_t>(i)]), 1);
  EXPECT_EQ(alloc.refcount(p2[3]), 2);
  r2->table.Release(alloc);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(alloc.refcount(p2[static_cast<size_t>(i)]), 0);
  EXPECT_EQ(tree.MatchPrefix(r2->tokens).pages, (std::vector<int32_t>{p1[0], p1[1], p1[2], p2[3]}));
  ExpectIntact(tree, alloc);
}

// ReplaceDevicePages: the tree swaps the stored pages the predicate names
// for the caller's copies (a window backing's tombstones for recomputed
// pages), across a split node, keeping every count and reference right.
TEST_P(RadixTreePageSizeTest, ReplaceDevicePagesSwapsTheChosenPagesForTheCallers) {
  PageAllocator alloc(32);
  RadixTree tree({ps()}, &alloc);
  const Tokens prompt = Seq(5, 4 * ps());
  auto r1 = Admit(tree, alloc, prompt);
  const std::vector<int32_t> p1 = r1->table.pages();
  Finish(tree, alloc, *r1);
  // A branch after page 2, so the path crosses two nodes.
  auto branch = Admit(tree, alloc, Concat(Seq(5, 2 * ps()), Seq(90, ps())));
  Finish(tree, alloc, *branch);
  // A second request recomputes the prompt without matching (say its
  // window was gone) and holds its own copies.
  PageTable t2(ps());
  ASSERT_TRUE(t2.Reserve(static_cast<int64_t>(prompt.size()), alloc).ok());
  const std::vector<int32_t> p2 = t2.pages();
  // Replace the tree's pages 1 and 3 (say, tombstones) with p2's.
  const int64_t swapped = tree.ReplaceDevicePages(prompt, p2, [&](int32_t tree_page, int32_t page) {
    return (tree_page == p1[1] || tree_page == p1[3]) && page != -1;
  });
  EXPECT_EQ(swapped, 2);
  EXPECT_EQ(tree.MatchPrefix(prompt).pages, (std::vector<int32_t>{p1[0], p2[1], p1[2], p2[3]}));
  EXPECT_EQ(alloc.refcount(p1[1]), 0);  // the tree held the old copies alone
  EXPECT_EQ(alloc.refcount(p1[3]), 0);
  EXPECT_EQ(alloc.refcount(p2[1]), 2);  // t2 and the tree
  EXPECT_EQ(alloc.refcount(p2[0]), 1);  // not swapped: t2's alone
  // Nothing left to swap: the tree's pages are the caller's where chosen.
  EXPECT_EQ(tree.ReplaceDevicePages(prompt, p2, [](int32_t, int32_t) { return true; }), 2);
  EXPECT_EQ(tree.MatchPrefix(prompt).pages, p2);
  EXPECT_EQ(tree.ReplaceDevicePages(prompt, p2, [](int32_t, int32_t) { return true; }), 0);
  t2.Release(alloc);
  ExpectIntact(tree, alloc);
  EXPECT_EQ(tree.Evict(100), 5);  // the four prompt pages and the branch's one
  EXPECT_EQ(alloc.num_free(), 32);
  ExpectIntact(tree, alloc);
}

TEST_P(RadixTreePageSizeTest, ManyRequestsShareOneSystemPrompt) {
  PageAllocator alloc(512);
  RadixTree tree({ps()}, &alloc);
  const Tokens system = Seq(1000, 3 * ps());
  std::vector<int32_t> system_pages;
  for (int i = 0; i < 50; ++i) {
    auto r = Admit(tree, alloc, Concat(system, Seq(10000 * (i + 1), 2 * ps())));
    if (i == 0) {
      EXPECT_EQ(r->cached, 0);
      system_pages.assign(r->table.pages().begin(), r->table.pages().begin() + 3);
    } else {
      EXPECT_EQ(r->cached, 3 * ps());
      EXPECT_EQ(std::vector<int32_t>(r->table.pages().begin(), r->table.pages().begin() + 3),
                system_pages);
    }
    Finish(tree, alloc, *r);
  }
  // One node for the system prompt, 50 leaves.
  EXPECT_EQ(tree.stats().nodes, 51);
  EXPECT_EQ(tree.stats().cached_pages, 3 + 50 * 2);
  for (int32_t p : system_pages) EXPECT_EQ(alloc.refcount(p), 1);
  EXPECT_EQ(tree.stats().hit_tokens, 49 * 3 * ps());
  ExpectIntact(tree, alloc);
  // Evicting everything returns every page.
  EXPECT_EQ(tree.Evict(1 << 20), 103);
  EXPECT_EQ(alloc.num_free(), 512);
  EXPECT_EQ(tree.stats().nodes, 0);
  ExpectIntact(tree, alloc);
}

TEST_P(RadixTreePageSizeTest, MatchEndingInsideANodeSplitsItSoTheLockIsExact) {
  PageAllocator alloc(16);
  RadixTree tree({ps()}, &alloc);
  auto r = Admit(tree, alloc, Seq(0, 4 * ps()));
  Finish(tree, alloc, *r);
  Tokens probe = Seq(0, 2 * ps());
  probe.push_back(-1);
  RadixTree::MatchResult m = tree.MatchPrefix(probe);
  EXPECT_EQ(m.num_tokens, 2 * ps());
  EXPECT_EQ(tree.stats().nodes, 2);
  tree.Lock(m.handle);
  EXPECT_EQ(tree.stats().locked_pages, 2);
  EXPECT_EQ(tree.stats().evictable_pages, 2);
  ExpectIntact(tree, alloc);
  EXPECT_EQ(tree.Evict(100), 2);  // only the unlocked half goes
  EXPECT_EQ(tree.MatchPrefix(Seq(0, 4 * ps())).pages, m.pages);
  tree.Unlock(m.handle);
  ExpectIntact(tree, alloc);
}

TEST_P(RadixTreePageSizeTest, PrefixHashChainsPerPageAndSurvivesSplits) {
  PageAllocator alloc(16);
  RadixTree tree({ps()}, &alloc);
  const Tokens t = Seq(3, 3 * ps());
  std::vector<int32_t> pages;
  ASSERT_TRUE(alloc.Allocate(3, &pages).ok());
  RadixTree::InsertResult ins = tree.Insert(t, pages);
  uint64_t h = RadixTree::kRootHash;
  std::vector<uint64_t> expect;
  for (int i = 0; i < 3; ++i) {
    h = RadixTree::ChainPageHash(h, std::span<const int32_t>(t).subspan(
                                        static_cast<size_t>(i * ps()), static_cast<size_t>(ps())));
    expect.push_back(h);
  }
  EXPECT_EQ(tree.PrefixHash(ins.handle), expect[2]);
  RadixTree::MatchResult m = tree.MatchPrefix(Seq(3, ps()));  // splits after page 0
  EXPECT_EQ(tree.PrefixHash(m.handle), expect[0]);
  EXPECT_EQ(tree.PrefixHash(ins.handle), expect[2]);
  ExpectIntact(tree, alloc);
  for (int32_t p : pages) alloc.Unref(p);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, RadixTreePageSizeTest, ::testing::Values(1, 4, 16),
                         [](const auto& info) {
                           return "page_size_" + std::to_string(info.param);
                         });

TEST(RadixTreeTest, ChainPageHashFormatIsPinned) {
  // Storage-tier files are keyed by this value: changing it orphans them.
  const Tokens page = {1, 2, 3, 4};
  // Computed independently (Python) from the format stated in radix_tree.h.
  EXPECT_EQ(RadixTree::ChainPageHash(RadixTree::kRootHash, page), 0xaee85b08346b6a00ull);
  EXPECT_EQ(RadixTree::ChainPageHash(RadixTree::kRootHash, Tokens{-1}), 0xb7d34b9f0bf52f78ull);
  EXPECT_NE(RadixTree::ChainPageHash(RadixTree::kRootHash, Tokens{1, 2, 4, 3}),
            RadixTree::ChainPageHash(RadixTree::kRootHash, page));
  EXPECT_NE(RadixTree::ChainPageHash(1, page), RadixTree::ChainPageHash(2, page));
}

TEST(RadixTreeTest, LockedNodesAndTheirAncestorsAreNeverEvicted) {
  PageAllocator alloc(32);
  RadixTree tree({4}, &alloc);
  const Tokens shared = Seq(0, 8);
  auto a = Admit(tree, alloc, Concat(shared, Seq(100, 8)));
  Finish(tree, alloc, *a);
  auto b = Admit(tree, alloc, Concat(shared, Seq(200, 8)));
  Finish(tree, alloc, *b);
  // shared (2 pages) -> {a tail, b tail} (2 pages each).
  RadixTree::MatchResult m = tree.MatchPrefix(Concat(shared, Seq(100, 8)));
  tree.Lock(m.handle);
  tree.Lock(m.handle);  // locks nest
  EXPECT_EQ(tree.stats().locked_pages, 4);
  EXPECT_EQ(tree.Evict(100), 2);  // b's tail only
  EXPECT_EQ(tree.stats().cached_pages, 4);
  ExpectIntact(tree, alloc);
  tree.Unlock(m.handle);
  EXPECT_EQ(tree.Evict(100), 0);
  tree.Unlock(m.handle);
  EXPECT_EQ(tree.stats().locked_pages, 0);
  EXPECT_EQ(tree.Evict(100), 4);  // leaf first, then its parent became a leaf
  EXPECT_EQ(alloc.num_free(), 32);
  ExpectIntact(tree, alloc);
}

TEST(RadixTreeTest, EvictsLeastRecentlyUsedLeafFirstAndTailFirst) {
  PageAllocator alloc(32);
  RadixTree tree({2}, &alloc);
  const Tokens a = Seq(0, 6), b = Seq(100, 6), c = Seq(200, 6);
  std::map<char, std::vector<int32_t>> pages;
  for (auto [name, t] : {std::pair{'a', a}, std::pair{'b', b}, std::pair{'c', c}}) {
    ASSERT_TRUE(alloc.Allocate(3, &pages[name]).ok());
    tree.Insert(t, pages[name]);
    for (int32_t p : pages[name]) alloc.Unref(p);  // the tree holds them alone
  }
  tree.MatchPrefix(a);  // a is now the most recent; b the least
  EXPECT_EQ(tree.Evict(1), 1);
  EXPECT_EQ(alloc.refcount(pages['b'][2]), 0);  // b's tail page went first
  EXPECT_EQ(tree.PeekPrefixLength(b), 4);
  EXPECT_EQ(tree.Evict(3), 3);  // the rest of b, then c's tail
  EXPECT_EQ(tree.PeekPrefixLength(b), 0);
  EXPECT_EQ(tree.PeekPrefixLength(c), 4);
  EXPECT_EQ(tree.PeekPrefixLength(a), 6);
  ExpectIntact(tree, alloc);
  // Peek does not count as a use: c is still older than a.
  EXPECT_EQ(tree.Evict(2), 2);
  EXPECT_EQ(tree.PeekPrefixLength(c), 0);
  EXPECT_EQ(tree.PeekPrefixLength(a), 6);
  ExpectIntact(tree, alloc);
}

TEST(RadixTreeTest, EvictionFreesOnlyPagesNoRequestHolds) {
  PageAllocator alloc(16);
  RadixTree tree({4}, &alloc);
  // Request A has cached its prompt but is still running on its own pages
  // without a lock (e.g. it swapped its handle away); B is done.
  auto a = Admit(tree, alloc, Seq(0, 8));
  tree.Insert(a->tokens, a->table.pages());
  tree.Unlock(a->handle);
  auto b = Admit(tree, alloc, Seq(100, 8));
  Finish(tree, alloc, *b);
  EXPECT_EQ(alloc.num_used(), 4);
  // A's pages are least recent: they leave the cache but stay in use by A and
  // are not counted; B's pages then free memory.
  EXPECT_EQ(tree.Evict(2), 2);
  EXPECT_EQ(tree.stats().cached_pages, 0);
  EXPECT_EQ(tree.stats().evicted_pages, 4);
  for (int32_t p : a->table.pages()) EXPECT_EQ(alloc.refcount(p), 1);
  EXPECT_EQ(alloc.num_used(), 2);
  a->table.Release(alloc);
  EXPECT_EQ(alloc.num_free(), 16);
  ExpectIntact(tree, alloc);
  EXPECT_EQ(tree.Evict(-1), 0);
}

TEST(RadixTreeTest, ChunkedPrefillMovesItsLockToTheLongerPrefix) {
  PageAllocator alloc(16);
  RadixTree tree({4}, &alloc);
  const Tokens prompt = Seq(0, 16);
  PageTable table(4);
  ASSERT_TRUE(table.Reserve(16, alloc).ok());
  RadixNodeHandle held;  // root
  for (int chunk = 1; chunk <= 2; ++chunk) {
    RadixTree::InsertResult ins = tree.Insert(
        std::span<const int32_t>(prompt).first(static_cast<size_t>(8 * chunk)), table.pages());
    EXPECT_EQ(ins.num_cached_tokens, 8 * (chunk - 1));
    tree.Lock(ins.handle);
    tree.Unlock(held);
    held = ins.handle;
    EXPECT_EQ(tree.stats().locked_pages, 2 * chunk);
    ExpectIntact(tree, alloc);
  }
  EXPECT_EQ(tree.Evict(100), 0);
  tree.Unlock(held);
  table.Release(alloc);
  EXPECT_EQ(tree.Evict(100), 4);
  ExpectIntact(tree, alloc);
}

TEST(RadixTreeDeathTest, HandlesSurviveSplitsAndReusedSlotsAreNotConfused) {
  PageAllocator alloc(16);
  RadixTree tree({1}, &alloc);
  std::vector<int32_t> pages;
  ASSERT_TRUE(alloc.Allocate(4, &pages).ok());
  RadixTree::InsertResult ins = tree.Insert(Seq(0, 4), pages);
  tree.Lock(ins.handle);
  tree.MatchPrefix(Seq(0, 2));  // splits the locked node above the handle
  EXPECT_EQ(tree.stats().nodes, 2);
  EXPECT_EQ(tree.stats().locked_pages, 4);
  ExpectIntact(tree, alloc);
  tree.Unlock(ins.handle);
  for (int32_t p : pages) alloc.Unref(p);
  EXPECT_EQ(tree.Evict(100), 4);
  // Two new nodes reuse both freed slots, so ins.handle's slot is live again
  // under a newer generation: the old handle must still be recognised as stale.
  pages.clear();
  ASSERT_TRUE(alloc.Allocate(2, &pages).ok());
  RadixTree::InsertResult x = tree.Insert(Seq(50, 1), std::span<const int32_t>(pages).first(1));
  RadixTree::InsertResult y = tree.Insert(Seq(60, 1), std::span<const int32_t>(pages).last(1));
  EXPECT_TRUE(x.handle.node == ins.handle.node || y.handle.node == ins.handle.node);
  EXPECT_NE(x.handle, ins.handle);
  EXPECT_NE(y.handle, ins.handle);
  EXPECT_DEATH(tree.Lock(ins.handle), "stale");
  for (int32_t p : pages) alloc.Unref(p);
}

TEST(RadixTreeDeathTest, ContractViolationsAbort) {
  PageAllocator alloc(8);
  RadixTree tree({2}, &alloc);
  std::vector<int32_t> pages;
  ASSERT_TRUE(alloc.Allocate(2, &pages).ok());
  RadixTree::InsertResult ins = tree.Insert(Seq(0, 4), pages);
  EXPECT_DEATH(tree.Unlock(ins.handle), "holds no lock");
  EXPECT_DEATH(tree.Insert(Seq(10, 4), std::vector<int32_t>{5}), "only 1 page ids");
  // The same page id cannot cache two different token runs.
  EXPECT_DEATH(tree.Insert(Seq(10, 2), std::vector<int32_t>{pages[0]}), "already stores");
  alloc.Unref(pages[0]);
  alloc.Unref(pages[1]);
}

TEST(RadixTreeTest, DestructorDropsTheTreesReferences) {
  PageAllocator alloc(8);
  {
    RadixTree tree({2}, &alloc);
    auto r = Admit(tree, alloc, Seq(0, 8));
    Finish(tree, alloc, *r);
    EXPECT_EQ(alloc.num_used(), 4);
  }
  EXPECT_EQ(alloc.num_free(), 8);
}

// ---- CheckIntegrity catches deliberate corruption --------------------------

class RadixTreeCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tree_ = std::make_unique<RadixTree>(RadixTreeConfig{4}, &alloc_);
    // a = shared(1 page) + 2 pages; b = shared + 1 page: root -> s -> {a, b}.
    a_ = Admit(*tree_, alloc_, Seq(0, 12));
    Finish(*tree_, alloc_, *a_);
    Tokens b = Seq(0, 4);
    b = Concat(b, Seq(500, 4));
    b_ = Admit(*tree_, alloc_, b);
    leaf_b_ = Finish(*tree_, alloc_, *b_).handle;
    leaf_a_ = tree_->MatchPrefix(Seq(0, 12)).handle;
    shared_ = tree_->MatchPrefix(Seq(0, 4)).handle;
    ASSERT_EQ(tree_->stats().nodes, 3);
    ASSERT_TRUE(tree_->CheckIntegrity().ok());
  }
  // Corrupts, expects CheckIntegrity to name it, repairs, expects OK again.
  void ExpectCaught(const std::function<void()>& corrupt, const std::function<void()>& repair,
                    const std::string& needle) {
    corrupt();
    Status s = tree_->CheckIntegrity();
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    repair();
    s = tree_->CheckIntegrity();
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  using Peer = RadixTreeTestPeer;
  PageAllocator alloc_{32};
  std::unique_ptr<RadixTree> tree_;
  std::unique_ptr<Request> a_, b_;
  RadixNodeHandle leaf_a_, leaf_b_, shared_;
};

TEST_F(RadixTreeCorruptionTest, LockCountNotEqualToLocksBelow) {
  auto& n = Peer::Node(*tree_, shared_);
  ExpectCaught([&] { ++n.lock_ref; }, [&] { --n.lock_ref; }, "lock_ref 1 but 0 own locks + 0");
}

TEST_F(RadixTreeCorruptionTest, ChildKeyDisagreesWithItsFirstPage) {
  auto& n = Peer::Node(*tree_, leaf_a_);
  ExpectCaught([&] { n.tokens[1] = 77; }, [&] { n.tokens[1] = 5; }, "keyed by tokens other");
}

TEST_F(RadixTreeCorruptionTest, TokenRunNotAWholeNumberOfPages) {
  auto& n = Peer::Node(*tree_, leaf_a_);
  ExpectCaught([&] { n.tokens.push_back(1); }, [&] { n.tokens.pop_back(); }, "tokens for 2 pages");
}

TEST_F(RadixTreeCorruptionTest, PageStoredTwice) {
  auto& na = Peer::Node(*tree_, leaf_a_);
  auto& nb = Peer::Node(*tree_, leaf_b_);
  const int32_t saved = nb.device_pages[0];
  ExpectCaught([&] { nb.device_pages[0] = na.device_pages[0]; },
               [&] { nb.device_pages[0] = saved; }, "stored twice");
}

TEST_F(RadixTreeCorruptionTest, StoredPageFreedBehindTheTreesBack) {
  const int32_t p = Peer::Node(*tree_, leaf_b_).device_pages[0];
  ExpectCaught([&] { alloc_.Unref(p); },
               [&] {
                 std::vector<int32_t> again;  // LIFO: the freed page comes back first
                 ASSERT_TRUE(alloc_.Allocate(1, &again).ok());
                 ASSERT_EQ(again[0], p);
               },
               "free in the allocator");
}

TEST_F(RadixTreeCorruptionTest, ChainedHashStale) {
  auto& n = Peer::Node(*tree_, leaf_a_);
  ExpectCaught([&] { n.page_hashes[1] ^= 1; }, [&] { n.page_hashes[1] ^= 1; },
               "stale chained hash");
}

TEST_F(RadixTreeCorruptionTest, EvictableSetMissesAnUnlockedLeaf) {
  auto& set = Peer::Evictable(*tree_);
  const auto key = *set.begin();
  ExpectCaught([&] { set.erase(key); }, [&] { set.insert(key); }, "evictable set");
}

TEST_F(RadixTreeCorruptionTest, EvictableSetKeyedByAnOldAccessTime) {
  auto& n = Peer::Node(*tree_, leaf_b_);
  const uint64_t saved = n.last_access;
  ExpectCaught([&] { n.last_access = 1; }, [&] { n.last_access = saved; }, "evictable set");
}

TEST_F(RadixTreeCorruptionTest, LockedLeafInTheEvictableSet) {
  tree_->Lock(leaf_b_);
  auto& set = Peer::Evictable(*tree_);
  const auto key =
      std::pair<uint64_t, int32_t>{Peer::Node(*tree_, leaf_b_).last_access, leaf_b_.node};
  ExpectCaught([&] { set.insert(key); }, [&] { set.erase(key); }, "evictable set");
  tree_->Unlock(leaf_b_);
}

TEST_F(RadixTreeCorruptionTest, CountersDisagreeWithARecount) {
  auto& pages = Peer::EvictablePages(*tree_);
  ExpectCaught([&] { ++pages; }, [&] { --pages; }, "counters say");
  auto& nodes = Peer::NumNodes(*tree_);
  ExpectCaught([&] { --nodes; }, [&] { ++nodes; }, "counters say 2 nodes");
}

TEST_F(RadixTreeCorruptionTest, OrphanedNode) {
  auto& children = Peer::Children(*tree_, shared_);
  auto it = children.begin();
  const auto saved = *it;
  ExpectCaught([&] { children.erase(saved.first); }, [&] { children.insert(saved); }, "orphaned");
}

TEST_F(RadixTreeCorruptionTest, PageBitmapOutOfStep) {
  auto& bits = Peer::InTree(*tree_);
  const size_t free_page = 31;  // never allocated in this fixture
  ExpectCaught([&] { bits[free_page] = 1; }, [&] { bits[free_page] = 0; }, "marked stored");
  const int32_t p = Peer::Node(*tree_, leaf_a_).device_pages[0];
  ExpectCaught([&] { bits[static_cast<size_t>(p)] = 0; }, [&] { bits[static_cast<size_t>(p)] = 1; },
               "missing from the page bitmap");
}

// ---- Randomized: the tree against a page-level reference model -------------
//
// The model keeps one entry per cached page, keyed by the whole token prefix
// ending with that page: its page id, last access (one tick per MatchPrefix /
// Insert, like the tree) and lock count. Eviction in the model picks, page by
// page, the unlocked page with no cached extension and the oldest access;
// that must be exactly the page the tree removes.

class ReferenceCache {
 public:
  struct Entry {
    int32_t page;
    uint64_t last_access;
    int32_t locks;
  };
  explicit ReferenceCache(int page_size) : ps_(static_cast<size_t>(page_size)) {}

  // Returns matched whole-page prefix length and its pages; touches them.
  std::pair<int64_t, std::vector<int32_t>> Match(const Tokens& t) {
    const uint64_t now = ++clock_;
    std::vector<int32_t> pages;
    size_t len = ps_;
    for (; len <= t.size(); len += ps_) {
      auto it = map_.find(Tokens(t.begin(), t.begin() + static_cast<ptrdiff_t>(len)));
      if (it == map_.end()) break;
      it->second.last_access = now;
      pages.push_back(it->second.page);
    }
    return {static_cast<int64_t>(len - ps_), pages};
  }
  int64_t Peek(const Tokens& t) const {
    size_t len = ps_;
    while (len <= t.size() &&
           map_.count(Tokens(t.begin(), t.begin() + static_cast<ptrdiff_t>(len))))
      len += ps_;
    return static_cast<int64_t>(len - ps_);
  }
  // Returns the number of leading tokens already cached.
  int64_t Insert(const Tokens& t, const std::vector<int32_t>& pages) {
    const uint64_t now = ++clock_;
    int64_t cached = -1;
    for (size_t i = 0; (i + 1) * ps_ <= t.size(); ++i) {
      Tokens key(t.begin(), t.begin() + static_cast<ptrdiff_t>((i + 1) * ps_));
      auto it = map_.find(key);
      if (it != map_.end()) {
        it->second.last_access = now;
      } else {
        if (cached < 0) cached = static_cast<int64_t>(i * ps_);
        map_[key] = {pages[i], now, 0};
      }
    }
    return cached < 0 ? static_cast<int64_t>(t.size() / ps_ * ps_) : cached;
  }
  void AddLocks(const Tokens& t, int64_t len, int delta) {
    for (size_t l = ps_; l <= static_cast<size_t>(len); l += ps_) {
      map_.at(Tokens(t.begin(), t.begin() + static_cast<ptrdiff_t>(l))).locks += delta;
    }
  }
  // Simulates Evict(n) against the allocator's current refcounts.
  int64_t Evict(int64_t n, const PageAllocator& alloc) {
    int64_t freed = 0;
    while (freed < n) {
      auto victim = map_.end();
      int ties = 0;
      for (auto it = map_.begin(); it != map_.end(); ++it) {
        if (it->second.locks != 0 || HasExtension(it)) continue;
        if (victim == map_.end() || it->second.last_access < victim->second.last_access) {
          victim = it;
          ties = 0;
        } else if (it->second.last_access == victim->second.last_access) {
          ++ties;
        }
      }
      if (victim == map_.end()) break;
      EXPECT_EQ(ties, 0) << "two evictable leaves used at the same tick: the model is ambiguous";
      if (alloc.refcount(victim->second.page) == 1) ++freed;
      map_.erase(victim);
    }
    return freed;
  }
  std::map<Tokens, RadixTreeTestPeer::PageView> View() const {
    std::map<Tokens, RadixTreeTestPeer::PageView> out;
    for (const auto& [k, e] : map_) out[k] = {e.page, e.last_access, e.locks};
    return out;
  }
  size_t size() const { return map_.size(); }

 private:
  bool HasExtension(std::map<Tokens, Entry>::const_iterator it) const {
    auto next = std::next(it);
    return next != map_.end() && next->first.size() > it->first.size() &&
           std::equal(it->first.begin(), it->first.end(), next->first.begin());
  }
  size_t ps_;
  uint64_t clock_ = 0;
  std::map<Tokens, Entry> map_;
};

class RadixTreeRandomTest : public ::testing::TestWithParam<int> {};

TEST_P(RadixTreeRandomTest, AgreesWithReferenceModelAndStaysIntact) {
  const int ps = GetParam();
  std::mt19937 rng(1234 + static_cast<unsigned>(ps));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  PageAllocator alloc(48);
  RadixTree tree({ps}, &alloc);
  ReferenceCache ref(ps);
  // Prompts are a random prefix of one of a few "families" plus a random tail
  // from a tiny alphabet, so sharing, divergence inside pages and re-insertion
  // of cached parts all happen often.
  std::vector<Tokens> families(4);
  for (auto& f : families) {
    for (int i = 0; i < 8 * ps; ++i) f.push_back(uniform(0, 2));
  }
  auto random_prompt = [&] {
    const Tokens& f = families[static_cast<size_t>(uniform(0, 3))];
    Tokens t(f.begin(), f.begin() + uniform(0, 8 * ps));
    for (int n = uniform(0, 3 * ps); n > 0; --n) t.push_back(uniform(0, 2));
    return t;
  };

  struct Running {
    Tokens tokens;
    PageTable table;
    RadixNodeHandle handle;
    int64_t locked_len;
  };
  std::vector<std::unique_ptr<Running>> running;
  struct Probe {
    Tokens tokens;
    RadixNodeHandle handle;
    int64_t len;
  };
  std::vector<Probe> extra_locks;

  auto evict_both = [&](int64_t n) {
    const int64_t want = ref.Evict(n, alloc);
    EXPECT_EQ(tree.Evict(n), want);
  };
  auto check = [&](int op) {
    Status s = tree.CheckIntegrity();
    ASSERT_TRUE(s.ok()) << "after op " << op << ": " << s.ToString();
    s = alloc.CheckIntegrity();
    ASSERT_TRUE(s.ok()) << "after op " << op << ": " << s.ToString();
    ASSERT_EQ(RadixTreeTestPeer::Dump(tree), ref.View()) << "after op " << op;
    RadixTreeStats st = tree.stats();
    ASSERT_EQ(st.cached_pages, static_cast<int64_t>(ref.size()));
  };

  int64_t hits = 0;
  const int kOps = 3000;
  for (int op = 0; op < kOps; ++op) {
    const int what = uniform(0, 99);
    if (what < 30 && running.size() < 6) {  // admit a request
      auto r = std::make_unique<Running>(Running{random_prompt(), PageTable(ps), {}, 0});
      auto [len, pages] = ref.Match(r->tokens);
      RadixTree::MatchResult m = tree.MatchPrefix(r->tokens);
      ASSERT_EQ(m.num_tokens, len);
      ASSERT_EQ(m.pages, pages);
      hits += len;
      tree.Lock(m.handle);
      ref.AddLocks(r->tokens, len, +1);
      r->handle = m.handle;
      r->locked_len = len;
      r->table.AdoptSharedPrefix(m.pages, alloc);
      const int64_t need = r->table.PagesNeeded(static_cast<int64_t>(r->tokens.size()));
      if (need > alloc.num_free()) evict_both(need - alloc.num_free());
      if (r->table.Reserve(static_cast<int64_t>(r->tokens.size()), alloc).ok()) {
        running.push_back(std::move(r));
      } else {  // does not fit even after eviction: give up on it
        tree.Unlock(r->handle);
        ref.AddLocks(r->tokens, len, -1);
        r->table.Release(alloc);
      }
    } else if (what < 55 && !running.empty()) {  // a request finishes a chunk or all
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(running.size()) - 1));
      Running& r = *running[i];
      const bool finished = uniform(0, 2) != 0;
      // Chunked prefill caches a prefix of what it computed and keeps running.
      const size_t n = finished
                           ? r.tokens.size()
                           : static_cast<size_t>(uniform(0, static_cast<int>(r.tokens.size())));
      const Tokens part(r.tokens.begin(), r.tokens.begin() + static_cast<ptrdiff_t>(n));
      const int64_t want_cached = ref.Insert(part, r.table.pages());
      RadixTree::InsertResult ins = tree.Insert(part, r.table.pages());
      ASSERT_EQ(ins.num_cached_tokens, want_cached);
      ASSERT_EQ(ins.num_cached_tokens + ins.num_inserted_tokens, static_cast<int64_t>(n / ps * ps));
      if (finished) {
        tree.Unlock(r.handle);
        ref.AddLocks(r.tokens, r.locked_len, -1);
        r.table.Release(alloc);
        running.erase(running.begin() + static_cast<ptrdiff_t>(i));
      } else {
        tree.Lock(ins.handle);
        ref.AddLocks(part, static_cast<int64_t>(n / ps * ps), +1);
        tree.Unlock(r.handle);
        ref.AddLocks(r.tokens, r.locked_len, -1);
        r.handle = ins.handle;
        r.locked_len = static_cast<int64_t>(n / ps * ps);
      }
    } else if (what < 70) {  // pressure from elsewhere
      evict_both(uniform(0, 6));
    } else if (what < 80) {  // a probe that locks (e.g. a PD transfer pinning a prefix)
      Tokens t = random_prompt();
      auto [len, pages] = ref.Match(t);
      RadixTree::MatchResult m = tree.MatchPrefix(t);
      ASSERT_EQ(m.num_tokens, len);
      ASSERT_EQ(m.pages, pages);
      hits += len;
      tree.Lock(m.handle);
      ref.AddLocks(t, len, +1);
      extra_locks.push_back({t, m.handle, len});
    } else if (what < 90 && !extra_locks.empty()) {
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(extra_locks.size()) - 1));
      tree.Unlock(extra_locks[i].handle);
      ref.AddLocks(extra_locks[i].tokens, extra_locks[i].len, -1);
      extra_locks.erase(extra_locks.begin() + static_cast<ptrdiff_t>(i));
    } else {
      const Tokens t = random_prompt();
      ASSERT_EQ(tree.PeekPrefixLength(t), ref.Peek(t));
    }
    check(op);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(tree.stats().hit_tokens, hits);
  EXPECT_GT(hits, 0);
  EXPECT_GT(tree.stats().evicted_pages, 0);

  // Wind down: everything finishes, then the cache empties completely.
  for (auto& r : running) {
    tree.Unlock(r->handle);
    r->table.Release(alloc);
  }
  for (auto& p : extra_locks) tree.Unlock(p.handle);
  tree.Evict(1 << 20);
  EXPECT_EQ(tree.stats().cached_pages, 0);
  EXPECT_EQ(tree.stats().nodes, 0);
  EXPECT_EQ(alloc.num_free(), alloc.num_pages());
  EXPECT_EQ(tree.stats().inserted_pages, tree.stats().evicted_pages);
  ExpectIntact(tree, alloc);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, RadixTreeRandomTest, ::testing::Values(1, 2, 4, 16),
                         [](const auto& info) {
                           return "page_size_" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace strata
