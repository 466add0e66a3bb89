// RadixTree: the prefix cache. Maps token-id prefixes to the KV pages that
// already hold them, so a new request whose prompt starts like an earlier one
// adopts those pages instead of recomputing them. Model-agnostic: it sees
// token ids and page ids only (one page id covers every layer of every pool
// group, see kv_layout.h).
//
// Page granularity: only whole pages are cached. Every node holds a run of
// tokens whose length is a positive multiple of page_size, plus one page id
// per page; nodes split only at page boundaries; a node's children are keyed
// by the tokens of their first page. A 37-token prompt with page_size 16
// caches 32 tokens in 2 pages.
//
//   root ─┬─ [t0..t15 | t16..t31]  pages {7, 9}       (one node, two pages)
//         │        └─ [t32..t47]   page  {12}          (child keyed by t32..t47)
//         └─ [u0..u15]             page  {3}
//
// Ownership: the tree holds ONE reference (PageAllocator::Ref) on every page
// it stores; requests hold their own references through their PageTables.
// Eviction Unrefs, so a page returns to the free list only when no request
// holds it either. The allocator must outlive the tree; the destructor drops
// the tree's references.
//
// Locking (mini-sglang's contract): pages returned by MatchPrefix are only
// safe to use while their handle is locked. Lock(h) pins h's node and all its
// ancestors; locked nodes are never evicted. The engine locks a request's
// matched prefix for the life of the request. Handles stay valid across
// splits (a split keeps the handle's node as the lower half); an unlocked
// handle may go stale after Evict, and using a stale handle is a bug that
// aborts (handles carry a generation).
//
// Eviction is LRU over unlocked leaves, by a logical clock that ticks once per
// MatchPrefix and Insert (no wall time: the order is deterministic and
// testable). Evict takes pages from the tail of the least recently used
// unlocked leaf, so a parent becomes a leaf once its children are gone.
//
// HiCache (ARCHITECTURE.md) will add host-resident copies: each node records
// where its pages live (Residency); device page ids are the only residency
// implemented today, the host-page and storage fields are placeholders. Each
// page also carries the chained hash of all tokens up to its end, which is the
// storage key of the prefix and the PD/router identity of a block.
//
// Not thread-safe: owned and used by the engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "cache/page_allocator.h"
#include "util/status.h"

namespace strata {

struct RadixTreeConfig {
  int page_size = 1;  // tokens per KV page; must equal the KvPool's
};

// Names a node of one RadixTree. Cheap to copy. The default handle is the
// root (an empty match); locking the root is a no-op.
struct RadixNodeHandle {
  int32_t node = 0;
  uint32_t generation = 0;
  bool is_root() const { return node == 0; }
  friend bool operator==(const RadixNodeHandle&, const RadixNodeHandle&) = default;
};

// Where a node's pages live. Only kDevice exists today; the host tier adds
// kHost (offloaded, device pages given back) and kDeviceAndHost (written
// through), swapping residency without changing the tree's shape.
enum class Residency : uint8_t { kDevice, kHost, kDeviceAndHost };

struct RadixTreeStats {
  int64_t cached_pages = 0;     // pages the tree holds a reference on
  int64_t evictable_pages = 0;  // of those, in unlocked nodes (evicting one frees
                                // memory only if no request also holds it)
  int64_t locked_pages = 0;     // of those, in locked nodes
  int64_t nodes = 0;            // excluding the root
  // Cumulative, for metrics (strata_prefix_cache_hit_tokens_total, ...):
  int64_t hit_tokens = 0;      // tokens MatchPrefix found cached
  int64_t miss_tokens = 0;     // tokens MatchPrefix was asked for but not found
  int64_t inserted_pages = 0;  // pages Insert added
  int64_t evicted_pages = 0;   // pages Evict removed from the tree
};

class RadixTree {
 public:
  // Chained per-page hash (the storage key). Stable across processes and
  // versions: the storage tier keys files by it. Format v1: h starts at the
  // parent's hash (kRootHash for the first page); per token t,
  // h = Mix64((h ^ uint32(t)) + 0x9e3779b97f4a7c15) with Mix64 the splitmix64
  // finalizer. 64 bits can collide: whoever loads by hash must compare tokens.
  static constexpr uint64_t kRootHash = 0x5354524154410001ull;  // "STRATA" v1
  static uint64_t ChainPageHash(uint64_t parent_hash, std::span<const int32_t> page_tokens);

  // REQUIRES: config.page_size >= 1; allocator != nullptr and outlives the tree.
  RadixTree(const RadixTreeConfig& config, PageAllocator* allocator);
  // Unrefs every stored page (locks are ignored: requests hold their own refs).
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  int page_size() const { return page_size_; }
  // The logical clock: number of MatchPrefix + Insert calls so far.
  uint64_t clock() const { return clock_; }

  struct MatchResult {
    int64_t num_tokens = 0;      // cached prefix length, a multiple of page_size
    std::vector<int32_t> pages;  // num_tokens / page_size page ids, in order
    RadixNodeHandle handle;      // node ending exactly at num_tokens (root if 0)
  };
  // Longest cached whole-page prefix of tokens. If the match ends inside a
  // node, that node is split there so the handle covers exactly the match.
  // Marks the matched nodes as used now (LRU) and counts one hit per node;
  // adds num_tokens to hit_tokens and the rest of tokens.size() to miss_tokens
  // (so call it once per admission; PeekPrefixLength probes without counting).
  // The returned pages are only safe to use while the handle is locked: Lock
  // it before the next Insert or Evict. The caller that must compute at least
  // one token (for logits) passes the prompt without its last token.
  MatchResult MatchPrefix(std::span<const int32_t> tokens);

  // The num_tokens MatchPrefix would return, changing nothing (no split, no
  // LRU touch, no stats). For scheduling policies and cache-aware routing.
  int64_t PeekPrefixLength(std::span<const int32_t> tokens) const;

  // Adds one lock on handle's node (and so on every ancestor). Locks nest.
  // REQUIRES: handle is current (not evicted).
  void Lock(RadixNodeHandle handle);
  // Drops one lock taken by Lock(handle); when a node's last lock goes, its
  // pages become evictable again.
  // REQUIRES: handle is current and was locked at least once more than unlocked.
  void Unlock(RadixNodeHandle handle);

  struct InsertResult {
    // Leading tokens that were already cached (a multiple of page_size). The
    // tree keeps its own pages for them and does NOT take the caller's pages
    // [0, num_cached_tokens / page_size): the caller keeps using its copies
    // until its PageTable releases them (they are freed then), or may swap to
    // the tree's pages (MatchPrefix) to free its duplicates sooner.
    int64_t num_cached_tokens = 0;
    int64_t num_inserted_tokens = 0;  // newly stored (the tree Ref'd their pages)
    RadixNodeHandle handle;           // node ending at the last whole page of tokens
  };
  // Caches the whole pages of tokens (tokens.size() / page_size of them; a
  // trailing partial page is ignored) after a request computed their KV into
  // pages. Shares existing nodes for the cached part, splits a node where the
  // new sequence leaves it, and takes one reference on each newly stored page.
  // Marks the path as used now. The new node is unlocked: a request that
  // keeps running on it (chunked prefill) locks the returned handle before
  // unlocking its old one.
  // REQUIRES: pages.size() >= tokens.size() / page_size; every page that gets
  // stored is in use in the allocator and not already stored in the tree.
  InsertResult Insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

  // Removes pages of least-recently-used unlocked leaves, tail first, until
  // num_pages pages have returned to the allocator's free list or nothing
  // evictable remains. A removed page still held by a request leaves the
  // cache without freeing memory and does not count. Returns the number of
  // pages freed (<= num_pages unless num_pages < 0, which frees nothing).
  // Cost: O(log nodes) per removed node plus O(1) per page.
  int64_t Evict(int64_t num_pages);

  RadixTreeStats stats() const;

  // Chained hash of all tokens from the start of the sequence to the end of
  // handle's node (kRootHash for the root): the prefix's storage key.
  // REQUIRES: handle is current.
  uint64_t PrefixHash(RadixNodeHandle handle) const;

  // Verifies every invariant and returns Internal naming the first broken
  // one, or OK. O(cached pages * page_size + nodes log nodes):
  //  - every live node is reachable from the root exactly once and knows its
  //    parent; free node slots are not reachable;
  //  - a non-root node has tokens.size() == pages * page_size > 0, one hash
  //    per page equal to ChainPageHash chained from its parent, residency
  //    kDevice and no host pages;
  //  - each child is keyed by exactly the tokens of its first page;
  //  - lock_ref(n) == Lock calls outstanding on n + sum of lock_ref(children),
  //    i.e. the number of locks held on n or any descendant; all >= 0;
  //  - every stored page id is in range, has allocator refcount >= 1 and is
  //    stored once in the whole tree;
  //  - the evictable set is exactly the unlocked non-root leaves, keyed by
  //    their current last access time, and no node was used "in the future";
  //  - the page and node counters equal a recount.
  Status CheckIntegrity() const;

 private:
  friend class RadixTreeTestPeer;  // corrupts state to test CheckIntegrity

  static constexpr int32_t kRoot = 0;
  static constexpr int32_t kNone = -1;

  // Orders children by their first page's tokens; transparent so a lookup
  // takes a span of the query without copying it.
  struct PageKeyLess {
    using is_transparent = void;
    bool operator()(std::span<const int32_t> a, std::span<const int32_t> b) const;
  };

  struct Node {
    bool alive = false;
    uint32_t generation = 0;
    int32_t parent = kNone;
    std::vector<int32_t> tokens;  // pages * page_size tokens
    Residency residency = Residency::kDevice;
    std::vector<int32_t> device_pages;  // one per page, while resident on device
    std::vector<int32_t> host_pages;    // HiCache: empty until the host tier lands
    std::vector<uint64_t> page_hashes;  // chained hash up to the end of each page
    std::map<std::vector<int32_t>, int32_t, PageKeyLess> children;  // first page -> node
    int32_t lock_ref = 0;    // locks held on this node or any descendant
    int32_t self_locks = 0;  // locks held on this node's own handles
    uint64_t last_access = 0;
    uint64_t hit_count = 0;
    int64_t num_pages() const { return static_cast<int64_t>(device_pages.size()); }
  };

  using EvictKey = std::pair<uint64_t, int32_t>;  // (last_access, node): LRU first

  Node& node(int32_t id) { return nodes_[static_cast<size_t>(id)]; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  void CheckHandle(RadixNodeHandle h) const;
  RadixNodeHandle HandleOf(int32_t id) const { return {id, node(id).generation}; }
  uint64_t EndHash(int32_t id) const;
  bool IsEvictableLeaf(int32_t id) const;
  // Whole pages at the start of node id's run equal to the start of tokens.
  int64_t MatchPages(int32_t id, std::span<const int32_t> tokens) const;
  // Sets last_access, keeping the evictable set's key in step.
  void Touch(int32_t id, uint64_t now);
  int32_t NewNode();
  void FreeNode(int32_t id);
  // Splits id after its first `upper_pages` pages; returns the new upper
  // node. id keeps the lower part (so handles to id stay valid).
  int32_t Split(int32_t id, int64_t upper_pages);

  int page_size_;
  PageAllocator* allocator_;
  std::vector<Node> nodes_;  // [0] is the root; indices are node ids
  std::vector<int32_t> free_nodes_;
  std::set<EvictKey> evictable_;  // unlocked non-root leaves
  std::vector<uint8_t> in_tree_;  // per allocator page: stored by the tree
  uint64_t clock_ = 0;
  int64_t num_nodes_ = 0;
  int64_t evictable_pages_ = 0;
  int64_t locked_pages_ = 0;
  int64_t hit_tokens_ = 0;
  int64_t miss_tokens_ = 0;
  int64_t inserted_pages_ = 0;
  int64_t evicted_pages_ = 0;
};

}  // namespace strata
