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
// Files on disk are outside input: ParseStorageFile / ParseStorageHeader are
// pure functions (no I/O) that the fuzz target src/cache/fuzz/ drives.
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
#include "util/status.h"

namespace strata {

struct FileStorageOptions {
  std::string dir;           // --hicache-storage-path
  uint64_t max_bytes = 0;    // --hicache-storage-max-gb * 1e9; LRU eviction past it; 0: no limit
  std::string namespace_id;  // model + layout identity (e.g. a hex digest); [A-Za-z0-9._-], 1..128
                             // chars; files of another namespace are never read
  int io_threads = 2;        // >= 1
};

// A run of num_pages pages: start_hash is the chained hash before its first
// page (RadixTree::kRootHash at the start of a sequence), end_hash the
// chained hash after its last page.
struct StorageRun {
  uint64_t start_hash = 0;
  uint64_t end_hash = 0;
  int32_t num_pages = 0;
  bool operator==(const StorageRun&) const = default;
};

// ---- The file format (pure functions; no I/O) ----

inline constexpr char kStorageFileMagic[8] = {'S', 'T', 'R', 'K', 'V', 'R', 'U', 'N'};
inline constexpr uint32_t kStorageFormatVersion = 1;
// Upper bound on pages per file (far above any real run), so that every size
// computed from a header fits 64 bits.
inline constexpr int64_t kMaxStoragePagesPerFile = int64_t{1} << 20;

struct StorageFileHeader {
  uint64_t start_hash = 0;
  uint64_t end_hash = 0;
  int32_t num_pages = 0;
  uint64_t header_bytes = 0;  // fixed part + namespace + layout fingerprint + checksum
  uint64_t file_bytes = 0;    // the whole file: header, tokens, payload, checksum
};

struct StorageFileView {
  StorageFileHeader header;
  std::vector<int32_t> tokens;       // num_pages * page_size
  std::span<const uint8_t> payload;  // points into the parsed bytes
};

// Bytes of the header a file of `layout` in namespace `ns` has.
uint64_t StorageHeaderBytes(std::string_view ns, const KvLayout& layout);
// Bytes of a whole file of num_pages pages. REQUIRES: 1 <= num_pages <=
// kMaxStoragePagesPerFile.
uint64_t StorageFileBytes(std::string_view ns, const KvLayout& layout, int32_t num_pages);

// Parses a header: `bytes` starts at offset 0 of a file and holds at least
// the header (more is ignored). Checks magic, version, namespace, the layout
// fingerprint (page size and every group's layers, kv heads, head dim, dtype,
// K/V or K only), page count, payload size and the header checksum. A file
// of another version, namespace or layout is DataLoss ("foreign"), like a
// corrupt one. Never reads outside `bytes`.
StatusOr<StorageFileHeader> ParseStorageHeader(std::span<const uint8_t> bytes, std::string_view ns,
                                               const KvLayout& layout);
// Parses a whole file: the header as above, then the exact file size, the
// tokens and the checksum over everything before it. OK means every byte is
// what the writer wrote (up to a 64-bit checksum collision).
StatusOr<StorageFileView> ParseStorageFile(std::span<const uint8_t> bytes, std::string_view ns,
                                           const KvLayout& layout);
// The encoder's header + tokens bytes (the payload and the trailing checksum
// follow them in the file). REQUIRES: tokens.size() == num_pages * page_size.
std::vector<uint8_t> EncodeStorageHeaderAndTokens(std::string_view ns, const KvLayout& layout,
                                                  const StorageRun& run,
                                                  std::span<const int32_t> tokens);
// A whole file in memory (tests, the fuzz target and its seed corpus; the
// I/O threads stream the same bytes from host pages). REQUIRES: payload.size()
// == num_pages * layout.BytesPerPage().
std::vector<uint8_t> EncodeStorageFile(std::string_view ns, const KvLayout& layout,
                                       const StorageRun& run, std::span<const int32_t> tokens,
                                       std::span<const uint8_t> payload);
// "<endhash16hex>-<starthash16hex>.kv" and back (nullopt-like false for any
// other name: only lowercase hex, exact length).
std::string StorageFileName(uint64_t start_hash, uint64_t end_hash);
bool ParseStorageFileName(std::string_view name, uint64_t* start_hash, uint64_t* end_hash);

// The checksum of the format (see file_storage.cc for why our own).
// Streaming: Update in any pieces gives the same value as one Update.
class StorageChecksum {
 public:
  void Update(std::span<const uint8_t> bytes);
  uint64_t Final() const;

 private:
  uint64_t lanes_[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull,
                        0xd6e8feb86659fd93ull};
  uint8_t buf_[32] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};
uint64_t StorageChecksumOf(std::span<const uint8_t> bytes);

// ---- File system seam (fault injection in tests) ----

// The few file operations the storage tier does. Each returns 0 or an errno
// value. The real one (PosixStorageFileSystem) is thread-safe; a fake must
// be too (the I/O threads call it concurrently).
class StorageFileSystem {
 public:
  virtual ~StorageFileSystem() = default;
  // mkdir of one level; an existing directory is success.
  virtual int MakeDir(const std::string& path) = 0;
  // Names in `dir` (not "." / ".."), regular files and others alike.
  virtual int ListDir(const std::string& dir, std::vector<std::string>* names) = 0;
  // Size and modification time (ns since the epoch) of a regular file;
  // ENOENT-like errors as errno, EISDIR-like for a non-regular file.
  virtual int Stat(const std::string& path, uint64_t* size, int64_t* mtime_ns) = 0;
  // Up to max_bytes bytes from the start of the file.
  virtual int ReadFile(const std::string& path, uint64_t max_bytes, std::vector<uint8_t>* out) = 0;
  // Creates a new file (fails if it exists) holding the pieces in order.
  virtual int WriteNewFile(const std::string& path,
                           std::span<const std::span<const uint8_t>> pieces) = 0;
  virtual int Rename(const std::string& from, const std::string& to) = 0;
  virtual int Remove(const std::string& path) = 0;
  // Sets the modification time to now (the LRU order a restart reads).
  virtual int Touch(const std::string& path) = 0;
};
std::shared_ptr<StorageFileSystem> PosixStorageFileSystem();

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
