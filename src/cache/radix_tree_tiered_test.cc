// The host tier of RadixTree (docs/architecture/hicache.md "Tree residency"):
// one test per operation and per residency invariant, CheckIntegrity shown to
// catch each corruption, and a randomized run of every operation against a
// page-level reference model with shadow contents per device and host page,
// so that no match can return a page holding other tokens unnoticed.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/page_allocator.h"
#include "cache/page_table.h"
#include "cache/radix_tree.h"

namespace strata {

// Reads and corrupts the tree's private state for the tests below.
class RadixTreeTestPeer {
 public:
  struct PageView {
    int32_t device = -1;
    int32_t host = -1;
    uint64_t job = 0;  // != 0: the host page is being written by this job
    uint64_t last_access = 0;
    int32_t lock_ref = 0;
    bool operator==(const PageView&) const = default;
    friend void PrintTo(const PageView& v, std::ostream* os) {
      *os << "{dev " << v.device << ", host " << v.host << ", job " << v.job << ", used "
          << v.last_access << ", locks " << v.lock_ref << "}";
    }
  };
  // Every cached page, keyed by the token prefix that ends with it.
  static std::map<std::vector<int32_t>, PageView> Dump(const RadixTree& t) {
    std::map<std::vector<int32_t>, PageView> out;
    std::function<void(int32_t, std::vector<int32_t>)> walk = [&](int32_t id,
                                                                  std::vector<int32_t> prefix) {
      const RadixTree::Node& n = t.node(id);
      const size_t ps = static_cast<size_t>(t.page_size_);
      for (size_t i = 0; i < n.page_hashes.size(); ++i) {
        prefix.insert(prefix.end(), n.tokens.begin() + static_cast<ptrdiff_t>(i * ps),
                      n.tokens.begin() + static_cast<ptrdiff_t>((i + 1) * ps));
        out[prefix] = {n.device_pages.empty() ? -1 : n.device_pages[i],
                       n.host_pages.empty() ? -1 : n.host_pages[i], n.backup_job, n.last_access,
                       n.lock_ref};
      }
      for (const auto& [key, child] : n.children) walk(child, prefix);
    };
    walk(RadixTree::kRoot, {});
    return out;
  }
  // Page counts of the nodes on root..h, root first.
  static std::vector<int64_t> PathNodePages(const RadixTree& t, RadixNodeHandle h) {
    std::vector<int64_t> out;
    for (int32_t id = h.node; id != RadixTree::kRoot; id = t.node(id).parent)
      out.push_back(t.node(id).num_pages());
    std::reverse(out.begin(), out.end());
    return out;
  }
  static RadixTree::Node& Node(RadixTree& t, RadixNodeHandle h) { return t.node(h.node); }
  static std::set<RadixTree::EvictKey>& DeviceLru(RadixTree& t) { return t.evictable_; }
  static std::set<RadixTree::EvictKey>& HostLru(RadixTree& t) { return t.host_evictable_; }
  static std::vector<uint8_t>& InHostTree(RadixTree& t) { return t.in_host_tree_; }
  static std::map<uint64_t, RadixTree::Job>& Jobs(RadixTree& t) { return t.jobs_; }
  static int64_t& HostPagesCounter(RadixTree& t) { return t.host_pages_; }
  static int64_t& HostOnlyCounter(RadixTree& t) { return t.host_only_pages_; }
  static int64_t& InsertedPages(RadixTree& t) { return t.inserted_pages_; }
  static size_t NumJobs(const RadixTree& t) { return t.jobs_.size(); }
};

namespace {

using Tokens = std::vector<int32_t>;
using Peer = RadixTreeTestPeer;

Tokens Seq(int32_t base, int64_t n) {
  Tokens t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + static_cast<int32_t>(i);
  return t;
}

Tokens Concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Tokens Prefix(const Tokens& t, int64_t n) {
  return Tokens(t.begin(), t.begin() + static_cast<ptrdiff_t>(n));
}

void ExpectIntact(const RadixTree& tree, const PageAllocator& dev, const PageAllocator& host) {
  Status s = tree.CheckIntegrity();
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = dev.CheckIntegrity();
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = host.CheckIntegrity();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A tree over small device and host pools, with helpers that act as the
// engine and the cache controller would.
class TieredTreeTest : public ::testing::Test {
 protected:
  static constexpr int kPs = 2;
  explicit TieredTreeTest(int64_t device_pages = 32, int64_t host_pages = 32)
      : dev_(device_pages), host_(host_pages) {
    tree_ = std::make_unique<RadixTree>(RadixTreeConfig{kPs}, &dev_, &host_);
  }
  // Caches tokens as if a request computed them into fresh pages and finished.
  RadixTree::InsertResult Cache(const Tokens& t) {
    std::vector<int32_t> pages;
    EXPECT_TRUE(dev_.Allocate(static_cast<int64_t>(t.size()) / kPs, &pages).ok());
    RadixTree::InsertResult r = tree_->Insert(t, pages);
    for (int32_t p : pages) dev_.Unref(p);
    return r;
  }
  // Backs up root..h and completes every job.
  void BackUp(RadixNodeHandle h) {
    for (const auto& job : tree_->StartBackup(h)) tree_->CompleteBackup(job.id);
  }
  void Intact() { ExpectIntact(*tree_, dev_, host_); }

  PageAllocator dev_;
  PageAllocator host_;
  std::unique_ptr<RadixTree> tree_;
};

TEST(RadixTreeTieredTest, WithoutAHostTierMatchesHaveNoHostPart) {
  PageAllocator dev(8);
  RadixTree tree({2}, &dev);
  EXPECT_FALSE(tree.has_host_tier());
  std::vector<int32_t> pages;
  ASSERT_TRUE(dev.Allocate(2, &pages).ok());
  tree.Insert(Seq(0, 4), pages);
  RadixTree::MatchResult m = tree.MatchPrefix(Seq(0, 5));
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.host_tokens, 0);
  EXPECT_TRUE(m.host_pages.empty());
  EXPECT_EQ(m.host_handle, m.handle);
  EXPECT_EQ(tree.EvictHost(10), 0);
  EXPECT_FALSE(tree.HasHostCopy(m.handle));
  EXPECT_EQ(tree.NodeResidency(m.handle), Residency::kDevice);
  EXPECT_EQ(tree.Evict(10), 0);  // the test still holds the pages
  EXPECT_EQ(tree.stats().evicted_pages, 2);
  EXPECT_EQ(tree.stats().offloaded_pages, 0);
  EXPECT_TRUE(tree.CheckIntegrity().ok());
  for (int32_t p : pages) dev.Unref(p);
}

TEST_F(TieredTreeTest, EvictingABackedLeafKeepsItOnHostAndTheMatchContinuesThere) {
  const Tokens a = Seq(0, 8);  // 4 pages
  RadixTree::InsertResult ins = Cache(a);
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(ins.handle);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].num_tokens, 8);
  EXPECT_EQ(jobs[0].device_pages, tree_->MatchPrefix(a).pages);
  const std::vector<int32_t> host_pages = jobs[0].host_pages;
  EXPECT_EQ(tree_->stats().backup_pages_in_flight, 4);
  tree_->CompleteBackup(jobs[0].id);
  EXPECT_TRUE(tree_->HasHostCopy(ins.handle));
  EXPECT_EQ(tree_->NodeResidency(ins.handle), Residency::kDeviceAndHost);
  Intact();

  EXPECT_EQ(tree_->Evict(100), 4);
  EXPECT_EQ(dev_.num_free(), 32);
  EXPECT_EQ(tree_->NodeResidency(ins.handle), Residency::kHost);
  RadixTreeStats st = tree_->stats();
  EXPECT_EQ(st.cached_pages, 0);
  EXPECT_EQ(st.host_cached_pages, 4);
  EXPECT_EQ(st.host_only_pages, 4);
  EXPECT_EQ(st.evicted_pages, 4);
  EXPECT_EQ(st.offloaded_pages, 4);
  EXPECT_EQ(st.nodes, 1);
  Intact();

  RadixTree::MatchResult m = tree_->MatchPrefix(Seq(0, 9));
  EXPECT_EQ(m.num_tokens, 0);
  EXPECT_TRUE(m.handle.is_root());
  EXPECT_EQ(m.host_tokens, 8);
  EXPECT_EQ(m.host_pages, host_pages);
  EXPECT_EQ(m.host_handle, ins.handle);
  EXPECT_EQ(tree_->stats().hit_tokens, 8);  // the StartBackup check's match above
  EXPECT_EQ(tree_->stats().host_hit_tokens, 8);
  EXPECT_EQ(tree_->stats().miss_tokens, 1);
  RadixTree::PrefixLengths peek = tree_->PeekPrefixLengths(a);
  EXPECT_EQ(peek.device_tokens, 0);
  EXPECT_EQ(peek.host_tokens, 8);
  EXPECT_EQ(tree_->PeekPrefixLength(a), 0);
  Intact();
}

TEST_F(TieredTreeTest, PartialEvictionSplitsSoResidencyStaysUniformPerNode) {
  const Tokens a = Seq(0, 8);  // 4 pages, one node
  RadixTree::InsertResult ins = Cache(a);
  BackUp(ins.handle);
  EXPECT_EQ(tree_->Evict(1), 1);  // only the tail page goes to host-only
  EXPECT_EQ(tree_->stats().nodes, 2);
  EXPECT_EQ(tree_->NodeResidency(ins.handle), Residency::kHost);  // the lower half keeps the id
  RadixTree::MatchResult m = tree_->MatchPrefix(a);
  EXPECT_EQ(m.num_tokens, 6);
  EXPECT_EQ(m.host_tokens, 2);
  EXPECT_EQ(m.host_handle, ins.handle);
  EXPECT_EQ(tree_->NodeResidency(m.handle), Residency::kDeviceAndHost);
  Intact();
  // The tail host-only node and the device+host upper part are both leaves
  // of their tier now; host eviction takes the host-only tail first.
  EXPECT_EQ(tree_->EvictHost(1), 1);
  EXPECT_EQ(tree_->stats().nodes, 1);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).host_tokens, 0);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).device_tokens, 6);
  Intact();
}

TEST_F(TieredTreeTest, LoadBackIsAnInsertThatAttachesDevicePagesToHostOnlyNodes) {
  const Tokens sys = Seq(0, 4), a = Seq(0, 10);
  RadixTree::InsertResult ins = Cache(a);
  BackUp(ins.handle);
  tree_->MatchPrefix(sys);        // split: sys (2 pages) -> tail (3 pages); sys is newer
  EXPECT_EQ(tree_->Evict(3), 3);  // the tail goes host-only, sys stays on device
  RadixTree::MatchResult m = tree_->MatchPrefix(a);
  ASSERT_EQ(m.num_tokens, 4);
  ASSERT_EQ(m.host_tokens, 6);
  tree_->Lock(m.host_handle);  // pins the host pages being read
  EXPECT_EQ(tree_->EvictHost(100), 0);
  std::vector<int32_t> loaded;
  ASSERT_TRUE(dev_.Allocate(3, &loaded).ok());
  // ... the controller copies m.host_pages into loaded ...
  std::vector<int32_t> pages = m.pages;
  pages.insert(pages.end(), loaded.begin(), loaded.end());
  RadixTree::InsertResult back = tree_->Insert(a, pages);
  EXPECT_EQ(back.num_cached_tokens, 4);
  EXPECT_EQ(back.num_inserted_tokens, 6);
  EXPECT_EQ(back.handle, m.host_handle);
  EXPECT_EQ(tree_->NodeResidency(back.handle), Residency::kDeviceAndHost);
  for (int32_t p : loaded) EXPECT_EQ(dev_.refcount(p), 2);  // the tree's and ours
  tree_->Unlock(m.host_handle);
  for (int32_t p : loaded) dev_.Unref(p);
  RadixTree::MatchResult again = tree_->MatchPrefix(a);
  EXPECT_EQ(again.num_tokens, 10);
  EXPECT_EQ(again.host_tokens, 0);
  EXPECT_EQ(std::vector<int32_t>(again.pages.begin() + 2, again.pages.end()), loaded);
  EXPECT_EQ(tree_->stats().host_only_pages, 0);
  EXPECT_EQ(tree_->stats().inserted_pages, 5 + 3);
  Intact();
}

TEST_F(TieredTreeTest, BackupInFlightPinsDevicePagesAndHidesHostPages) {
  const Tokens a = Seq(0, 4);
  RadixTree::InsertResult ins = Cache(a);
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(ins.handle);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_TRUE(tree_->StartBackup(ins.handle).empty());  // already in flight
  EXPECT_EQ(tree_->Evict(100), 0);                      // pinned
  EXPECT_TRUE(tree_->UnbackedEvictionCandidates(100).empty());
  EXPECT_FALSE(tree_->HasHostCopy(ins.handle));
  EXPECT_EQ(tree_->NodeResidency(ins.handle), Residency::kDevice);
  EXPECT_EQ(tree_->EvictHost(100), 0);  // not valid yet, so not evictable either
  EXPECT_EQ(tree_->stats().host_cached_pages, 2);
  Intact();
  tree_->CompleteBackup(jobs[0].id);
  EXPECT_EQ(tree_->stats().backup_pages_in_flight, 0);
  EXPECT_EQ(tree_->stats().backups_started, 1);
  EXPECT_EQ(tree_->stats().backups_completed, 1);
  EXPECT_EQ(tree_->Evict(100), 2);
  EXPECT_EQ(tree_->PeekPrefixLengths(a).host_tokens, 4);
  Intact();
}

TEST_F(TieredTreeTest, AbortedBackupFreesItsHostPages) {
  RadixTree::InsertResult ins = Cache(Seq(0, 4));
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(ins.handle);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(host_.num_used(), 2);
  tree_->AbortBackup(jobs[0].id);
  EXPECT_EQ(host_.num_used(), 0);
  EXPECT_EQ(tree_->stats().backups_aborted, 1);
  EXPECT_EQ(tree_->stats().host_cached_pages, 0);
  EXPECT_EQ(tree_->Evict(100), 2);  // unpinned, no host copy: removed
  EXPECT_EQ(tree_->stats().nodes, 0);
  Intact();
}

TEST_F(TieredTreeTest, ANodeSplitWhileItsBackupRunsKeepsBothHalvesInTheJob) {
  for (bool complete : {true, false}) {
    SCOPED_TRACE(complete ? "completed" : "aborted");
    const Tokens a = Seq(complete ? 0 : 100, 8);  // 4 pages
    const int64_t host_before = tree_->stats().host_cached_pages;
    RadixTree::InsertResult ins = Cache(a);
    std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(ins.handle);
    ASSERT_EQ(jobs.size(), 1u);
    // A match ending inside the node splits it (so does an Insert that leaves it).
    RadixTree::MatchResult m = tree_->MatchPrefix(Prefix(a, 2));
    Tokens b = Prefix(a, 4);
    b.push_back(-1);
    b.push_back(-2);
    Cache(b);
    EXPECT_EQ(tree_->PeekPrefixLength(a), 8);
    EXPECT_EQ(tree_->stats().backup_pages_in_flight, 4);
    Intact();
    if (complete) {
      tree_->CompleteBackup(jobs[0].id);
      EXPECT_TRUE(tree_->HasHostCopy(m.handle));
      EXPECT_TRUE(tree_->HasHostCopy(ins.handle));
      // The halves hold the job's host pages in order.
      EXPECT_EQ(tree_->MatchPrefix(a).pages, jobs[0].device_pages);
      tree_->Evict(100);
      RadixTree::MatchResult h = tree_->MatchPrefix(a);
      EXPECT_EQ(h.host_pages, jobs[0].host_pages);
    } else {
      tree_->AbortBackup(jobs[0].id);
      EXPECT_FALSE(tree_->HasHostCopy(m.handle));
      EXPECT_EQ(tree_->stats().host_cached_pages, host_before);
    }
    EXPECT_EQ(Peer::NumJobs(*tree_), 0u);
    Intact();
  }
}

TEST_F(TieredTreeTest, ACompletedChildWaitsForItsParentsCopy) {
  const Tokens a = Seq(0, 4);
  RadixTree::InsertResult top = Cache(a);
  RadixTree::InsertResult low = Cache(Seq(0, 8));
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(low.handle);
  ASSERT_EQ(jobs.size(), 2u);  // root first
  EXPECT_EQ(jobs[0].device_pages, tree_->MatchPrefix(a).pages);
  tree_->CompleteBackup(jobs[1].id);
  EXPECT_FALSE(tree_->HasHostCopy(low.handle));
  EXPECT_EQ(tree_->Evict(100), 0);  // both still pinned
  Intact();
  tree_->CompleteBackup(jobs[0].id);
  EXPECT_TRUE(tree_->HasHostCopy(top.handle));
  EXPECT_TRUE(tree_->HasHostCopy(low.handle));
  EXPECT_EQ(Peer::NumJobs(*tree_), 0u);
  EXPECT_EQ(tree_->Evict(100), 4);
  EXPECT_EQ(tree_->PeekPrefixLengths(Seq(0, 8)).host_tokens, 8);
  Intact();
}

TEST_F(TieredTreeTest, AbortingAParentsBackupDetachesTheChildsUntilItsCopyEnds) {
  RadixTree::InsertResult top = Cache(Seq(0, 4));
  RadixTree::InsertResult low = Cache(Seq(0, 8));
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(low.handle);
  ASSERT_EQ(jobs.size(), 2u);
  tree_->AbortBackup(jobs[0].id);
  // The child's host pages left the node (host closure) but its copy may
  // still be writing them: they stay allocated until it ends.
  EXPECT_FALSE(tree_->HasHostCopy(low.handle));
  EXPECT_EQ(tree_->NodeResidency(low.handle), Residency::kDevice);
  EXPECT_EQ(host_.num_used(), 2);
  EXPECT_EQ(tree_->stats().host_cached_pages, 2);
  EXPECT_EQ(tree_->stats().backup_pages_in_flight, 2);
  Intact();
  EXPECT_EQ(tree_->Evict(100), 4);  // nothing pinned any more
  Intact();
  tree_->CompleteBackup(jobs[1].id);
  EXPECT_EQ(host_.num_used(), 0);
  EXPECT_EQ(Peer::NumJobs(*tree_), 0u);
  EXPECT_EQ(tree_->stats().host_cached_pages, 0);
  Intact();
  (void)top;
}

TEST_F(TieredTreeTest, EvictHostDropsCopiesOfDeviceNodesAndRemovesHostOnlyOnesLruFirst) {
  RadixTree::InsertResult a = Cache(Seq(0, 4));
  RadixTree::InsertResult b = Cache(Seq(100, 4));
  BackUp(a.handle);
  BackUp(b.handle);
  tree_->MatchPrefix(Seq(100, 4));  // b newer than a
  EXPECT_EQ(tree_->Evict(2), 2);    // a goes host-only
  EXPECT_EQ(tree_->NodeResidency(a.handle), Residency::kHost);
  tree_->MatchPrefix(Seq(0, 4));      // a (host) newer than b
  EXPECT_EQ(tree_->EvictHost(2), 2);  // b, older, loses its copy but stays on device
  EXPECT_EQ(tree_->NodeResidency(b.handle), Residency::kDevice);
  EXPECT_EQ(tree_->stats().nodes, 2);
  EXPECT_EQ(tree_->EvictHost(2), 2);  // a, host-only, is removed
  EXPECT_EQ(tree_->stats().nodes, 1);
  EXPECT_EQ(tree_->stats().host_evicted_pages, 4);
  EXPECT_EQ(host_.num_used(), 0);
  Intact();
}

TEST_F(TieredTreeTest, LocksPinEveryTier) {
  RadixTree::InsertResult a = Cache(Seq(0, 8));
  BackUp(a.handle);
  tree_->Lock(a.handle);
  EXPECT_EQ(tree_->Evict(100), 0);
  EXPECT_EQ(tree_->EvictHost(100), 0);
  tree_->Unlock(a.handle);
  EXPECT_EQ(tree_->Evict(100), 4);
  // A host-only node, locked (a request loading it), keeps its host pages.
  RadixTree::MatchResult m = tree_->MatchPrefix(Seq(0, 8));
  ASSERT_EQ(m.host_tokens, 8);
  tree_->Lock(m.host_handle);
  EXPECT_EQ(tree_->stats().locked_pages, 0);  // device pages only
  EXPECT_EQ(tree_->EvictHost(100), 0);
  Intact();
  tree_->Unlock(m.host_handle);
  EXPECT_EQ(tree_->EvictHost(100), 4);
  EXPECT_EQ(tree_->stats().nodes, 0);
  Intact();
}

TEST_F(TieredTreeTest, StartBackupMakesRoomOffItsPathAndStopsWhenItCannot) {
  tree_.reset();
  host_ = PageAllocator(4);
  tree_ = std::make_unique<RadixTree>(RadixTreeConfig{kPs}, &dev_, &host_);
  RadixTree::InsertResult old = Cache(Seq(100, 4));  // 2 pages
  BackUp(old.handle);
  RadixTree::InsertResult top = Cache(Seq(0, 4));
  BackUp(top.handle);  // host full: old (2) + top (2)
  RadixTree::InsertResult low = Cache(Seq(0, 8));
  tree_->MatchPrefix(Seq(100, 4));  // old is now the most recent: still evicted,
                                    // because top is on the path and cannot go
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(low.handle);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_FALSE(tree_->HasHostCopy(old.handle));
  EXPECT_TRUE(tree_->HasHostCopy(top.handle));
  tree_->CompleteBackup(jobs[0].id);
  // A path longer than the whole host pool: the first node fits, the rest not.
  RadixTree::InsertResult big = Cache(Seq(500, 6));
  RadixTree::InsertResult bigger = Cache(Concat(Seq(500, 6), Seq(900, 6)));
  (void)big;
  jobs = tree_->StartBackup(bigger.handle);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].num_tokens, 6);
  EXPECT_FALSE(tree_->HasHostCopy(bigger.handle));
  tree_->CompleteBackup(jobs[0].id);
  Intact();
}

TEST_F(TieredTreeTest, InsertHostNeedsAHostResidentPrefixAndTakesOnlyNewPages) {
  const Tokens a = Seq(0, 12);  // 6 pages
  std::vector<int32_t> read;
  ASSERT_TRUE(host_.Allocate(4, &read).ok());
  // Nothing of the first 4 tokens is in the tree.
  StatusOr<RadixTree::InsertHostResult> r = tree_->InsertHost(a, 4, read);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tree_->clock(), 0u);  // changed nothing
  // From the root: all of it becomes one host-only node.
  std::vector<int32_t> read6 = read;
  ASSERT_TRUE(host_.Allocate(2, &read6).ok());
  r = tree_->InsertHost(a, 0, read6);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_taken_pages, 6);
  EXPECT_EQ(r->num_tokens, 12);
  EXPECT_EQ(tree_->NodeResidency(r->handle), Residency::kHost);
  EXPECT_EQ(tree_->stats().host_only_pages, 6);
  EXPECT_EQ(tree_->stats().host_inserted_pages, 6);
  for (int32_t p : read6) host_.Unref(p);
  EXPECT_EQ(host_.num_used(), 6);
  RadixTree::MatchResult m = tree_->MatchPrefix(a);
  EXPECT_EQ(m.host_tokens, 12);
  EXPECT_EQ(m.host_pages, read6);
  Intact();
  // A longer read from token 8: pages up to 12 are resident and not taken.
  const Tokens longer = Concat(a, Seq(50, 4));
  std::vector<int32_t> more;
  ASSERT_TRUE(host_.Allocate(4, &more).ok());
  r = tree_->InsertHost(longer, 8, more);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_taken_pages, 2);
  EXPECT_EQ(host_.refcount(more[0]), 1);
  EXPECT_EQ(host_.refcount(more[2]), 2);
  for (int32_t p : more) host_.Unref(p);
  EXPECT_EQ(tree_->PeekPrefixLengths(longer).host_tokens, 16);
  Intact();
}

TEST_F(TieredTreeTest, InsertHostGivesADeviceOnlyNodeItsHostCopyAndStopsAtABackupInFlight) {
  RadixTree::InsertResult a = Cache(Seq(0, 4));
  std::vector<int32_t> read;
  ASSERT_TRUE(host_.Allocate(4, &read).ok());
  StatusOr<RadixTree::InsertHostResult> r = tree_->InsertHost(Seq(0, 8), 0, read);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_taken_pages, 4);
  EXPECT_EQ(tree_->NodeResidency(a.handle), Residency::kDeviceAndHost);
  EXPECT_EQ(tree_->PeekPrefixLengths(Seq(0, 8)).host_tokens, 4);
  for (int32_t p : read) host_.Unref(p);
  Intact();
  // A node with a backup in flight cannot be extended on the host yet.
  RadixTree::InsertResult b = Cache(Seq(100, 4));
  std::vector<RadixTree::BackupJob> jobs = tree_->StartBackup(b.handle);
  ASSERT_EQ(jobs.size(), 1u);
  read.clear();
  ASSERT_TRUE(host_.Allocate(4, &read).ok());
  r = tree_->InsertHost(Seq(100, 8), 0, read);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_taken_pages, 0);
  EXPECT_EQ(r->num_tokens, 0);
  EXPECT_TRUE(r->handle.is_root());
  for (int32_t p : read) host_.Unref(p);
  tree_->CompleteBackup(jobs[0].id);
  Intact();
}

TEST_F(TieredTreeTest, UnbackedEvictionCandidatesAreTheLruDeviceLeavesWithoutACopy) {
  RadixTree::InsertResult a = Cache(Seq(0, 4));
  RadixTree::InsertResult b = Cache(Seq(100, 6));
  RadixTree::InsertResult c = Cache(Seq(200, 4));
  BackUp(b.handle);
  EXPECT_EQ(tree_->UnbackedEvictionCandidates(1), (std::vector<RadixNodeHandle>{a.handle}));
  EXPECT_EQ(tree_->UnbackedEvictionCandidates(3),
            (std::vector<RadixNodeHandle>{a.handle, c.handle}));
  EXPECT_EQ(tree_->UnbackedEvictionCandidates(0).size(), 0u);
  tree_->Lock(a.handle);
  EXPECT_EQ(tree_->UnbackedEvictionCandidates(100), (std::vector<RadixNodeHandle>{c.handle}));
  tree_->Unlock(a.handle);
}

TEST_F(TieredTreeTest, HitCountCountsMatchesAndSplitHalvesInheritIt) {
  RadixTree::InsertResult a = Cache(Seq(0, 8));
  EXPECT_EQ(tree_->HitCount(a.handle), 0);
  tree_->MatchPrefix(Seq(0, 8));
  tree_->MatchPrefix(Seq(0, 8));
  EXPECT_EQ(tree_->HitCount(a.handle), 2);
  RadixTree::MatchResult m = tree_->MatchPrefix(Seq(0, 4));
  EXPECT_EQ(tree_->HitCount(m.handle), 3);
  EXPECT_EQ(tree_->HitCount(a.handle), 2);
  EXPECT_TRUE(tree_->HasHostCopy(RadixNodeHandle{}));
}

TEST_F(TieredTreeTest, DestructorDropsTheTreesReferencesInBothTiers) {
  RadixTree::InsertResult a = Cache(Seq(0, 8));
  BackUp(a.handle);
  RadixTree::InsertResult b = Cache(Seq(100, 4));
  tree_->StartBackup(b.handle);  // in flight at destruction (its copy has ended)
  tree_->Evict(2);
  EXPECT_GT(host_.num_used(), 0);
  tree_.reset();
  EXPECT_EQ(dev_.num_free(), dev_.num_pages());
  EXPECT_EQ(host_.num_free(), host_.num_pages());
}

TEST(RadixTreeTieredDeathTest, ContractViolationsAbort) {
  PageAllocator dev(8), host(8);
  RadixTree plain({1}, &dev);
  EXPECT_DEATH(plain.StartBackup(RadixNodeHandle{}), "without a host tier");
  EXPECT_DEATH((void)plain.InsertHost(Seq(0, 2), 0, std::vector<int32_t>{0, 1}),
               "without a host tier");
  RadixTree tree({2}, &dev, &host);
  EXPECT_DEATH(tree.CompleteBackup(7), "never returned");
  EXPECT_DEATH(tree.AbortBackup(7), "never returned");
  EXPECT_DEATH((void)tree.InsertHost(Seq(0, 4), 1, std::vector<int32_t>{0}), "page boundary");
  EXPECT_DEATH(RadixTree({2}, &dev, &dev), "its own page allocator");
}

// ---- CheckIntegrity catches each broken residency invariant ----------------

class TieredCorruptionTest : public TieredTreeTest {
 protected:
  void SetUp() override {
    // root ─┬─ S [0 1]  device+host ─┬─ A [2..5] host-only
    //       │                        └─ B [500 501] device, backup in flight
    //       └─ C [900 901] device-only
    const RadixTree::InsertResult a = Cache(Seq(0, 6));
    b_ = Cache(Concat(Seq(0, 2), Seq(500, 2))).handle;
    a_ = a.handle;
    s_ = tree_->MatchPrefix(Seq(0, 2)).handle;
    BackUp(a_);
    ASSERT_EQ(tree_->Evict(2), 2);  // A, the least recently used device leaf
    jobs_ = tree_->StartBackup(b_);
    ASSERT_EQ(jobs_.size(), 1u);
    c_ = Cache(Seq(900, 2)).handle;
    ASSERT_EQ(tree_->NodeResidency(s_), Residency::kDeviceAndHost);
    ASSERT_EQ(tree_->NodeResidency(a_), Residency::kHost);
    ASSERT_EQ(tree_->NodeResidency(b_), Residency::kDevice);
    ASSERT_EQ(tree_->NodeResidency(c_), Residency::kDevice);
    ASSERT_TRUE(tree_->CheckIntegrity().ok()) << tree_->CheckIntegrity().ToString();
  }
  void TearDown() override { tree_->CompleteBackup(jobs_[0].id); }
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
  auto& N(RadixNodeHandle h) { return Peer::Node(*tree_, h); }
  RadixNodeHandle s_, a_, b_, c_;
  std::vector<RadixTree::BackupJob> jobs_;
};

TEST_F(TieredCorruptionTest, ResidencyNotUniformWithinANode) {
  auto& hp = N(a_).host_pages;
  const int32_t saved = hp.back();
  ExpectCaught([&] { hp.pop_back(); }, [&] { hp.push_back(saved); }, "uniform per node");
}

TEST_F(TieredCorruptionTest, NodeOnNeitherTier) {
  std::vector<int32_t> saved;
  ExpectCaught([&] { saved.swap(N(c_).device_pages); }, [&] { saved.swap(N(c_).device_pages); },
               "neither device nor host");
}

TEST_F(TieredCorruptionTest, DeviceClosureBroken) {
  std::vector<int32_t> saved;
  ExpectCaught([&] { saved.swap(N(s_).device_pages); }, [&] { saved.swap(N(s_).device_pages); },
               "device closure");
}

TEST_F(TieredCorruptionTest, HostClosureBroken) {
  std::vector<int32_t> saved;
  ExpectCaught([&] { saved.swap(N(s_).host_pages); }, [&] { saved.swap(N(s_).host_pages); },
               "(host closure)");
}

TEST_F(TieredCorruptionTest, ValidHostCopyUnderOneInFlight) {
  ExpectCaught([&] { N(s_).backup_job = jobs_[0].id; }, [&] { N(s_).backup_job = 0; },
               "whose copy is in flight");
}

TEST_F(TieredCorruptionTest, HostPageStoredTwice) {
  auto& hp = N(a_).host_pages;
  const int32_t saved = hp[0];
  ExpectCaught([&] { hp[0] = N(s_).host_pages[0]; }, [&] { hp[0] = saved; }, "stored twice");
}

TEST_F(TieredCorruptionTest, HostPageFreedBehindTheTreesBack) {
  const int32_t p = N(a_).host_pages[0];
  ExpectCaught([&] { host_.Unref(p); },
               [&] {
                 std::vector<int32_t> again;  // LIFO: the freed page comes back first
                 ASSERT_TRUE(host_.Allocate(1, &again).ok());
                 ASSERT_EQ(again[0], p);
               },
               "free in the allocator");
}

TEST_F(TieredCorruptionTest, HostPageBitmapOutOfStep) {
  auto& bits = Peer::InHostTree(*tree_);
  ExpectCaught([&] { bits[31] = 1; }, [&] { bits[31] = 0; }, "host page 31 is marked stored");
}

TEST_F(TieredCorruptionTest, InFlightNodeNamesAMissingJob) {
  ExpectCaught([&] { N(b_).backup_job = 999; }, [&] { N(b_).backup_job = jobs_[0].id; },
               "does not exist");
}

TEST_F(TieredCorruptionTest, JobListsANodeTwiceOrOneNotInIt) {
  auto& nodes = Peer::Jobs(*tree_).at(jobs_[0].id).nodes;
  ExpectCaught([&] { nodes.push_back(b_.node); }, [&] { nodes.pop_back(); },
               "does not list it exactly once");
  ExpectCaught([&] { nodes.push_back(c_.node); }, [&] { nodes.pop_back(); },
               "lists 2 nodes but 1 nodes name it");
}

TEST_F(TieredCorruptionTest, BackupInFlightOnAHostOnlyNode) {
  auto& nodes = Peer::Jobs(*tree_).at(jobs_[0].id).nodes;
  ExpectCaught(
      [&] {
        N(a_).backup_job = jobs_[0].id;
        nodes.push_back(a_.node);
      },
      [&] {
        N(a_).backup_job = 0;
        nodes.pop_back();
      },
      "in flight without both device and host pages");
}

TEST_F(TieredCorruptionTest, HostLruMissesAHostLeaf) {
  auto& lru = Peer::HostLru(*tree_);
  const std::pair<uint64_t, int32_t> key{N(a_).last_access, a_.node};
  ASSERT_EQ(lru.count(key), 1u);
  ExpectCaught([&] { lru.erase(key); }, [&] { lru.insert(key); }, "host evictable set");
}

TEST_F(TieredCorruptionTest, DeviceLruHoldsANodeWhoseBackupIsInFlight) {
  auto& lru = Peer::DeviceLru(*tree_);
  const std::pair<uint64_t, int32_t> key{N(b_).last_access, b_.node};
  ASSERT_EQ(lru.count(key), 0u);
  ExpectCaught([&] { lru.insert(key); }, [&] { lru.erase(key); }, "evictable set holds");
}

TEST_F(TieredCorruptionTest, ChildTierCountsDisagreeWithARecount) {
  ExpectCaught([&] { ++N(s_).host_children; }, [&] { --N(s_).host_children; },
               "counts 1 device and 3 host children; a recount gives 1 and 2");
}

TEST_F(TieredCorruptionTest, HostCountersDisagreeWithARecount) {
  auto& c = Peer::HostPagesCounter(*tree_);
  ExpectCaught([&] { ++c; }, [&] { --c; }, "host counters say");
  auto& h = Peer::HostOnlyCounter(*tree_);
  ExpectCaught([&] { --h; }, [&] { ++h; }, "host counters say");
}

TEST_F(TieredCorruptionTest, DeviceCountersDoNotBalance) {
  auto& c = Peer::InsertedPages(*tree_);
  ExpectCaught([&] { ++c; }, [&] { --c; }, "do not balance");
}

TEST_F(TieredCorruptionTest, LockedNodeLostATierOrUnlockedNodeRecordsOne) {
  tree_->Lock(c_);
  EXPECT_EQ(N(c_).locked_tiers, 1);  // device
  ExpectCaught([&] { N(c_).locked_tiers |= 2; }, [&] { N(c_).locked_tiers = 1; },
               "locked and lost a tier");
  tree_->Unlock(c_);
  ExpectCaught([&] { N(c_).locked_tiers = 1; }, [&] { N(c_).locked_tiers = 0; },
               "unlocked but records");
  // A tier gained under the lock is recorded too (a load-back or a backup).
  tree_->Lock(a_);
  EXPECT_EQ(N(a_).locked_tiers, 2);
  EXPECT_TRUE(tree_->CheckIntegrity().ok());
  tree_->Unlock(a_);
}

// ---- Randomized: every operation against a page-level reference model -------
//
// The model keeps one entry per cached page, keyed by the whole token prefix
// ending with that page: its device page, host page, the backup job writing
// the host page (0: none, or valid), last access (one tick per MatchPrefix /
// Insert / successful InsertHost, like the tree) and lock count. Eviction in
// each tier picks, page by page, the oldest page that is a leaf of that tier;
// that must be exactly what the tree does node by node. The test also keeps a
// shadow of what each device and host page holds (the prefix whose KV it
// stores), written when a page is computed, copied or read from storage, and
// checks every page a match returns against it.

class TieredReference {
 public:
  struct Entry {
    int32_t dev = -1;
    int32_t host = -1;
    uint64_t job = 0;
    uint64_t last_access = 0;
    int32_t locks = 0;
  };
  explicit TieredReference(int page_size) : ps_(static_cast<size_t>(page_size)) {}
  void Reset() {
    map_.clear();
    jobs_.clear();
    clock_ = 0;
  }
  Tokens Key(const Tokens& t, size_t pages) const {
    return Tokens(t.begin(), t.begin() + static_cast<ptrdiff_t>(pages * ps_));
  }
  Entry* Find(const Tokens& key) {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }

  struct Match {
    std::vector<int32_t> dev, host;
  };
  Match Walk(const Tokens& t, bool touch) {
    const uint64_t now = touch ? ++clock_ : 0;
    Match m;
    bool on_host = false;
    for (size_t i = 1; i * ps_ <= t.size(); ++i) {
      Entry* e = Find(Key(t, i));
      if (!e) break;
      if (e->dev >= 0) {
        if (on_host) break;
        m.dev.push_back(e->dev);
      } else if (e->host >= 0 && e->job == 0) {
        on_host = true;
        m.host.push_back(e->host);
      } else {
        break;
      }
      if (touch) e->last_access = now;
    }
    return m;
  }
  // Returns the leading tokens already on the device.
  int64_t Insert(const Tokens& t, const std::vector<int32_t>& pages) {
    const uint64_t now = ++clock_;
    int64_t cached = -1;
    for (size_t i = 1; i * ps_ <= t.size(); ++i) {
      const Tokens key = Key(t, i);
      Entry* e = Find(key);
      if (!e) e = &map_[key];
      if (e->dev < 0) {
        e->dev = pages[i - 1];
        if (cached < 0) cached = static_cast<int64_t>((i - 1) * ps_);
      }
      e->last_access = now;
    }
    return cached < 0 ? static_cast<int64_t>(t.size() / ps_ * ps_) : cached;
  }
  // Host-resident (valid) pages from the root.
  size_t HostPrefixPages(const Tokens& t) {
    size_t i = 1;
    for (; i * ps_ <= t.size(); ++i) {
      Entry* e = Find(Key(t, i));
      if (!e || e->host < 0 || e->job != 0) break;
    }
    return i - 1;
  }
  // nullopt: NotFound. Else {taken, end tokens}.
  std::optional<std::pair<int64_t, int64_t>> InsertHost(const Tokens& t, size_t start_pages,
                                                        const std::vector<int32_t>& host) {
    if (HostPrefixPages(t) < start_pages) return std::nullopt;
    const uint64_t now = ++clock_;
    int64_t taken = 0;
    size_t i = 1;
    for (; i * ps_ <= t.size(); ++i) {
      const Tokens key = Key(t, i);
      Entry* e = Find(key);
      if (e && e->job != 0) break;
      if (!e) e = &map_[key];
      if (e->host < 0) {
        e->host = host[i - 1 - start_pages];
        ++taken;
      }
      e->last_access = now;
    }
    return std::pair{taken, static_cast<int64_t>((i - 1) * ps_)};
  }
  void AddLocks(const Tokens& t, int64_t len, int delta) {
    for (size_t i = 1; i * ps_ <= static_cast<size_t>(len); ++i) map_.at(Key(t, i)).locks += delta;
  }

  int64_t Evict(int64_t n, const PageAllocator& alloc) {
    int64_t freed = 0;
    while (freed < n) {
      auto v = Oldest([&](const Tokens& k, const Entry& e) {
        return e.dev >= 0 && e.job == 0 && !AnyChild(k, [](const Entry& c) { return c.dev >= 0; });
      });
      if (v == map_.end()) break;
      if (alloc.refcount(v->second.dev) == 1) ++freed;
      if (v->second.host >= 0) {
        v->second.dev = -1;  // offloaded: stays on host
      } else {
        map_.erase(v);
      }
    }
    return freed;
  }
  int64_t EvictHost(int64_t n, const PageAllocator& alloc, const std::set<Tokens>& keep = {}) {
    int64_t freed = 0;
    while (freed < n) {
      auto v = Oldest([&](const Tokens& k, const Entry& e) {
        return e.host >= 0 && e.job == 0 && !keep.count(k) &&
               !AnyChild(k, [](const Entry& c) { return c.host >= 0; });
      });
      if (v == map_.end()) break;
      if (alloc.refcount(v->second.host) == 1) ++freed;
      if (v->second.dev >= 0) {
        v->second.host = -1;
      } else {
        map_.erase(v);
      }
    }
    return freed;
  }

  // StartBackup(path of t's first sum(node_pages) pages): the jobs it must
  // return, as {first page, pages}, evicting host pages as the tree would.
  std::vector<std::pair<size_t, size_t>> PredictBackup(const Tokens& t,
                                                       const std::vector<int64_t>& node_pages,
                                                       const PageAllocator& host) {
    size_t total = 0;
    for (int64_t n : node_pages) total += static_cast<size_t>(n);
    std::set<Tokens> keep;
    for (size_t i = 1; i <= total; ++i) keep.insert(Key(t, i));
    int64_t free = host.num_free();
    std::vector<std::pair<size_t, size_t>> out;
    size_t pos = 0;
    for (int64_t np : node_pages) {
      if (map_.at(Key(t, pos + 1)).host >= 0) {
        pos += static_cast<size_t>(np);
        continue;
      }
      if (free < np) free += EvictHost(np - free, host, keep);
      if (free < np) break;
      free -= np;
      out.push_back({pos, static_cast<size_t>(np)});
      pos += static_cast<size_t>(np);
    }
    return out;
  }
  void ApplyBackup(const Tokens& t, size_t first, const RadixTree::BackupJob& job) {
    for (size_t i = 0; i < job.host_pages.size(); ++i) {
      const Tokens key = Key(t, first + i + 1);
      Entry& e = map_.at(key);
      EXPECT_EQ(e.dev, job.device_pages[i]);
      e.host = job.host_pages[i];
      e.job = job.id;
      jobs_[job.id].keys.push_back(key);
    }
  }
  void Complete(uint64_t id) {
    Job& j = jobs_.at(id);
    j.copied = true;
    j.detached = 0;
    const std::vector<Tokens> keys = j.keys;
    for (const Tokens& k : keys) {
      if (map_.at(k).job == id && ParentValid(k)) Validate(k);
    }
    EraseIfDone(id);
  }
  void Abort(uint64_t id) {
    const std::vector<Tokens> keys = jobs_.at(id).keys;
    for (const Tokens& k : keys) {
      if (map_.at(k).job != id) continue;
      std::vector<Tokens> stack = {k};
      while (!stack.empty()) {
        const Tokens x = stack.back();
        stack.pop_back();
        Entry& e = map_.at(x);
        if (e.host < 0) continue;
        for (const Tokens& c : Children(x)) stack.push_back(c);
        const uint64_t jid = e.job;
        EXPECT_NE(jid, 0u);
        Job& j = jobs_.at(jid);
        j.keys.erase(std::find(j.keys.begin(), j.keys.end(), x));
        if (jid != id && !j.copied) ++j.detached;
        e.host = -1;
        e.job = 0;
        if (jid != id) EraseIfDone(jid);
      }
    }
    jobs_.erase(id);
  }
  // Host pages the tree must hold: on pages, and detached from them by jobs.
  int64_t HostHeld() const {
    int64_t n = 0;
    for (const auto& [k, e] : map_) n += e.host >= 0 ? 1 : 0;
    for (const auto& [id, j] : jobs_) n += j.detached;
    return n;
  }
  int64_t DevicePages() const {
    int64_t n = 0;
    for (const auto& [k, e] : map_) n += e.dev >= 0 ? 1 : 0;
    return n;
  }
  std::map<Tokens, Peer::PageView> View() const {
    std::map<Tokens, Peer::PageView> out;
    for (const auto& [k, e] : map_) out[k] = {e.dev, e.host, e.job, e.last_access, e.locks};
    return out;
  }

 private:
  struct Job {
    std::vector<Tokens> keys;
    bool copied = false;
    int64_t detached = 0;
  };
  std::vector<Tokens> Children(const Tokens& k) const {
    std::vector<Tokens> out;
    for (auto it = map_.upper_bound(k); it != map_.end(); ++it) {
      if (it->first.size() < k.size() || !std::equal(k.begin(), k.end(), it->first.begin())) break;
      if (it->first.size() == k.size() + ps_) out.push_back(it->first);
    }
    return out;
  }
  template <typename Pred>
  bool AnyChild(const Tokens& k, Pred pred) const {
    for (const Tokens& c : Children(k)) {
      if (pred(map_.at(c))) return true;
    }
    return false;
  }
  template <typename Leaf>
  std::map<Tokens, Entry>::iterator Oldest(Leaf leaf) {
    auto victim = map_.end();
    int ties = 0;
    for (auto it = map_.begin(); it != map_.end(); ++it) {
      if (it->second.locks != 0 || !leaf(it->first, it->second)) continue;
      if (victim == map_.end() || it->second.last_access < victim->second.last_access) {
        victim = it;
        ties = 0;
      } else if (it->second.last_access == victim->second.last_access) {
        ++ties;
      }
    }
    EXPECT_EQ(ties, 0) << "two leaves of one tier used at the same tick: the model is ambiguous";
    return victim;
  }
  bool ParentValid(const Tokens& k) const {
    if (k.size() == ps_) return true;
    const Entry& p = map_.at(Tokens(k.begin(), k.end() - static_cast<ptrdiff_t>(ps_)));
    return p.host >= 0 && p.job == 0;
  }
  void Validate(const Tokens& first) {
    std::vector<Tokens> stack = {first};
    while (!stack.empty()) {
      const Tokens k = stack.back();
      stack.pop_back();
      Entry& e = map_.at(k);
      const uint64_t jid = e.job;
      e.job = 0;
      Job& j = jobs_.at(jid);
      j.keys.erase(std::find(j.keys.begin(), j.keys.end(), k));
      EraseIfDone(jid);
      for (const Tokens& c : Children(k)) {
        const Entry& ce = map_.at(c);
        if (ce.job != 0 && jobs_.at(ce.job).copied) stack.push_back(c);
      }
    }
  }
  void EraseIfDone(uint64_t id) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() && it->second.copied && it->second.keys.empty()) jobs_.erase(it);
  }

  size_t ps_;
  uint64_t clock_ = 0;
  std::map<Tokens, Entry> map_;
  std::map<uint64_t, Job> jobs_;
};

struct TieredRandomParam {
  int page_size;
  unsigned seed;
};

class RadixTreeTieredRandomTest : public ::testing::TestWithParam<TieredRandomParam> {};

TEST_P(RadixTreeTieredRandomTest, AgreesWithReferenceModelAndNeverReturnsForeignPages) {
  const int ps = GetParam().page_size;
  const size_t ups = static_cast<size_t>(ps);
  std::mt19937 rng(GetParam().seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  // Small pools, so that both tiers evict all the time.
  PageAllocator dev(40), host(48);
  auto tree = std::make_unique<RadixTree>(RadixTreeConfig{ps}, &dev, &host);
  TieredReference ref(ps);
  // The prefix whose KV each page holds (empty: never written).
  std::vector<Tokens> dev_shadow(static_cast<size_t>(dev.num_pages()));
  std::vector<Tokens> host_shadow(static_cast<size_t>(host.num_pages()));

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
  auto key = [&](const Tokens& t, size_t pages) { return ref.Key(t, pages); };

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
  std::vector<RadixTree::BackupJob> in_flight;  // started, neither completed nor aborted

  // Every page a match returns must hold exactly that prefix.
  auto check_match = [&](const Tokens& t, const RadixTree::MatchResult& m) {
    ASSERT_EQ(m.num_tokens, static_cast<int64_t>(m.pages.size() * ups));
    ASSERT_EQ(m.host_tokens, static_cast<int64_t>(m.host_pages.size() * ups));
    for (size_t i = 0; i < m.pages.size(); ++i) {
      ASSERT_EQ(dev_shadow[static_cast<size_t>(m.pages[i])], key(t, i + 1))
          << "device page " << m.pages[i] << " holds other tokens";
    }
    for (size_t j = 0; j < m.host_pages.size(); ++j) {
      ASSERT_EQ(host_shadow[static_cast<size_t>(m.host_pages[j])], key(t, m.pages.size() + j + 1))
          << "host page " << m.host_pages[j] << " holds other tokens";
    }
    if (m.host_tokens == 0) {
      ASSERT_EQ(m.host_handle, m.handle);
    }
  };
  auto match = [&](const Tokens& t) {
    RadixTree::MatchResult m = tree->MatchPrefix(t);
    TieredReference::Match want = ref.Walk(t, true);
    EXPECT_EQ(m.pages, want.dev);
    EXPECT_EQ(m.host_pages, want.host);
    check_match(t, m);
    return m;
  };
  auto evict_device = [&](int64_t n) {
    const int64_t want = ref.Evict(n, dev);
    EXPECT_EQ(tree->Evict(n), want);
  };
  auto evict_host = [&](int64_t n) {
    const int64_t want = ref.EvictHost(n, host);
    EXPECT_EQ(tree->EvictHost(n), want);
  };
  // A request computes pages [from, end) of its table.
  auto compute = [&](Running& r, size_t from) {
    const auto& pages = r.table.pages();
    for (size_t i = from; i < pages.size(); ++i) {
      dev_shadow[static_cast<size_t>(pages[i])] = Tokens(
          r.tokens.begin(),
          r.tokens.begin() + static_cast<ptrdiff_t>(std::min((i + 1) * ups, r.tokens.size())));
    }
  };
  auto start_backup = [&](const Tokens& t, RadixNodeHandle h) {
    const std::vector<int64_t> sizes = Peer::PathNodePages(*tree, h);
    const auto want = ref.PredictBackup(t, sizes, host);
    std::vector<RadixTree::BackupJob> jobs = tree->StartBackup(h);
    ASSERT_EQ(jobs.size(), want.size());
    for (size_t k = 0; k < jobs.size(); ++k) {
      ASSERT_EQ(jobs[k].num_tokens, static_cast<int64_t>(want[k].second * ups));
      ASSERT_EQ(jobs[k].host_pages.size(), want[k].second);
      ref.ApplyBackup(t, want[k].first, jobs[k]);
      in_flight.push_back(jobs[k]);
    }
  };
  auto check = [&](int op) {
    Status s = tree->CheckIntegrity();
    ASSERT_TRUE(s.ok()) << "after op " << op << ": " << s.ToString();
    s = dev.CheckIntegrity();
    ASSERT_TRUE(s.ok()) << "after op " << op << ": " << s.ToString();
    s = host.CheckIntegrity();
    ASSERT_TRUE(s.ok()) << "after op " << op << ": " << s.ToString();
    const auto dump = Peer::Dump(*tree);
    ASSERT_EQ(dump, ref.View()) << "after op " << op;
    for (const auto& [k, v] : dump) {  // what the tree stores holds what it says
      if (v.device >= 0) {
        ASSERT_EQ(dev_shadow[static_cast<size_t>(v.device)], k) << "op " << op;
      }
      if (v.host >= 0 && v.job == 0) {
        ASSERT_EQ(host_shadow[static_cast<size_t>(v.host)], k) << "op " << op;
      }
    }
    ASSERT_EQ(host.num_used(), ref.HostHeld()) << "after op " << op;
    ASSERT_EQ(tree->stats().cached_pages, ref.DevicePages());
    ASSERT_EQ(tree->stats().host_cached_pages, ref.HostHeld());
  };

  int64_t loads = 0, host_reads = 0, restarts = 0, not_found = 0;
  RadixTreeStats total;  // over every tree of the run
  auto add_stats = [&](const RadixTreeStats& s) {
    total.offloaded_pages += s.offloaded_pages;
    total.host_evicted_pages += s.host_evicted_pages;
    total.host_hit_tokens += s.host_hit_tokens;
    total.backups_started += s.backups_started;
    total.backups_completed += s.backups_completed;
    total.backups_aborted += s.backups_aborted;
  };
  const int kOps = 4000;
  for (int op = 0; op < kOps; ++op) {
    const int what = uniform(0, 999);
    if (what < 200 && running.size() < 6) {  // admit, loading a host prefix back
      auto r = std::make_unique<Running>(Running{random_prompt(), PageTable(ps), {}, 0});
      RadixTree::MatchResult m = match(r->tokens);
      if (HasFatalFailure()) return;
      r->handle = m.handle;
      r->locked_len = m.num_tokens;
      std::vector<int32_t> adopt = m.pages;
      tree->Lock(m.handle);
      ref.AddLocks(r->tokens, m.num_tokens, +1);
      const int64_t host_pages = static_cast<int64_t>(m.host_pages.size());
      if (host_pages > 0 && uniform(0, 3) != 0) {
        // Lock the host prefix, get device pages, "copy", Insert the whole prefix.
        const int64_t len = m.num_tokens + m.host_tokens;
        tree->Lock(m.host_handle);
        ref.AddLocks(r->tokens, len, +1);
        if (dev.num_free() < host_pages) evict_device(host_pages - dev.num_free());
        std::vector<int32_t> loaded;
        if (dev.Allocate(host_pages, &loaded).ok()) {
          for (size_t i = 0; i < loaded.size(); ++i) {
            dev_shadow[static_cast<size_t>(loaded[i])] =
                host_shadow[static_cast<size_t>(m.host_pages[i])];
          }
          std::vector<int32_t> pages = m.pages;
          pages.insert(pages.end(), loaded.begin(), loaded.end());
          const Tokens prefix = Prefix(r->tokens, len);
          const int64_t want_cached = ref.Insert(prefix, pages);
          RadixTree::InsertResult ins = tree->Insert(prefix, pages);
          ASSERT_EQ(ins.num_cached_tokens, m.num_tokens);
          ASSERT_EQ(want_cached, m.num_tokens);
          ASSERT_EQ(ins.num_inserted_tokens, m.host_tokens);
          ASSERT_EQ(ins.handle, m.host_handle);
          // The request now runs on the longer prefix.
          tree->Unlock(m.handle);
          ref.AddLocks(r->tokens, m.num_tokens, -1);
          r->handle = m.host_handle;  // keeps the host_handle lock
          r->locked_len = len;
          adopt = pages;
          for (int32_t p : loaded) dev.Unref(p);  // the tree holds them (and adopt below)
          ++loads;
        } else {
          tree->Unlock(m.host_handle);
          ref.AddLocks(r->tokens, len, -1);
        }
      }
      r->table.AdoptSharedPrefix(adopt, dev);
      const size_t cached_pages = adopt.size();
      const int64_t need = r->table.PagesNeeded(static_cast<int64_t>(r->tokens.size()));
      if (need > dev.num_free()) evict_device(need - dev.num_free());
      if (r->table.Reserve(static_cast<int64_t>(r->tokens.size()), dev).ok()) {
        r->table.SetNumTokens(static_cast<int64_t>(r->tokens.size()));
        compute(*r, cached_pages);
        running.push_back(std::move(r));
      } else {  // does not fit even after eviction: give up on it
        tree->Unlock(r->handle);
        ref.AddLocks(r->tokens, r->locked_len, -1);
        r->table.Release(dev);
      }
    } else if (what < 330 && !running.empty()) {  // a chunk (or all) of a request is cached
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(running.size()) - 1));
      Running& r = *running[i];
      const bool finished = uniform(0, 2) != 0;
      const size_t n = finished
                           ? r.tokens.size()
                           : static_cast<size_t>(uniform(0, static_cast<int>(r.tokens.size())));
      const Tokens part = Prefix(r.tokens, static_cast<int64_t>(n));
      const int64_t want_cached = ref.Insert(part, r.table.pages());
      RadixTree::InsertResult ins = tree->Insert(part, r.table.pages());
      ASSERT_EQ(ins.num_cached_tokens, want_cached);
      ASSERT_EQ(ins.num_cached_tokens + ins.num_inserted_tokens,
                static_cast<int64_t>(n / ups * ups));
      if (uniform(0, 2) == 0) start_backup(part, ins.handle);  // write_through
      if (HasFatalFailure()) return;
      if (finished) {
        tree->Unlock(r.handle);
        ref.AddLocks(r.tokens, r.locked_len, -1);
        r.table.Release(dev);
        running.erase(running.begin() + static_cast<ptrdiff_t>(i));
      } else {
        tree->Lock(ins.handle);
        ref.AddLocks(part, static_cast<int64_t>(n / ups * ups), +1);
        tree->Unlock(r.handle);
        ref.AddLocks(r.tokens, r.locked_len, -1);
        r.handle = ins.handle;
        r.locked_len = static_cast<int64_t>(n / ups * ups);
      }
    } else if (what < 420) {  // device pressure
      evict_device(uniform(0, 6));
    } else if (what < 480) {  // host pressure
      evict_host(uniform(0, 6));
    } else if (what < 580) {  // back up a matched prefix (device part or through host)
      const Tokens t = random_prompt();
      RadixTree::MatchResult m = match(t);
      if (HasFatalFailure()) return;
      if (uniform(0, 1) == 0) {
        start_backup(Prefix(t, m.num_tokens), m.handle);
      } else {
        start_backup(Prefix(t, m.num_tokens + m.host_tokens), m.host_handle);
      }
    } else if (what < 700 && !in_flight.empty()) {  // a copy finishes
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(in_flight.size()) - 1));
      const RadixTree::BackupJob job = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<ptrdiff_t>(i));
      for (size_t k = 0; k < job.host_pages.size(); ++k) {
        host_shadow[static_cast<size_t>(job.host_pages[k])] =
            dev_shadow[static_cast<size_t>(job.device_pages[k])];
      }
      tree->CompleteBackup(job.id);
      ref.Complete(job.id);
    } else if (what < 740 && !in_flight.empty()) {  // a copy fails
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(in_flight.size()) - 1));
      const uint64_t id = in_flight[i].id;
      in_flight.erase(in_flight.begin() + static_cast<ptrdiff_t>(i));
      tree->AbortBackup(id);
      ref.Abort(id);
    } else if (what < 800) {  // a storage read lands in host pages
      const Tokens t = random_prompt();
      const size_t whole = t.size() / ups;
      const size_t resident = ref.HostPrefixPages(t);
      const size_t start = uniform(0, 3) == 0
                               ? static_cast<size_t>(uniform(0, static_cast<int>(whole)))
                               : static_cast<size_t>(uniform(0, static_cast<int>(resident)));
      const int64_t need = static_cast<int64_t>(whole - start);
      if (need > host.num_free()) evict_host(need - host.num_free());
      std::vector<int32_t> read;
      if (need > 0 && host.Allocate(need, &read).ok()) {
        for (size_t i = 0; i < read.size(); ++i) {
          host_shadow[static_cast<size_t>(read[i])] = key(t, start + i + 1);
        }
        const auto want = ref.InsertHost(t, start, read);
        StatusOr<RadixTree::InsertHostResult> got =
            tree->InsertHost(t, static_cast<int64_t>(start * ups), read);
        if (!want) {
          ASSERT_FALSE(got.ok());
          ASSERT_EQ(got.status().code(), StatusCode::kNotFound);
          ++not_found;
        } else {
          ASSERT_TRUE(got.ok()) << got.status().ToString();
          ASSERT_EQ(got->num_taken_pages, want->first);
          ASSERT_EQ(got->num_tokens, want->second);
          ++host_reads;
        }
        for (int32_t p : read) host.Unref(p);  // the tree keeps what it took
      }
    } else if (what < 870) {  // a probe that locks (device part, or a host prefix)
      const Tokens t = random_prompt();
      RadixTree::MatchResult m = match(t);
      if (HasFatalFailure()) return;
      const bool whole = uniform(0, 1) == 0;
      const RadixNodeHandle h = whole ? m.host_handle : m.handle;
      const int64_t len = whole ? m.num_tokens + m.host_tokens : m.num_tokens;
      tree->Lock(h);
      ref.AddLocks(t, len, +1);
      extra_locks.push_back({t, h, len});
    } else if (what < 940 && !extra_locks.empty()) {
      const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(extra_locks.size()) - 1));
      tree->Unlock(extra_locks[i].handle);
      ref.AddLocks(extra_locks[i].tokens, extra_locks[i].len, -1);
      extra_locks.erase(extra_locks.begin() + static_cast<ptrdiff_t>(i));
    } else if (what < 998) {
      const Tokens t = random_prompt();
      const RadixTree::PrefixLengths got = tree->PeekPrefixLengths(t);
      const TieredReference::Match want = ref.Walk(t, false);
      ASSERT_EQ(got.device_tokens, static_cast<int64_t>(want.dev.size() * ups));
      ASSERT_EQ(got.host_tokens, static_cast<int64_t>(want.host.size() * ups));
      ASSERT_EQ(tree->PeekPrefixLength(t), got.device_tokens);
    } else {  // restart: every copy has ended, requests are gone, a new tree
      for (auto& r : running) r->table.Release(dev);
      running.clear();
      extra_locks.clear();
      in_flight.clear();
      add_stats(tree->stats());
      tree.reset();
      ASSERT_EQ(dev.num_free(), dev.num_pages()) << "op " << op;
      ASSERT_EQ(host.num_free(), host.num_pages()) << "op " << op;
      tree = std::make_unique<RadixTree>(RadixTreeConfig{ps}, &dev, &host);
      ref.Reset();
      ++restarts;
    }
    check(op);
    if (HasFatalFailure()) return;
  }
  add_stats(tree->stats());
  const RadixTreeStats& st = total;
  // The run exercised every path (a seed that does not is a weak test).
  EXPECT_GT(loads, 0);
  EXPECT_GT(host_reads, 0);
  EXPECT_GT(not_found, 0);
  EXPECT_GT(restarts, 0);
  EXPECT_GT(st.offloaded_pages, 0);
  EXPECT_GT(st.host_evicted_pages, 0);
  EXPECT_GT(st.host_hit_tokens, 0);
  EXPECT_GT(st.backups_completed, 0);
  EXPECT_GT(st.backups_aborted, 0);

  // Wind down: every copy ends, everything unlocks, both tiers empty.
  for (const auto& job : in_flight) tree->CompleteBackup(job.id);
  for (auto& r : running) {
    tree->Unlock(r->handle);
    r->table.Release(dev);
  }
  for (auto& p : extra_locks) tree->Unlock(p.handle);
  tree->Evict(1 << 20);
  tree->EvictHost(1 << 20);
  tree->Evict(1 << 20);
  EXPECT_EQ(tree->stats().nodes, 0);
  EXPECT_EQ(dev.num_free(), dev.num_pages());
  EXPECT_EQ(host.num_free(), host.num_pages());
  EXPECT_TRUE(tree->CheckIntegrity().ok());
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndSeeds, RadixTreeTieredRandomTest,
                         ::testing::Values(TieredRandomParam{1, 1}, TieredRandomParam{1, 2},
                                           TieredRandomParam{1, 3}, TieredRandomParam{4, 1},
                                           TieredRandomParam{4, 2}, TieredRandomParam{4, 3}),
                         [](const auto& info) {
                           return "page_size_" + std::to_string(info.param.page_size) + "_seed_" +
                                  std::to_string(info.param.seed);
                         });

}  // namespace
}  // namespace strata
