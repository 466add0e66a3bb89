// The `file` storage tier of HiCache (--hicache-storage-backend file): KV page
// runs kept as files under --hicache-storage-path, below the host pool.
//
// One file per page run, named by the run's chained page hashes
// (RadixTree::ChainPageHash): dir/<namespace>/<endhash16hex>-<starthash16hex>.kv.
// A file holds a header (magic, format version, namespace, layout
// fingerprint, hashes, page count), the run's tokens (a hash match is
// confirmed against them), the payload (every group x layer x K/V x page, in
// that order, each piece one BytesPerPagePerTensor(g) run of a host page)
// and a 64-bit checksum over all of it. The byte format and the behaviour
// (atomic writes, durability, capacity LRU, startup scan, error handling)
// are described in docs/architecture/hicache.md, "Storage tier".
//
// The byte format is in storage_format.h, the file-system seam in
// storage_file_system.h.
//
// Threads: FileStorage's public methods are called from one thread (the
// engine's) except stats(), which any thread may call. File I/O runs on the
// storage's own I/O threads; the engine thread never waits on a disk (Match
// only looks at the in-memory index; Submit* return at once).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/kv_layout.h"
#include "cache/storage_file_system.h"
#include "cache/storage_format.h"
#include "util/status.h"

namespace strata {

struct FileStorageOptions {
  std::string dir;           // --hicache-storage-path
  uint64_t max_bytes = 0;    // --hicache-storage-max-gb * 1e9; LRU eviction past it; 0: no limit
  std::string namespace_id;  // model + layout identity (e.g. a hex digest); [A-Za-z0-9._-], 1..128
                             // chars; files of another namespace are never read
  int io_threads = 2;        // >= 1
};

// ---- The storage tier ----

class FileStorage {
 public:
  // Creates dir/<namespace>/ if needed, removes stale temp files, and
  // rebuilds the index by scanning the directory (headers only, so startup is
  // fast; payload checked on read). A file whose header does not parse (or
  // names other hashes than its file name, or whose size differs from its
  // header's) is counted corrupt and removed; an unreadable one is counted
  // io and left in place; other names are left alone. LRU order from file mtime; past max_bytes
  // the oldest files are evicted. Errors: the directory cannot be created or
  // read (message names the path, the errno text and the flag), bad options.
  static StatusOr<std::unique_ptr<FileStorage>> Open(const FileStorageOptions& options,
                                                     const KvLayout& layout);
  // The same over another file system (tests inject faults through it).
  static StatusOr<std::unique_ptr<FileStorage>> Open(const FileStorageOptions& options,
                                                     const KvLayout& layout,
                                                     std::shared_ptr<StorageFileSystem> fs);
  // Finishes queued writes (and reads), joins the I/O threads.
  ~FileStorage();
  FileStorage(const FileStorage&) = delete;
  FileStorage& operator=(const FileStorage&) = delete;

  // Longest chain of stored runs that continues from start_hash:
  // page_hashes[i] is the chained hash at the end of the i-th page after
  // start; a run matches when its start hash is the current position's hash
  // and its end hash equals page_hashes[pos + num_pages - 1]. Returns the
  // runs in order (empty: miss). Touches them (LRU). Thread: engine; never
  // blocks on I/O.
  std::vector<StorageRun> Match(uint64_t start_hash, std::span<const uint64_t> page_hashes);

  using Ticket = uint64_t;  // > 0
  // Writes one run: `tokens` (the run's tokens, num_pages * page_size),
  // payload read from host pages `host_pages` of `host` by an I/O thread. The
  // caller keeps those host pages unchanged until the ticket completes.
  // Skipped (completes OK with bytes 0, nothing written) when the run is
  // already stored or being written, when writes are disabled, or when it
  // cannot fit (counted in skipped_capacity). Arguments that break the
  // contract (sizes, page ids) complete with InvalidArgument. Thread:
  // engine; returns at once.
  Ticket SubmitWrite(const StorageRun& run, std::vector<int32_t> tokens, KvPoolMemory host,
                     std::vector<int32_t> host_pages);
  // Reads one run into host pages `host_pages` of `host` and confirms the
  // file's tokens equal `expected_tokens` and its checksum matches. A
  // corrupt, truncated, foreign or mismatching file completes with DataLoss,
  // is counted (corrupt), removed, and dropped from the index — never
  // partially trusted (the caller treats it as a miss; host page contents
  // are then unspecified). A run not in the index (evicted since Match)
  // completes with NotFound; an I/O error with IoError (counted io; the file
  // is dropped too). A run being read is not evicted. Thread: engine;
  // returns at once.
  Ticket SubmitRead(const StorageRun& run, std::vector<int32_t> expected_tokens, KvPoolMemory host,
                    std::vector<int32_t> host_pages);

  struct Completion {
    Ticket ticket = 0;
    Status status;
    bool is_read = false;
    uint64_t bytes = 0;  // file bytes written or read; 0 when skipped
    double seconds = 0;  // I/O time on the I/O thread
  };
  // Completed since the last call, in completion order; never blocks.
  std::vector<Completion> Poll();
  // True if `t` completed by `deadline` (it is still returned by Poll).
  bool WaitFor(Ticket t, std::chrono::steady_clock::time_point deadline);

  struct Stats {
    uint64_t bytes = 0;  // of the stored files
    int64_t files = 0;
    int64_t errors_corrupt = 0, errors_io = 0, errors_full = 0;
    int64_t evicted_pages = 0;
    uint64_t evicted_bytes = 0;
    int64_t written_pages = 0;
    int64_t read_pages = 0;
    int64_t skipped_capacity =
        0;  // runs larger than max_bytes, or no room after evicting all unpinned files
    int64_t removed_temp =
        0;  // stale temp files (interrupted writes) removed at Open; not corruption
    bool writes_disabled = false;
    std::string writes_disabled_reason;
  };
  Stats stats() const;  // thread-safe

  const std::string& path() const;  // dir/<namespace>

 private:
  class Impl;
  explicit FileStorage(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
