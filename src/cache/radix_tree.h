// RadixTree: the prefix cache. Maps token-id prefixes to the KV pages that
// already hold them, so a new request whose prompt starts like an earlier one
// adopts those pages instead of recomputing them. Model-agnostic: it sees
// token ids and page ids only (one page id covers every layer of every pool
// group, see kv_layout.h).
//
// Page granularity: only whole pages are cached. Every node holds a run of
// tokens whose length is a positive multiple of page_size, plus one page id
// per page and tier; nodes split only at page boundaries; a node's children
// are keyed by the tokens of their first page. A 37-token prompt with
// page_size 16 caches 32 tokens in 2 pages.
//
//   root ─┬─ [t0..t15 | t16..t31]  device {7, 9}  host {40, 41}   (both tiers)
//         │        └─ [t32..t47]   host {12}                      (host-only)
//         └─ [u0..u15]             device {3}                     (device-only)
//
// Tiers (HiCache, docs/architecture/hicache.md "Tree residency"): with a host
// allocator, a node's pages live on the device, on the host, or both, always
// uniformly for the whole node (a partial eviction splits the node first) and
// never on neither (such a node is removed). Device closure: a device-resident
// node's parent is device-resident, so the device match is a prefix of any
// match and a host-only node has only host-resident descendants. Host closure:
// likewise for host pages; a node's host copy becomes valid (matchable) only
// once its parent's is, so backups complete top-down. Without a host
// allocator every node is device-only and the tree behaves as before HiCache.
//
// Ownership: the tree holds ONE reference (PageAllocator::Ref) on every page
// it stores, in each tier's allocator; requests hold their own references
// through their PageTables. Eviction Unrefs, so a page returns to the free
// list only when no request holds it either. The allocators must outlive the
// tree; the destructor drops the tree's references (so destroy it only after
// every backup copy it started has finished).
//
// Locking (mini-sglang's contract): pages returned by MatchPrefix are only
// safe to use while their handle is locked. Lock(h) pins h's node and all its
// ancestors in every tier; locked nodes are never evicted from either. The
// engine locks a request's matched prefix for the life of the request (a
// request loading a host prefix back locks MatchResult::host_handle). Handles
// stay valid across splits (a split keeps the handle's node as the lower
// half); an unlocked handle may go stale after Evict/EvictHost, and using a
// stale handle is a bug that aborts (handles carry a generation).
//
// Eviction is LRU per tier, by a logical clock that ticks once per
// MatchPrefix, Insert and InsertHost (no wall time: the order is deterministic
// and testable). Evict works on device leaves, EvictHost on host leaves; a
// parent becomes a leaf once its children are gone from that tier.
//
// Backups (device -> host copies) are jobs: StartBackup allocates host pages
// and returns what to copy; until CompleteBackup the node's device pages are
// pinned and its host pages not matchable; AbortBackup frees them. A job is
// named by its id, not a node: a node split while its backup is in flight
// leaves both halves in the job.
//
// Each page also carries the chained hash of all tokens up to its end, which
// is the storage key of the prefix and the PD/router identity of a block.
//
// Not thread-safe: owned and used by the engine thread only.
#pragma once

#include <cstdint>
#include <functional>
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

// Where a node's pages live. kDevice also covers a node whose host copy is
// still being written (a backup in flight: not matchable from the host yet).
enum class Residency : uint8_t { kDevice, kHost, kDeviceAndHost };

struct RadixTreeStats {
  int64_t cached_pages = 0;     // device pages the tree holds a reference on
  int64_t evictable_pages = 0;  // of those, in unlocked nodes (evicting one frees
                                // memory only if no request also holds it)
  int64_t locked_pages = 0;     // of those, in locked nodes
  int64_t nodes = 0;            // excluding the root
  // Cumulative, for metrics (strata_prefix_cache_hit_tokens_total, ...):
  int64_t hit_tokens = 0;      // tokens MatchPrefix found on the device
  int64_t miss_tokens = 0;     // tokens MatchPrefix was asked for, found in no tier
  int64_t inserted_pages = 0;  // device pages Insert stored (new or load-back)
  int64_t evicted_pages = 0;   // device pages Evict dropped (removed or offloaded)

  // HiCache (all zero without a host allocator).
  int64_t device_cached_pages = 0;  // == cached_pages
  int64_t host_cached_pages = 0;    // host pages the tree holds (valid + in flight)
  int64_t host_only_pages = 0;      // pages of host-only nodes
  int64_t host_hit_tokens = 0;      // cumulative: MatchPrefix tokens found on host only
  int64_t offloaded_pages = 0;      // of evicted_pages, those whose node kept its host copy
  int64_t host_inserted_pages = 0;  // host pages InsertHost took
  int64_t host_evicted_pages = 0;   // host pages EvictHost dropped
  int64_t backups_started = 0;      // BackupJobs StartBackup returned
  int64_t backups_completed = 0;
  int64_t backups_aborted = 0;
  int64_t backup_pages_in_flight = 0;  // of host_cached_pages, not yet valid
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

  // REQUIRES: config.page_size >= 1; device != nullptr and outlives the tree;
  // host (the host pool's page ids) is null for no host tier, else outlives
  // the tree.
  RadixTree(const RadixTreeConfig& config, PageAllocator* device, PageAllocator* host = nullptr);
  // Unrefs every stored page in both tiers (locks are ignored: requests hold
  // their own refs). REQUIRES: no backup copy is still writing host pages.
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  int page_size() const { return page_size_; }
  bool has_host_tier() const { return host_ != nullptr; }
  // The logical clock: number of MatchPrefix + Insert + InsertHost calls so far.
  uint64_t clock() const { return clock_; }

  struct MatchResult {
    int64_t num_tokens = 0;      // device-cached prefix length, a multiple of page_size
    std::vector<int32_t> pages;  // num_tokens / page_size device page ids, in order
    RadixNodeHandle handle;      // node ending exactly at num_tokens (root if 0)
    // The continuation resident on the host only (0 without a host tier):
    int64_t host_tokens = 0;          // tokens after num_tokens, a multiple of page_size
    std::vector<int32_t> host_pages;  // host_tokens / page_size host page ids, in order
    RadixNodeHandle host_handle;      // node ending at num_tokens + host_tokens
                                      // (== handle when host_tokens == 0)
  };
  // Longest cached whole-page prefix of tokens: first through device-resident
  // nodes, then on through nodes with a valid host copy (not a backup in
  // flight). If the match ends inside a node, that node is split there so the
  // handles cover exactly the match. Marks the matched nodes as used now (LRU)
  // and counts one hit per node; adds num_tokens to hit_tokens, host_tokens to
  // host_hit_tokens and the rest of tokens.size() to miss_tokens (so call it
  // once per admission; PeekPrefixLength probes without counting).
  // The returned pages are only safe to use while the handle is locked: Lock
  // it (host_handle to load the host part back) before the next Insert or
  // Evict. The caller that must compute at least one token (for logits)
  // passes the prompt without its last token.
  MatchResult MatchPrefix(std::span<const int32_t> tokens);

  // The num_tokens MatchPrefix would return, changing nothing (no split, no
  // LRU touch, no stats). For scheduling policies and cache-aware routing.
  int64_t PeekPrefixLength(std::span<const int32_t> tokens) const;
  struct PrefixLengths {
    int64_t device_tokens = 0;  // MatchPrefix's num_tokens
    int64_t host_tokens = 0;    // MatchPrefix's host_tokens
  };
  // Both lengths MatchPrefix would return, changing nothing.
  PrefixLengths PeekPrefixLengths(std::span<const int32_t> tokens) const;

  // Adds one lock on handle's node (and so on every ancestor). Locks nest.
  // Works on host-only nodes. REQUIRES: handle is current (not evicted).
  void Lock(RadixNodeHandle handle);
  // Drops one lock taken by Lock(handle); when a node's last lock goes, its
  // pages become evictable again.
  // REQUIRES: handle is current and was locked at least once more than unlocked.
  void Unlock(RadixNodeHandle handle);

  struct InsertResult {
    // Leading tokens that were already cached on the device (a multiple of
    // page_size). The tree keeps its own pages for them and does NOT take the
    // caller's pages [0, num_cached_tokens / page_size): the caller keeps
    // using its copies until its PageTable releases them (they are freed
    // then), or may swap to the tree's pages (MatchPrefix) to free its
    // duplicates sooner.
    int64_t num_cached_tokens = 0;
    // Tokens whose device pages the tree took (Ref'd): new nodes, and
    // host-only nodes on the path that got the caller's pages (a load-back).
    int64_t num_inserted_tokens = 0;
    RadixNodeHandle handle;  // node ending at the last whole page of tokens
  };
  // Caches the whole pages of tokens (tokens.size() / page_size of them; a
  // trailing partial page is ignored) after a request computed their KV into
  // pages. Shares existing nodes for the cached part, attaches the caller's
  // pages to host-only nodes on the path (this is how a load-back completes:
  // the caller allocated device pages for the host part, the copy filled
  // them, then it Inserts the whole prefix), splits a node where the new
  // sequence leaves it, and takes one reference on each newly stored page.
  // Marks the path as used now. The new node is unlocked: a request that
  // keeps running on it (chunked prefill) locks the returned handle before
  // unlocking its old one.
  // REQUIRES: pages.size() >= tokens.size() / page_size; every page that gets
  // stored is in use in the device allocator and not already stored in the tree.
  InsertResult Insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

  // Along the device-cached path of tokens (whole pages, as Insert walks
  // it), swaps each stored page p for the caller's page q at the same index
  // when replace(p, q) says so: the tree takes a reference on q and drops
  // its one on p (freed if nobody else holds it). For page contents the
  // caller knows to be better than the tree's (a window backing's
  // tombstone, cache/window_backing.h, replaced by a recomputed page).
  // Skips nodes with a backup in flight; q must not be stored in the tree
  // already (those are skipped too). Changes no structure, lock, tier or
  // LRU order. Returns the pages swapped.
  // REQUIRES: pages.size() >= tokens.size() / page_size; every q swapped in
  // is in use in the device allocator.
  int64_t ReplaceDevicePages(std::span<const int32_t> tokens, std::span<const int32_t> pages,
                             const std::function<bool(int32_t tree_page, int32_t page)>& replace);

  struct InsertHostResult {
    int64_t num_taken_pages = 0;  // host pages the tree took a reference on
    // End of the host-resident run after the call (<= tokens.size(), a
    // multiple of page_size): shorter than the whole pages of tokens when the
    // path met a backup in flight, which cannot be extended on the host yet.
    int64_t num_tokens = 0;
    RadixNodeHandle handle;  // node ending at num_tokens
  };
  // Adds the host pages of tokens[start_tokens, end) (whole pages; storage
  // hits read into host pages): host_pages[i] holds the page starting at
  // start_tokens + i * page_size. Pages already host-resident in the tree are
  // not taken (the caller keeps its reference and frees them); a
  // device-only node on the path gets the host page as its valid host copy;
  // the rest becomes a host-only node. Marks the path as used now.
  // Returns NotFound (changing nothing) if tokens[0, start_tokens) is not in
  // the tree with a valid host copy along the whole path (host closure): it
  // may have been evicted while the read ran.
  // REQUIRES: a host tier; start_tokens a multiple of page_size, <= tokens.size();
  // host_pages.size() >= whole pages in [start_tokens, tokens.size()); each
  // page that gets stored is in use in the host allocator and not stored in
  // the tree.
  StatusOr<InsertHostResult> InsertHost(std::span<const int32_t> tokens, int64_t start_tokens,
                                        std::span<const int32_t> host_pages);

  // Removes device pages of least-recently-used device leaves (unlocked
  // nodes with device pages, no child with device pages, no backup in
  // flight) until num_pages pages have returned to the device allocator's
  // free list or no device leaf remains. A leaf with a valid host copy drops
  // its device pages and becomes host-only (split first if only its tail is
  // needed); one without is removed tail page first. A dropped page still
  // held by a request leaves the cache without freeing memory and does not
  // count. Returns the number of pages freed (<= num_pages unless
  // num_pages < 0, which frees nothing).
  // Cost: O(log nodes) per removed node plus O(1) per page.
  int64_t Evict(int64_t num_pages);

  // LRU device leaves without any host copy (valid or in flight), oldest
  // first, until they cover >= num_pages pages (or all there are). For
  // write_back: the caller backs them up, waits, then Evicts. Changes nothing.
  std::vector<RadixNodeHandle> UnbackedEvictionCandidates(int64_t num_pages) const;

  // Removes host pages of least-recently-used host leaves (unlocked nodes
  // with a valid host copy and no child with host pages) until num_pages
  // have returned to the host allocator's free list or none remains. A node
  // also on the device loses its host copy (split first if only its tail is
  // needed); a host-only node is removed tail page first. Returns the host
  // pages freed. Without a host tier: 0.
  int64_t EvictHost(int64_t num_pages);

  struct BackupJob {
    uint64_t id = 0;                    // for CompleteBackup / AbortBackup
    std::vector<int32_t> device_pages;  // copy these ...
    std::vector<int32_t> host_pages;    // ... into these (same order)
    int64_t num_tokens = 0;             // of the node(s): pages * page_size
    // The node's tokens and the chained hashes at its start (the parent's
    // end) and end: what the storage tier keys and confirms a run by.
    std::vector<int32_t> tokens;
    uint64_t start_hash = 0;
    uint64_t end_hash = 0;
  };
  // Starts backups for every node on root..handle that has device pages and
  // no host pages (valid or in flight), root first, one job per node: host
  // pages are allocated (EvictHost makes room, never from this path), the
  // node's device pages are pinned and its host pages are not matchable until
  // CompleteBackup. Stops at the first node that cannot get host pages.
  // Returns the started jobs in path order (empty: nothing to do or no room).
  // REQUIRES: a host tier; handle is current.
  std::vector<BackupJob> StartBackup(RadixNodeHandle handle);
  // The copy of job id finished: its host pages become valid (matchable,
  // evictable) once the parent's host copy is valid too; until then they
  // wait, still pinned. A job whose nodes lost their host pages meanwhile
  // (an ancestor's backup was aborted) just frees them now.
  // REQUIRES: id was returned by StartBackup and neither completed nor aborted.
  void CompleteBackup(uint64_t id);
  // The copy of job id failed or was cancelled (and is no longer writing):
  // its host pages are freed, and so are the in-flight host pages below it
  // (host closure); other jobs affected that way still end with their own
  // CompleteBackup / AbortBackup call, which then frees their pages.
  // REQUIRES: as CompleteBackup.
  void AbortBackup(uint64_t id);

  // Number of MatchPrefix calls that matched handle's node (split halves
  // inherit the count). For write_through_selective. REQUIRES: current handle.
  int64_t HitCount(RadixNodeHandle handle) const;
  // True iff every node on root..handle has a valid host copy (the root: true).
  bool HasHostCopy(RadixNodeHandle handle) const;
  // Where handle's node lives. REQUIRES: current, non-root handle.
  Residency NodeResidency(RadixNodeHandle handle) const;

  RadixTreeStats stats() const;

  // Chained hash of all tokens from the start of the sequence to the end of
  // handle's node (kRootHash for the root): the prefix's storage key.
  // REQUIRES: handle is current.
  uint64_t PrefixHash(RadixNodeHandle handle) const;

  // Verifies every invariant and returns Internal naming the first broken
  // one, or OK. O(cached pages * page_size + nodes log nodes):
  //  - every live node is reachable from the root exactly once and knows its
  //    parent; free node slots are not reachable;
  //  - a non-root node has tokens.size() == pages * page_size > 0 and one
  //    hash per page equal to ChainPageHash chained from its parent;
  //  - residency: device pages and host pages are each none or one per page,
  //    never both none; host pages only with a host tier;
  //  - device closure (device pages => parent has device pages) and host
  //    closure (host pages => parent has host pages; a valid host copy =>
  //    parent's is valid);
  //  - each child is keyed by exactly the tokens of its first page;
  //  - lock_ref(n) == Lock calls outstanding on n + sum of lock_ref(children),
  //    i.e. the number of locks held on n or any descendant; all >= 0;
  //    a locked node still has every tier it had while locked;
  //  - every stored page id (either tier) is in range, has allocator refcount
  //    >= 1 and is stored once in the whole tree (jobs' detached pages included);
  //  - backups: a node with a backup in flight has device pages and belongs
  //    to exactly that live job; every job lists exactly its nodes;
  //  - the device and host LRU sets are exactly the current device and host
  //    leaves, keyed by their current last access, and no node was used "in
  //    the future"; per-node child tier counts equal a recount;
  //  - the page, node and job counters equal a recount, and inserted minus
  //    evicted device pages equals the device pages cached.
  Status CheckIntegrity() const;

 private:
  friend class RadixTreeTestPeer;  // corrupts state to test CheckIntegrity

  static constexpr int32_t kRoot = 0;
  static constexpr int32_t kNone = -1;
  static constexpr uint8_t kTierDevice = 1;
  static constexpr uint8_t kTierHost = 2;  // a valid host copy

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
    std::vector<int32_t> tokens;        // pages * page_size tokens
    std::vector<int32_t> device_pages;  // one per page, or none (not on the device)
    std::vector<int32_t> host_pages;    // one per page, or none (not on the host)
    std::vector<uint64_t> page_hashes;  // chained hash up to the end of each page
    uint64_t backup_job = 0;            // != 0: host_pages are being written by this job
    std::map<std::vector<int32_t>, int32_t, PageKeyLess> children;  // first page -> node
    int32_t device_children = 0;                                    // children with device pages
    int32_t host_children = 0;  // children with host pages (valid or in flight)
    int32_t lock_ref = 0;       // locks held on this node or any descendant
    int32_t self_locks = 0;     // locks held on this node's own handles
    uint8_t locked_tiers = 0;   // tiers held while lock_ref > 0 (must not shrink)
    uint64_t last_access = 0;
    uint64_t hit_count = 0;
    int64_t num_pages() const { return static_cast<int64_t>(page_hashes.size()); }
    bool on_device() const { return !device_pages.empty(); }
    bool has_host_pages() const { return !host_pages.empty(); }  // valid or in flight
    bool host_valid() const { return !host_pages.empty() && backup_job == 0; }
    uint8_t tiers() const {
      return static_cast<uint8_t>((on_device() ? kTierDevice : 0) | (host_valid() ? kTierHost : 0));
    }
  };

  // A backup job: the nodes whose host_pages it is writing (a chain after
  // splits) and pages it still owns after its nodes lost them.
  struct Job {
    std::vector<int32_t> nodes;
    std::vector<int32_t> detached_host_pages;
    bool copied = false;  // CompleteBackup came; nodes wait for their parent's copy
  };

  using EvictKey = std::pair<uint64_t, int32_t>;  // (last_access, node): LRU first

  Node& node(int32_t id) { return nodes_[static_cast<size_t>(id)]; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  void CheckHandle(RadixNodeHandle h) const;
  RadixNodeHandle HandleOf(int32_t id) const { return {id, node(id).generation}; }
  uint64_t EndHash(int32_t id) const;
  bool IsDeviceLeaf(int32_t id) const;
  bool IsHostLeaf(int32_t id) const;
  bool ParentHostValid(int32_t id) const;
  // Whole pages at the start of node id's run equal to the start of tokens.
  int64_t MatchPages(int32_t id, std::span<const int32_t> tokens) const;

  // Every change to a node's pages, backup state or lock count is bracketed
  // by Unaccount(id) ... Account(id): they remove and re-add the node's share
  // of the counters, its parent's child tier counts and its LRU entries, so
  // those can never drift from the node's state.
  void Unaccount(int32_t id);
  void Account(int32_t id);
  void Relist(int32_t id);  // LRU entries of id from its current state
  // Sets last_access, keeping the LRU keys in step.
  void Touch(int32_t id, uint64_t now);
  int32_t NewNode();
  void FreeNode(int32_t id);
  // Unlinks and frees leaf id (already unaccounted, without pages), keyed
  // in its parent by key.
  void RemoveLeaf(int32_t id, const std::vector<int32_t>& key);
  // Splits id after its first `upper_pages` pages; returns the new upper
  // node. id keeps the lower part (so handles to id stay valid).
  int32_t Split(int32_t id, int64_t upper_pages);
  // Stores device pages on a node without them (Ref each).
  void AttachDevicePages(int32_t id, std::span<const int32_t> pages);
  // Stores valid host pages on a node without host pages (Ref each).
  void AttachHostPages(int32_t id, std::span<const int32_t> pages);
  // Makes id's host pages valid (its job is copied, its parent valid), then
  // those of waiting descendants whose jobs are copied too.
  void ValidateBackups(int32_t id);
  // Takes the in-flight host pages off id and every descendant (an ancestor
  // lost its host copy): freed if their copy is over, else kept by their job.
  void DetachPendingHost(int32_t id, uint64_t aborting_job);
  void EraseJobIfDone(uint64_t id);
  // Pages in the tail of id whose Unref would free them, counted back from
  // the end until `want` are found: how many tail pages to drop.
  int64_t TailPagesToFree(const std::vector<int32_t>& pages, const PageAllocator& alloc,
                          int64_t want) const;

  int page_size_;
  PageAllocator* allocator_;  // device
  PageAllocator* host_;       // null: no host tier
  std::vector<Node> nodes_;   // [0] is the root; indices are node ids
  std::vector<int32_t> free_nodes_;
  std::set<EvictKey> evictable_;       // device leaves
  std::set<EvictKey> host_evictable_;  // host leaves
  std::vector<uint8_t> in_tree_;       // per device page: stored by the tree
  std::vector<uint8_t> in_host_tree_;  // per host page: stored by the tree
  std::map<uint64_t, Job> jobs_;       // backups in flight (or waiting)
  uint64_t next_job_ = 1;
  uint64_t clock_ = 0;
  int64_t num_nodes_ = 0;
  int64_t evictable_pages_ = 0;
  int64_t locked_pages_ = 0;
  int64_t host_pages_ = 0;       // host pages on nodes (valid + in flight)
  int64_t host_only_pages_ = 0;  // pages of host-only nodes
  int64_t pending_pages_ = 0;    // host pages in flight on nodes
  int64_t detached_pages_ = 0;   // host pages jobs hold after their nodes lost them
  int64_t hit_tokens_ = 0;
  int64_t host_hit_tokens_ = 0;
  int64_t miss_tokens_ = 0;
  int64_t inserted_pages_ = 0;
  int64_t evicted_pages_ = 0;
  int64_t offloaded_pages_ = 0;
  int64_t host_inserted_pages_ = 0;
  int64_t host_evicted_pages_ = 0;
  int64_t backups_started_ = 0;
  int64_t backups_completed_ = 0;
  int64_t backups_aborted_ = 0;
};

}  // namespace strata
