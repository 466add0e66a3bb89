// HiCache: the policy that moves KV pages between the device pool, a host
// pool and (optionally) a storage tier, on top of the tiered radix tree.
// docs/architecture/hicache.md has the design; this class is its glue:
//
//   - write policies: when a device prefix is copied to the host
//     (write_through: on insert; write_through_selective: once hit;
//     write_back: just before it is evicted);
//   - backups finished on the host go on to the storage tier, if any;
//   - load-back: copies a request's host-resident prefix into device pages
//     the scheduler reserved;
//   - prefetch: reads a prompt's continuation from storage into host pages
//     and inserts it into the tree as host-only nodes (then it loads back
//     like any host hit);
//   - counters for metrics (HiCacheStats).
//
// Copies run on the CacheController's thread and storage I/O on the
// FileStorage threads; this class only submits and, in Poll(), applies
// completions to the tree. The engine never waits on a copy except the ones
// the current step needs (a write_back eviction; a load-back when nothing
// else can run).
//
// Model-agnostic: page ids, token ids and KvLayout only.
// Not thread-safe: the engine thread owns it (like the tree).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/cache_controller.h"
#include "cache/file_storage.h"
#include "cache/hicache_plan.h"
#include "cache/host_pool.h"
#include "cache/kv_pool.h"
#include "cache/radix_tree.h"
#include "util/status.h"

namespace strata {

// Cumulative counters (tokens are pages * page_size) and current levels.
struct HiCacheStats {
  int64_t hit_tokens_device = 0;   // prompt tokens matched on the device
  int64_t hit_tokens_host = 0;     // ... on the host only (then loaded back)
  int64_t hit_tokens_storage = 0;  // ... in storage (read, then loaded back)
  int64_t load_back_tokens_host = 0;
  int64_t load_back_tokens_storage = 0;
  int64_t backup_tokens_host = 0;
  int64_t backup_tokens_storage = 0;
  int64_t evicted_tokens_device = 0;
  int64_t evicted_tokens_host = 0;
  int64_t evicted_tokens_storage = 0;
  int64_t storage_errors_corrupt = 0;
  int64_t storage_errors_io = 0;
  int64_t storage_errors_full = 0;
  int64_t host_pages_total = 0;
  int64_t host_pages_used = 0;
  uint64_t storage_bytes = 0;
  uint64_t load_back_bytes = 0;
  double load_back_copy_seconds = 0;  // time the copies themselves took
};

class HiCache {
 public:
  // `storage` may be null (no storage tier).
  // REQUIRES: tree was constructed with &host.allocator() as its host
  // allocator; device, host, tree and backend outlive this object (the tree
  // outlives it because the destructor still applies completions to it).
  HiCache(const HiCacheOptions& options, KvPool& device, HostKvPool& host, RadixTree& tree,
          Backend& backend, std::unique_ptr<FileStorage> storage);
  // Finishes every copy and storage write in flight (so a restart finds
  // them), then stops the controller.
  ~HiCache();
  HiCache(const HiCache&) = delete;
  HiCache& operator=(const HiCache&) = delete;

  const HiCacheOptions& options() const { return options_; }
  const HostKvPool& host_pool() const { return *host_; }
  bool has_storage() const { return storage_ != nullptr; }

  // Applies every finished copy and storage read/write: completes backups in
  // the tree, starts storage writes for them, inserts prefetched runs.
  // Never blocks.
  void Poll();
  // True while copies or storage I/O are in flight (the engine loop keeps
  // polling instead of sleeping).
  bool busy() const;
  // Blocks up to `timeout` for any completion, then Poll()s.
  void WaitAny(std::chrono::milliseconds timeout);

  // Write policies. `handle` is the node a request's prefix now ends at.
  void OnInserted(RadixNodeHandle handle);  // write_through
  void OnMatched(RadixNodeHandle handle);   // write_through_selective
  // write_back: backs up (and waits for) unbacked LRU device leaves
  // covering `num_pages`, so that the tree's Evict keeps them on the host.
  // No-op for the other policies (their copies are already there or lost).
  void PrepareEvict(int64_t num_pages);

  // Load-back: copies host pages to device pages (same order, equal
  // counts). Returns a ticket; LoadDone(ticket) turns true when the copy
  // finished (the tree is not touched: the caller Inserts the prefix with
  // the device pages once done). `from_storage` only attributes counters.
  using Ticket = uint64_t;
  Ticket StartLoadBack(std::span<const int32_t> host_pages, std::span<const int32_t> device_pages,
                       int64_t storage_tokens);
  // Status of a finished load-back (OK or the copy's error); nullopt while
  // in flight. A finished ticket is forgotten by the next call for it.
  std::optional<Status> TakeLoadBack(Ticket ticket);
  void WaitLoadBack(Ticket ticket);

  // Storage prefetch of the continuation of `tokens` past `start_tokens`
  // (the device + host match; a multiple of the page size): looks up stored
  // runs, allocates host pages for them and starts the reads. Returns 0 when
  // storage holds nothing for it, else a prefetch id; PrefetchDone(id) turns
  // true once every read finished and the runs that read correctly are in
  // the tree as host-only nodes. A run whose parent lost its host copy
  // meanwhile has nowhere to hang (host closure) and is dropped.
  uint64_t StartPrefetch(std::span<const int32_t> tokens, int64_t start_tokens);
  bool PrefetchDone(uint64_t id) const;
  void ForgetPrefetch(uint64_t id);
  // Storage tokens a finished prefetch put in the tree (for cached_tokens).
  int64_t PrefetchedTokens(uint64_t id) const;

  // A request matched `tokens` host-only tokens that its storage prefetch
  // had just brought: counted as storage hits, not host hits.
  void CountPrefetchedMatch(int64_t tokens) { host_hits_from_storage_ += tokens; }

  HiCacheStats stats() const;
  // Load-back durations (submit to completion) since the last call, for the
  // strata_hicache_load_back_seconds histogram.
  std::vector<double> TakeLoadBackSeconds();

  // The controller's view is consistent with the tree: every pinned host
  // page belongs to an operation in flight.
  Status CheckIntegrity() const;

 private:
  struct Backup {  // one tree backup job in flight on the controller
    uint64_t job_id = 0;
    std::vector<int32_t> tokens;  // the node's tokens, for the storage write
    uint64_t start_hash = 0, end_hash = 0;
    std::vector<int32_t> host_pages;
    int64_t num_tokens = 0;
  };
  struct StorageWrite {
    std::vector<int32_t> host_pages;  // pinned (one extra host ref each) until done
    int64_t num_tokens = 0;
  };
  struct StorageRead {
    uint64_t prefetch = 0;
    std::vector<int32_t> tokens;      // the whole prefix up to the run's end
    int64_t start_tokens = 0;         // where the run starts in tokens
    std::vector<int32_t> host_pages;  // ours (one host ref each) until inserted
    std::optional<Status> result;     // set when the read finished
  };
  // The runs of one prompt continuation, read in parallel, inserted into the
  // tree in order (a run hangs below the one before it).
  struct Prefetch {
    std::vector<FileStorage::Ticket> reads;  // in prompt order
    size_t next = 0;                         // first read not yet applied
    bool failed = false;                     // a read failed: later runs are dropped
    bool forgotten = false;                  // no request waits for it any more
    int64_t tokens_inserted = 0;
    bool done() const { return next == reads.size(); }
  };
  void AdvancePrefetch(uint64_t id);
  struct LoadBack {
    std::optional<Status> result;
    int64_t tokens = 0;
    int64_t storage_tokens = 0;
  };

  void StartBackups(RadixNodeHandle handle);
  void ApplyCopy(const CacheController::Completion& c);
  void ApplyStorage(const FileStorage::Completion& c);

  HiCacheOptions options_;
  KvPool& device_;
  RadixTree& tree_;
  Backend& backend_;
  HostKvPool* host_;
  std::unique_ptr<FileStorage> storage_;
  std::unique_ptr<CacheController> controller_;  // declared after the pools it copies between
  int page_size_;

  std::map<CacheController::Ticket, Backup> backups_;
  std::map<CacheController::Ticket, LoadBack> loads_;
  std::map<FileStorage::Ticket, StorageWrite> writes_;
  std::map<FileStorage::Ticket, StorageRead> reads_;
  std::map<uint64_t, Prefetch> prefetches_;
  uint64_t next_prefetch_ = 1;
  int64_t host_hits_from_storage_ = 0;
  std::vector<double> load_back_seconds_;
  HiCacheStats stats_;
};

}  // namespace strata
