// The on-disk format of the `file` storage tier (file_storage.h): one file
// per page run holding a header (magic, format version, namespace, layout
// fingerprint, hashes, page count), the run's tokens, the payload (every
// group x layer x K/V x page, in that order) and a 64-bit checksum over all
// of it. The byte format is described in docs/architecture/hicache.md,
// "Storage tier".
//
// Files on disk are outside input: ParseStorageFile / ParseStorageHeader are
// pure functions (no I/O) that the fuzz target src/cache/fuzz/ drives.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/kv_layout.h"
#include "util/status.h"

namespace strata {

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
// A namespace (FileStorageOptions::namespace_id) is 1..128 bytes of [A-Za-z0-9._-].
inline constexpr size_t kMaxStorageNamespaceBytes = 128;

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

// The file's last 8 bytes: `checksum` (of everything before it), little-endian.
std::vector<uint8_t> EncodeStorageTrailer(uint64_t checksum);

}  // namespace strata
