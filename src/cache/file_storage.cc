#include "cache/file_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>

#include "cache/radix_tree.h"
#include "util/logging.h"

namespace strata {
namespace {

// ---- Byte order: the format is little-endian on every host ----

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Fixed part: magic 8, version 4, header_bytes 4, start 8, end 8, num_pages 4,
// page_size 4, num_groups 4, namespace_len 4.
constexpr uint64_t kFixedHeaderBytes = 48;
constexpr uint64_t kGroupRecordBytes =
    16;  // layers, kv heads, head dim (u32 each), dtype, has_v, 2 zero
constexpr uint64_t kHeaderTailBytes = 16;  // payload bytes, header checksum
constexpr uint64_t kChecksumBytes = 8;
constexpr size_t kMaxNamespaceBytes = 128;

uint64_t PayloadBytes(const KvLayout& layout, int32_t num_pages) {
  return static_cast<uint64_t>(num_pages) * layout.BytesPerPage();
}
uint64_t TokenBytes(const KvLayout& layout, int32_t num_pages) {
  return static_cast<uint64_t>(num_pages) * static_cast<uint64_t>(layout.page_size) * 4;
}

// A foreign namespace for an error message: printable, bounded.
std::string Printable(std::span<const uint8_t> bytes) {
  std::string s;
  for (size_t i = 0; i < bytes.size() && i < 64; ++i) {
    const char c = static_cast<char>(bytes[i]);
    s += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  if (bytes.size() > 64) s += "...";
  return s;
}

uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t Mix64(uint64_t z) {  // splitmix64 finalizer: a bijection on 64 bits
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kK1 = 0x9e3779b97f4a7c15ull;  // odd: multiplication is a bijection
constexpr uint64_t kK2 = 0xff51afd7ed558ccdull;  // odd
uint64_t Round(uint64_t acc, uint64_t word) { return Rotl(acc + word * kK1, 29) * kK2; }
uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // host order: the checksum of a little-endian host (the format's)
}

const char* ErrnoName(int e) {
  switch (e) {
    case ENOSPC:
      return "ENOSPC";
    case EDQUOT:
      return "EDQUOT";
    case EROFS:
      return "EROFS";
    case EACCES:
      return "EACCES";
    case EPERM:
      return "EPERM";
    case EIO:
      return "EIO";
    case ENOENT:
      return "ENOENT";
    case ENOTDIR:
      return "ENOTDIR";
    case EEXIST:
      return "EEXIST";
    case EISDIR:
      return "EISDIR";
    case EMFILE:
      return "EMFILE";
    default:
      return "errno";
  }
}
std::string ErrnoText(int e) {
  return std::string(std::strerror(e)) + " (" + ErrnoName(e) + " " + std::to_string(e) + ")";
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

// ---- Checksum ----
//
// Our own rather than a library: the Debian candidates (libxxhash's XXH3,
// zlib's crc32) would add a build and runtime dependency to every Strata
// binary, one more library to carry to the GPU machine (its image has no
// package registry), for ~40 lines. The job is detecting torn writes,
// truncation and bit rot, not adversaries. Four independent lanes (so the
// multiplies pipeline: 9-10 GB/s measured on one core of the 2-core
// development machine, above NVMe read speed) each take one 8-byte word per
// 32-byte block through
// acc = rotl(acc + w * K1, 29) * K2. With K1, K2 odd that round is a
// bijection in w for a fixed acc and in acc for a fixed w, so a change in any
// one word always changes its lane's final state; the lanes, the tail and the
// total length are then folded through the splitmix64 finalizer.
void StorageChecksum::Update(std::span<const uint8_t> bytes) {
  total_ += bytes.size();
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  if (buffered_ > 0) {
    const size_t take = std::min(n, sizeof(buf_) - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < sizeof(buf_)) return;
    for (int i = 0; i < 4; ++i) lanes_[i] = Round(lanes_[i], LoadU64(buf_ + 8 * i));
    buffered_ = 0;
  }
  while (n >= 32) {
    lanes_[0] = Round(lanes_[0], LoadU64(p));
    lanes_[1] = Round(lanes_[1], LoadU64(p + 8));
    lanes_[2] = Round(lanes_[2], LoadU64(p + 16));
    lanes_[3] = Round(lanes_[3], LoadU64(p + 24));
    p += 32;
    n -= 32;
  }
  if (n > 0) {
    std::memcpy(buf_, p, n);
    buffered_ = n;
  }
}

uint64_t StorageChecksum::Final() const {
  uint64_t h = Mix64(total_ ^ 0x53545241544b5631ull);  // "STRATKV1"
  for (uint64_t lane : lanes_) h = Mix64(h ^ Mix64(lane)) * kK1;
  size_t i = 0;
  for (; i + 8 <= buffered_; i += 8) h = Round(h, LoadU64(buf_ + i));
  uint64_t last = 0;
  std::memcpy(&last, buf_ + i, buffered_ - i);
  h = Round(h, last ^ (uint64_t{buffered_ - i} << 56));
  return Mix64(h);
}

uint64_t StorageChecksumOf(std::span<const uint8_t> bytes) {
  StorageChecksum c;
  c.Update(bytes);
  return c.Final();
}

// ---- Format ----

uint64_t StorageHeaderBytes(std::string_view ns, const KvLayout& layout) {
  return kFixedHeaderBytes + ns.size() + kGroupRecordBytes * layout.groups.size() +
         kHeaderTailBytes;
}

uint64_t StorageFileBytes(std::string_view ns, const KvLayout& layout, int32_t num_pages) {
  return StorageHeaderBytes(ns, layout) + TokenBytes(layout, num_pages) +
         PayloadBytes(layout, num_pages) + kChecksumBytes;
}

std::vector<uint8_t> EncodeStorageHeaderAndTokens(std::string_view ns, const KvLayout& layout,
                                                  const StorageRun& run,
                                                  std::span<const int32_t> tokens) {
  STRATA_CHECK(run.num_pages >= 1 && run.num_pages <= kMaxStoragePagesPerFile &&
               tokens.size() == static_cast<size_t>(run.num_pages) * layout.page_size)
      << "storage run of " << run.num_pages << " pages with " << tokens.size() << " tokens";
  const uint64_t header_bytes = StorageHeaderBytes(ns, layout);
  std::vector<uint8_t> out;
  out.reserve(header_bytes + tokens.size() * 4);
  for (char c : kStorageFileMagic) out.push_back(static_cast<uint8_t>(c));
  PutU32(out, kStorageFormatVersion);
  PutU32(out, static_cast<uint32_t>(header_bytes));
  PutU64(out, run.start_hash);
  PutU64(out, run.end_hash);
  PutU32(out, static_cast<uint32_t>(run.num_pages));
  PutU32(out, static_cast<uint32_t>(layout.page_size));
  PutU32(out, static_cast<uint32_t>(layout.groups.size()));
  PutU32(out, static_cast<uint32_t>(ns.size()));
  for (char c : ns) out.push_back(static_cast<uint8_t>(c));
  for (const PoolGroupSpec& g : layout.groups) {
    PutU32(out, static_cast<uint32_t>(g.num_layers));
    PutU32(out, static_cast<uint32_t>(g.num_kv_heads));
    PutU32(out, static_cast<uint32_t>(g.head_dim));
    out.push_back(static_cast<uint8_t>(g.dtype));
    out.push_back(g.has_v ? 1 : 0);
    out.push_back(0);
    out.push_back(0);
  }
  PutU64(out, PayloadBytes(layout, run.num_pages));
  PutU64(out, StorageChecksumOf(out));
  for (int32_t t : tokens) PutU32(out, static_cast<uint32_t>(t));
  return out;
}

std::vector<uint8_t> EncodeStorageFile(std::string_view ns, const KvLayout& layout,
                                       const StorageRun& run, std::span<const int32_t> tokens,
                                       std::span<const uint8_t> payload) {
  STRATA_CHECK(payload.size() == PayloadBytes(layout, run.num_pages))
      << "payload " << payload.size() << " bytes for " << run.num_pages << " pages";
  std::vector<uint8_t> out = EncodeStorageHeaderAndTokens(ns, layout, run, tokens);
  out.insert(out.end(), payload.begin(), payload.end());
  PutU64(out, StorageChecksumOf(out));
  return out;
}

StatusOr<StorageFileHeader> ParseStorageHeader(std::span<const uint8_t> bytes, std::string_view ns,
                                               const KvLayout& layout) {
  const uint64_t want_header = StorageHeaderBytes(ns, layout);
  if (bytes.size() < kFixedHeaderBytes) {
    return DataLoss("truncated header: " + std::to_string(bytes.size()) + " bytes, a header has " +
                    std::to_string(want_header));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kStorageFileMagic, 8) != 0) {
    return DataLoss("not a Strata KV storage file (bad magic)");
  }
  const uint32_t version = GetU32(p + 8);
  if (version != kStorageFormatVersion) {
    return DataLoss("foreign file: format version " + std::to_string(version) +
                    ", this build reads " + std::to_string(kStorageFormatVersion));
  }
  const uint32_t ns_len = GetU32(p + 44);
  if (ns_len > kMaxNamespaceBytes || kFixedHeaderBytes + ns_len > bytes.size()) {
    return DataLoss("foreign or truncated file: namespace length " + std::to_string(ns_len) +
                    " in a header of " + std::to_string(bytes.size()) + " bytes");
  }
  const std::span<const uint8_t> file_ns = bytes.subspan(kFixedHeaderBytes, ns_len);
  if (ns_len != ns.size() || std::memcmp(file_ns.data(), ns.data(), ns_len) != 0) {
    return DataLoss("foreign file: namespace '" + Printable(file_ns) + "', expected '" +
                    std::string(ns) + "'");
  }
  const uint32_t page_size = GetU32(p + 36);
  const uint32_t num_groups = GetU32(p + 40);
  if (page_size != static_cast<uint32_t>(layout.page_size) || num_groups != layout.groups.size()) {
    return DataLoss("foreign layout: file has page size " + std::to_string(page_size) + " and " +
                    std::to_string(num_groups) + " pool groups, this server " +
                    std::to_string(layout.page_size) + " and " +
                    std::to_string(layout.groups.size()));
  }
  const uint32_t header_bytes = GetU32(p + 12);
  if (header_bytes != want_header) {
    return DataLoss("corrupt header: header size " + std::to_string(header_bytes) + ", expected " +
                    std::to_string(want_header));
  }
  if (bytes.size() < want_header) {
    return DataLoss("truncated header: " + std::to_string(bytes.size()) + " of " +
                    std::to_string(want_header) + " bytes");
  }
  const uint8_t* g = p + kFixedHeaderBytes + ns_len;
  for (size_t i = 0; i < layout.groups.size(); ++i, g += kGroupRecordBytes) {
    const PoolGroupSpec& s = layout.groups[i];
    const bool same = GetU32(g) == static_cast<uint32_t>(s.num_layers) &&
                      GetU32(g + 4) == static_cast<uint32_t>(s.num_kv_heads) &&
                      GetU32(g + 8) == static_cast<uint32_t>(s.head_dim) &&
                      g[12] == static_cast<uint8_t>(s.dtype) && g[13] == (s.has_v ? 1 : 0) &&
                      g[14] == 0 && g[15] == 0;
    if (!same) {
      return DataLoss("foreign layout: pool group " + std::to_string(i) + " is " +
                      std::to_string(GetU32(g)) + " layers x " + std::to_string(g[13] ? 2 : 1) +
                      " x " + std::to_string(GetU32(g + 4)) + " kv heads x " +
                      std::to_string(GetU32(g + 8)) + " (dtype " + std::to_string(g[12]) +
                      ") in the file; this server's layout: " + layout.Describe());
    }
  }
  const uint32_t num_pages = GetU32(p + 32);
  if (num_pages < 1 || num_pages > kMaxStoragePagesPerFile) {
    return DataLoss("corrupt header: " + std::to_string(num_pages) + " pages (1.." +
                    std::to_string(kMaxStoragePagesPerFile) + ")");
  }
  const int32_t pages = static_cast<int32_t>(num_pages);
  const uint64_t payload = GetU64(g);
  if (payload != PayloadBytes(layout, pages)) {
    return DataLoss("corrupt header: payload " + std::to_string(payload) + " bytes, " +
                    std::to_string(num_pages) + " pages of this layout are " +
                    std::to_string(PayloadBytes(layout, pages)));
  }
  // Last: the field checks above name what differs (and the fuzzer reaches them).
  const uint64_t stored_sum = GetU64(p + want_header - 8);
  if (StorageChecksumOf(bytes.first(want_header - 8)) != stored_sum) {
    return DataLoss("corrupt header: header checksum mismatch");
  }
  StorageFileHeader h;
  h.start_hash = GetU64(p + 16);
  h.end_hash = GetU64(p + 24);
  h.num_pages = pages;
  h.header_bytes = want_header;
  h.file_bytes = StorageFileBytes(ns, layout, pages);
  return h;
}

StatusOr<StorageFileView> ParseStorageFile(std::span<const uint8_t> bytes, std::string_view ns,
                                           const KvLayout& layout) {
  ASSIGN_OR_RETURN(StorageFileHeader h, ParseStorageHeader(bytes, ns, layout));
  if (bytes.size() != h.file_bytes) {
    return DataLoss(std::string(bytes.size() < h.file_bytes ? "truncated" : "oversized") +
                    " file: " + std::to_string(bytes.size()) + " bytes, its header says " +
                    std::to_string(h.file_bytes));
  }
  const uint64_t body = h.file_bytes - kChecksumBytes;
  if (StorageChecksumOf(bytes.first(body)) != GetU64(bytes.data() + body)) {
    return DataLoss("corrupt file: checksum mismatch over header, tokens and payload");
  }
  StorageFileView v;
  v.header = h;
  const uint64_t num_tokens = TokenBytes(layout, h.num_pages) / 4;
  v.tokens.resize(num_tokens);
  const uint8_t* t = bytes.data() + h.header_bytes;
  for (uint64_t i = 0; i < num_tokens; ++i) v.tokens[i] = static_cast<int32_t>(GetU32(t + 4 * i));
  v.payload = bytes.subspan(h.header_bytes + 4 * num_tokens, PayloadBytes(layout, h.num_pages));
  return v;
}

std::string StorageFileName(uint64_t start_hash, uint64_t end_hash) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx-%016llx.kv", static_cast<unsigned long long>(end_hash),
                static_cast<unsigned long long>(start_hash));
  return buf;
}

bool ParseStorageFileName(std::string_view name, uint64_t* start_hash, uint64_t* end_hash) {
  if (name.size() != 36 || name[16] != '-' || name.substr(33) != ".kv") return false;
  auto hex = [](std::string_view s, uint64_t* out) {
    uint64_t v = 0;
    for (char c : s) {
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else {
        return false;
      }
      v = (v << 4) | static_cast<uint64_t>(d);
    }
    *out = v;
    return true;
  };
  return hex(name.substr(0, 16), end_hash) && hex(name.substr(17, 16), start_hash);
}

// ---- POSIX file system ----

namespace {

class PosixFs final : public StorageFileSystem {
 public:
  int MakeDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) == 0) return 0;
    const int e = errno;
    struct stat st;
    if (e == EEXIST && ::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    return e;
  }
  int ListDir(const std::string& dir, std::vector<std::string>* names) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return errno;
    names->clear();
    for (;;) {
      errno = 0;
      struct dirent* e = ::readdir(d);
      if (e == nullptr) break;
      const std::string n = e->d_name;
      if (n != "." && n != "..") names->push_back(n);
    }
    const int e = errno;
    ::closedir(d);
    return e;
  }
  int Stat(const std::string& path, uint64_t* size, int64_t* mtime_ns) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (!S_ISREG(st.st_mode)) return EISDIR;
    *size = static_cast<uint64_t>(st.st_size);
    *mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    return 0;
  }
  int ReadFile(const std::string& path, uint64_t max_bytes, std::vector<uint8_t>* out) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return e;
    }
    out->resize(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), max_bytes));
    size_t done = 0;
    while (done < out->size()) {
      const ssize_t n =
          ::pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return e;
      }
      if (n == 0) break;  // shrank since fstat: the parser sees it truncated
      done += static_cast<size_t>(n);
    }
    out->resize(done);
    ::close(fd);
    return 0;
  }
  int WriteNewFile(const std::string& path,
                   std::span<const std::span<const uint8_t>> pieces) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    std::vector<struct iovec> iov;
    iov.reserve(pieces.size());
    for (auto p : pieces) {
      if (!p.empty()) iov.push_back({const_cast<uint8_t*>(p.data()), p.size()});
    }
    size_t first = 0;
    while (first < iov.size()) {
      const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
      const ssize_t n = ::writev(fd, iov.data() + first, count);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return e;
      }
      size_t left = static_cast<size_t>(n);  // skip what was written, maybe part of an iovec
      while (left > 0 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (left > 0) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    // close can report a deferred write error (NFS, quotas).
    return ::close(fd) == 0 ? 0 : errno;
  }
  int Rename(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
  }
  int Remove(const std::string& path) override { return ::unlink(path.c_str()) == 0 ? 0 : errno; }
  int Touch(const std::string& path) override {
    return ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0) == 0 ? 0 : errno;
  }
};

}  // namespace

std::shared_ptr<StorageFileSystem> PosixStorageFileSystem() {
  static const std::shared_ptr<StorageFileSystem> fs = std::make_shared<PosixFs>();
  return fs;
}

// ---- FileStorage ----

class FileStorage::Impl {
 public:
  Impl(const FileStorageOptions& o, const KvLayout& layout, std::shared_ptr<StorageFileSystem> fs)
      : opts_(o), layout_(layout), fs_(std::move(fs)), dir_(o.dir + "/" + o.namespace_id) {}

  ~Impl() {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status Scan();
  void Start() {
    for (int i = 0; i < opts_.io_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  }
  std::vector<StorageRun> Match(uint64_t start_hash, std::span<const uint64_t> page_hashes);
  Ticket SubmitWrite(const StorageRun& run, std::vector<int32_t> tokens, KvPoolMemory host,
                     std::vector<int32_t> host_pages);
  Ticket SubmitRead(const StorageRun& run, std::vector<int32_t> expected_tokens, KvPoolMemory host,
                    std::vector<int32_t> host_pages);
  std::vector<Completion> Poll() {
    std::lock_guard l(mu_);
    return std::exchange(done_, {});
  }
  bool WaitFor(Ticket t, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock l(mu_);
    return done_cv_.wait_until(
        l, deadline, [&] { return t > 0 && t < next_ticket_ && !in_flight_.contains(t); });
  }
  Stats stats() const {
    std::lock_guard l(mu_);
    return stats_;
  }
  const std::string& dir() const { return dir_; }

 private:
  struct Key {
    uint64_t start = 0, end = 0;
    auto operator<=>(const Key&) const = default;
  };
  // kQueued → kWriting → kStored → kRemoving → erased; a failed write is
  // erased from kQueued/kWriting.
  enum class State { kQueued, kWriting, kStored, kRemoving };
  struct Entry {
    uint64_t id = 0;
    State state = State::kQueued;
    int32_t num_pages = 0;
    uint64_t bytes = 0;            // the file's size (reserved against max_bytes while writing)
    int pins = 0;                  // reads submitted and not finished: not evictable
    std::list<Key>::iterator lru;  // valid when kStored
  };
  struct Victim {
    Key key;
    uint64_t id = 0;
  };
  struct Job {
    Ticket ticket = 0;
    bool is_read = false;
    Key key;
    uint64_t entry_id = 0;
    int32_t num_pages = 0;
    std::vector<int32_t> tokens;
    KvPoolMemory host;
    std::vector<int32_t> pages;
  };

  std::string PathOf(const Key& k) const { return dir_ + "/" + StorageFileName(k.start, k.end); }
  // REQUIRES: mu_ held.
  Ticket CompleteNowLocked(bool is_read, Status s) {
    const Ticket t = next_ticket_++;
    done_.push_back({t, std::move(s), is_read, 0, 0});
    done_cv_.notify_all();
    return t;
  }
  Status CheckHostArgs(const StorageRun& run, size_t num_tokens, const KvPoolMemory& host,
                       const std::vector<int32_t>& pages) const;
  // A queued or writing entry whose write ended without a file: erased.
  // REQUIRES: mu_ held.
  void DropLocked(std::map<Key, Entry>::iterator it) {
    if (it->second.state == State::kWriting) used_bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  // A stored entry whose file is about to be removed: out of the LRU, the
  // counts and Match at once, but kept in the map (kRemoving) until the
  // caller has unlinked the file and calls EraseRemovingLocked, so that no
  // new write of the same run can be queued and renamed in between (its file
  // would be the one unlinked). REQUIRES: mu_ held, state kStored.
  Victim RetireLocked(std::map<Key, Entry>::iterator it) {
    lru_.erase(it->second.lru);
    stats_.bytes -= it->second.bytes;
    stats_.files -= 1;
    used_bytes_ -= it->second.bytes;
    it->second.state = State::kRemoving;
    return {it->first, it->second.id};
  }
  // After the unlink of retired entries. REQUIRES: mu_ held.
  void EraseRemovingLocked(const std::vector<Victim>& victims) {
    for (const Victim& v : victims) {
      auto it = entries_.find(v.key);
      if (it != entries_.end() && it->second.id == v.id) entries_.erase(it);
    }
  }
  void RemoveFiles(const std::vector<Victim>& victims) {
    int64_t failed = 0;
    for (const Victim& v : victims) {
      if (const int e = fs_->Remove(PathOf(v.key)); e != 0 && e != ENOENT) ++failed;
    }
    std::lock_guard l(mu_);
    stats_.errors_io += failed;
    EraseRemovingLocked(victims);
  }
  // Makes room for `bytes` more by retiring unpinned LRU files into
  // `victims` (the caller removes them outside the lock: RemoveFiles). False
  // when even that is not enough, and then nothing is evicted. REQUIRES: mu_ held.
  bool EvictForLocked(uint64_t bytes, std::vector<Victim>* victims);
  // Classifies a failed write or rename; stops backups on full/read-only
  // disks. Returns the completion status and, when this call disabled
  // writes, the line to log once. REQUIRES: mu_ held.
  Status OnWriteErrorLocked(int err, const std::string& what, std::string* log_line);
  void WorkerLoop();
  Completion DoWrite(Job& job);
  Completion DoRead(Job& job);

  const FileStorageOptions opts_;
  const KvLayout layout_;
  const std::shared_ptr<StorageFileSystem> fs_;
  const std::string dir_;
  std::atomic<uint64_t> temp_seq_{0};

  mutable std::mutex mu_;  // everything below
  std::condition_variable work_cv_, done_cv_;
  std::map<Key, Entry> entries_;  // ordered by (start, end): Match finds runs from a hash by range
  std::list<Key> lru_;            // stored files, least recently used first
  uint64_t used_bytes_ = 0;       // stored + being written (what max_bytes bounds)
  uint64_t next_entry_id_ = 1;
  Ticket next_ticket_ = 1;
  std::deque<Job> queue_;
  std::unordered_set<Ticket> in_flight_;
  std::vector<Completion> done_;
  Stats stats_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

Status FileStorage::Impl::Scan() {
  std::vector<std::string> names;
  if (const int e = fs_->ListDir(dir_, &names); e != 0) {
    return Status(StatusCode::kIoError, "hicache storage: cannot read directory " + dir_ + ": " +
                                            ErrnoText(e) +
                                            "; check --hicache-storage-path and its permissions");
  }
  std::sort(names.begin(), names.end());
  struct Found {
    Key key;
    int32_t num_pages;
    uint64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  const uint64_t header_bytes = StorageHeaderBytes(opts_.namespace_id, layout_);
  int64_t temps = 0, corrupt = 0, unreadable = 0;
  for (const std::string& name : names) {
    const std::string path = dir_ + "/" + name;
    // A write a crash interrupted (or garbage): never renamed, never read.
    if (EndsWith(name, ".tmp")) {
      fs_->Remove(path);
      ++temps;
      continue;
    }
    Key key;
    if (!ParseStorageFileName(name, &key.start, &key.end)) continue;  // not ours: left alone
    uint64_t size = 0;
    int64_t mtime = 0;
    if (fs_->Stat(path, &size, &mtime) != 0) continue;  // a directory or gone
    std::vector<uint8_t> head;
    if (const int e = fs_->ReadFile(path, header_bytes, &head); e != 0) {
      // Unreadable is not corrupt: left in place, not indexed, counted io.
      STRATA_LOG(WARN) << "hicache storage: cannot read " << path << ": " << ErrnoText(e)
                       << "; skipped";
      ++unreadable;
      continue;
    }
    Status bad = OkStatus();
    StatusOr<StorageFileHeader> h = ParseStorageHeader(head, opts_.namespace_id, layout_);
    if (!h.ok()) {
      bad = h.status();
    } else if (h->start_hash != key.start || h->end_hash != key.end) {
      bad = DataLoss("its header names other hashes than its file name");
    } else if (h->file_bytes != size) {
      bad = DataLoss("truncated or oversized: " + std::to_string(size) +
                     " bytes, its header says " + std::to_string(h->file_bytes));
    } else {
      found.push_back({key, h->num_pages, size, mtime});
    }
    if (!bad.ok()) {
      STRATA_LOG(DEBUG) << "hicache storage: removing " << path << ": " << bad.message();
      fs_->Remove(path);
      ++corrupt;
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
  std::vector<Victim> victims;
  {
    std::lock_guard l(mu_);
    stats_.errors_corrupt += corrupt;
    stats_.errors_io += unreadable;
    stats_.removed_temp += temps;
    for (const Found& f : found) {
      Entry& e = entries_[f.key];
      e.id = next_entry_id_++;
      e.state = State::kStored;
      e.num_pages = f.num_pages;
      e.bytes = f.bytes;
      e.lru = lru_.insert(lru_.end(), f.key);
      used_bytes_ += f.bytes;
      stats_.bytes += f.bytes;
      stats_.files += 1;
    }
    if (opts_.max_bytes > 0 && used_bytes_ > opts_.max_bytes) {  // the limit was lowered
      EvictForLocked(0, &victims);
    }
  }
  RemoveFiles(victims);
  const Stats s = stats();
  STRATA_LOG(INFO) << "hicache storage: " << dir_ << ": " << s.files << " stored runs (" << s.bytes
                   << " bytes) found"
                   << (corrupt ? "; removed " + std::to_string(corrupt) + " corrupt files" : "")
                   << (temps ? "; removed " + std::to_string(temps) + " temp files" : "")
                   << (victims.empty()
                           ? ""
                           : "; evicted " + std::to_string(victims.size()) + " past the limit");
  return OkStatus();
}

bool FileStorage::Impl::EvictForLocked(uint64_t bytes, std::vector<Victim>* victims) {
  if (opts_.max_bytes == 0) return true;
  if (bytes > opts_.max_bytes) return false;  // never fits: evict nothing for it
  if (used_bytes_ + bytes > opts_.max_bytes) {
    uint64_t evictable = 0;
    for (const Key& k : lru_) {
      const Entry& e = entries_.find(k)->second;
      if (e.pins == 0) evictable += e.bytes;
    }
    if (used_bytes_ - evictable + bytes > opts_.max_bytes)
      return false;  // pinned by reads: evict nothing
  }
  auto it = lru_.begin();
  while (used_bytes_ + bytes > opts_.max_bytes && it != lru_.end()) {
    auto e = entries_.find(*it);
    ++it;
    if (e->second.pins > 0) continue;
    stats_.evicted_pages += e->second.num_pages;
    stats_.evicted_bytes += e->second.bytes;
    victims->push_back(RetireLocked(e));
  }
  return used_bytes_ + bytes <= opts_.max_bytes;
}

std::vector<StorageRun> FileStorage::Impl::Match(uint64_t start_hash,
                                                 std::span<const uint64_t> page_hashes) {
  const size_t n = page_hashes.size();
  std::vector<StorageRun> out;
  std::lock_guard l(mu_);
  if (entries_.empty() || n == 0) return out;
  // Page positions a chain of stored runs reaches from position 0, each with
  // the run that reached it first (its start position and entry). A std::map
  // visited in order: runs only go forward, so a position is complete when
  // visited, and the cost is one lookup per reached position, however long
  // the prompt (a miss is one lookup).
  using It = std::map<Key, Entry>::iterator;
  std::map<size_t, std::pair<size_t, It>> reached;
  reached.emplace(0, std::pair<size_t, It>{0, entries_.end()});
  size_t best = 0;
  for (auto cur = reached.begin(); cur != reached.end(); ++cur) {
    const size_t pos = cur->first;
    const uint64_t h = pos == 0 ? start_hash : page_hashes[pos - 1];
    for (auto it = entries_.lower_bound(Key{h, 0}); it != entries_.end() && it->first.start == h;
         ++it) {
      if (it->second.state != State::kStored) continue;
      const size_t end = pos + static_cast<size_t>(it->second.num_pages);
      if (end > n || page_hashes[end - 1] != it->first.end) continue;
      reached.try_emplace(end, pos, it);
      best = std::max(best, end);
    }
  }
  for (size_t pos = best; pos > 0;) {
    const auto& [from, it] = reached.at(pos);
    out.push_back({it->first.start, it->first.end, it->second.num_pages});
    lru_.splice(lru_.end(), lru_, it->second.lru);  // touch
    pos = from;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

Status FileStorage::Impl::CheckHostArgs(const StorageRun& run, size_t num_tokens,
                                        const KvPoolMemory& host,
                                        const std::vector<int32_t>& pages) const {
  if (run.num_pages < 1 || run.num_pages > kMaxStoragePagesPerFile) {
    return InvalidArgument("storage run of " + std::to_string(run.num_pages) + " pages (1.." +
                           std::to_string(kMaxStoragePagesPerFile) + ")");
  }
  if (num_tokens != static_cast<size_t>(run.num_pages) * layout_.page_size ||
      pages.size() != static_cast<size_t>(run.num_pages)) {
    return InvalidArgument("storage run of " + std::to_string(run.num_pages) + " pages given " +
                           std::to_string(num_tokens) + " tokens and " +
                           std::to_string(pages.size()) + " host pages (page size " +
                           std::to_string(layout_.page_size) + ")");
  }
  bool same_layout = host.layout != nullptr && host.layout->page_size == layout_.page_size &&
                     host.layout->groups.size() == layout_.groups.size() &&
                     host.group_base.size() == layout_.groups.size();
  for (size_t g = 0; same_layout && g < layout_.groups.size(); ++g) {
    const PoolGroupSpec& a = host.layout->groups[g];
    const PoolGroupSpec& b = layout_.groups[g];
    same_layout = a.num_layers == b.num_layers && a.has_v == b.has_v &&
                  host.layout->BytesPerPagePerTensor(static_cast<int>(g)) ==
                      layout_.BytesPerPagePerTensor(static_cast<int>(g));
  }
  if (!same_layout)
    return InvalidArgument("host pool layout differs from the storage tier's layout");
  for (int32_t p : pages) {
    if (p < 0 || p >= host.num_pages) {
      return InvalidArgument("host page " + std::to_string(p) + " outside the host pool of " +
                             std::to_string(host.num_pages) + " pages");
    }
  }
  return OkStatus();
}

FileStorage::Ticket FileStorage::Impl::SubmitWrite(const StorageRun& run,
                                                   std::vector<int32_t> tokens, KvPoolMemory host,
                                                   std::vector<int32_t> host_pages) {
  Status args = CheckHostArgs(run, tokens.size(), host, host_pages);
  std::lock_guard l(mu_);
  if (!args.ok()) return CompleteNowLocked(false, std::move(args));
  const Key key{run.start_hash, run.end_hash};
  if (stats_.writes_disabled || entries_.contains(key)) return CompleteNowLocked(false, OkStatus());
  Entry& e = entries_[key];
  e.id = next_entry_id_++;
  e.state = State::kQueued;
  e.num_pages = run.num_pages;
  const Ticket t = next_ticket_++;
  in_flight_.insert(t);
  queue_.push_back({t, false, key, e.id, run.num_pages, std::move(tokens), std::move(host),
                    std::move(host_pages)});
  work_cv_.notify_one();
  return t;
}

FileStorage::Ticket FileStorage::Impl::SubmitRead(const StorageRun& run,
                                                  std::vector<int32_t> expected_tokens,
                                                  KvPoolMemory host,
                                                  std::vector<int32_t> host_pages) {
  Status args = CheckHostArgs(run, expected_tokens.size(), host, host_pages);
  std::lock_guard l(mu_);
  if (!args.ok()) return CompleteNowLocked(true, std::move(args));
  const Key key{run.start_hash, run.end_hash};
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state != State::kStored ||
      it->second.num_pages != run.num_pages) {
    return CompleteNowLocked(true, NotFound("storage run " + StorageFileName(key.start, key.end) +
                                            " is not stored (evicted since Match?)"));
  }
  it->second.pins += 1;
  const Ticket t = next_ticket_++;
  in_flight_.insert(t);
  queue_.push_back({t, true, key, it->second.id, run.num_pages, std::move(expected_tokens),
                    std::move(host), std::move(host_pages)});
  work_cv_.notify_one();
  return t;
}

void FileStorage::Impl::WorkerLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock l(mu_);
      work_cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained: the destructor finishes queued work
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto t0 = std::chrono::steady_clock::now();
    Completion c = job.is_read ? DoRead(job) : DoWrite(job);
    c.ticket = job.ticket;
    c.is_read = job.is_read;
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard l(mu_);
      in_flight_.erase(job.ticket);
      done_.push_back(std::move(c));
    }
    done_cv_.notify_all();
  }
}

Status FileStorage::Impl::OnWriteErrorLocked(int err, const std::string& what,
                                             std::string* log_line) {
  const std::string text = "hicache storage: " + what + ": " + ErrnoText(err);
  const bool full = err == ENOSPC || err == EDQUOT;
  const bool read_only = err == EROFS || err == EACCES || err == EPERM;
  if (full) {
    stats_.errors_full += 1;
  } else {
    stats_.errors_io += 1;
  }
  if ((full || read_only) && !stats_.writes_disabled) {
    stats_.writes_disabled = true;
    stats_.writes_disabled_reason =
        text +
        (full ? "; backups to storage are off until restart (free space or raise the quota of "
                "--hicache-storage-path, or lower --hicache-storage-max-gb)"
              : "; backups to storage are off until restart (make --hicache-storage-path "
                "writable)") +
        "; reads from storage go on";
    *log_line = stats_.writes_disabled_reason;
  }
  if (full) return ResourceExhausted(text);
  return Status(StatusCode::kIoError, text);
}

FileStorage::Completion FileStorage::Impl::DoWrite(Job& job) {
  Completion c;
  const uint64_t file_bytes = StorageFileBytes(opts_.namespace_id, layout_, job.num_pages);
  // The tokens must be the run's: a file is trusted by its hashes at Match.
  uint64_t h = job.key.start;
  const size_t ps = static_cast<size_t>(layout_.page_size);
  for (size_t p = 0; p < static_cast<size_t>(job.num_pages); ++p) {
    h = RadixTree::ChainPageHash(h, std::span<const int32_t>(job.tokens).subspan(p * ps, ps));
  }
  std::vector<Victim> victims;
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    if (h != job.key.end) {
      DropLocked(it);
      c.status = InvalidArgument("storage write: the tokens do not hash to the run's end hash " +
                                 StorageFileName(job.key.start, job.key.end));
      return c;
    }
    if (stats_.writes_disabled) {  // disabled while this write was queued
      DropLocked(it);
      return c;
    }
    if (!EvictForLocked(file_bytes, &victims)) {
      DropLocked(it);
      stats_.skipped_capacity += 1;
      return c;  // larger than max_bytes, or the rest is being read: skipped
    }
    it->second.state = State::kWriting;
    it->second.bytes = file_bytes;
    used_bytes_ += file_bytes;
  }
  RemoveFiles(victims);
  // Header and tokens, then the payload straight from the host pages.
  const std::vector<uint8_t> head = EncodeStorageHeaderAndTokens(
      opts_.namespace_id, layout_, {job.key.start, job.key.end, job.num_pages}, job.tokens);
  std::vector<std::span<const uint8_t>> pieces;
  pieces.push_back(head);
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const PoolGroupSpec& s = layout_.groups[g];
    const size_t bytes = layout_.BytesPerPagePerTensor(static_cast<int>(g));
    for (int layer = 0; layer < s.num_layers; ++layer) {
      for (int tensor = 0; tensor < (s.has_v ? 2 : 1); ++tensor) {
        for (int32_t page : job.pages) {
          pieces.emplace_back(reinterpret_cast<const uint8_t*>(
                                  job.host.PagePtr(static_cast<int>(g), layer, tensor, page)),
                              bytes);
        }
      }
    }
  }
  StorageChecksum sum;
  for (auto p : pieces) sum.Update(p);
  std::vector<uint8_t> trailer;
  PutU64(trailer, sum.Final());
  pieces.push_back(trailer);

  // Atomic: the final name appears only by rename of a complete file. No
  // fsync (see hicache.md, "Storage tier": a crash costs misses, never trust).
  const std::string path = PathOf(job.key);
  const std::string tmp =
      path + "." + std::to_string(::getpid()) + "." + std::to_string(temp_seq_++) + ".tmp";
  int err = fs_->WriteNewFile(tmp, pieces);
  std::string what = "writing " + tmp;
  if (err == 0) {
    err = fs_->Rename(tmp, path);
    what = "renaming " + tmp + " to " + path;
  }
  std::string log_line;
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    if (err != 0) {
      DropLocked(it);
      c.status = OnWriteErrorLocked(err, what, &log_line);
    } else {
      it->second.state = State::kStored;
      it->second.lru = lru_.insert(lru_.end(), job.key);
      stats_.bytes += file_bytes;
      stats_.files += 1;
      stats_.written_pages += job.num_pages;
      c.bytes = file_bytes;
    }
  }
  if (err != 0) fs_->Remove(tmp);
  if (!log_line.empty()) STRATA_LOG(WARN) << log_line;
  return c;
}

FileStorage::Completion FileStorage::Impl::DoRead(Job& job) {
  Completion c;
  const std::string path = PathOf(job.key);
  const uint64_t file_bytes = StorageFileBytes(opts_.namespace_id, layout_, job.num_pages);
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    if (it == entries_.end() || it->second.id != job.entry_id ||
        it->second.state != State::kStored) {  // removed by another read
      c.status = NotFound("storage run " + path + " was removed");
      return c;
    }
  }
  std::vector<uint8_t> buf;
  const int err = fs_->ReadFile(path, file_bytes + 1, &buf);  // +1: a longer file is caught too
  Status s = OkStatus();
  if (err != 0) {
    s = Status(StatusCode::kIoError, "hicache storage: reading " + path + ": " + ErrnoText(err));
  } else {
    StatusOr<StorageFileView> v = ParseStorageFile(buf, opts_.namespace_id, layout_);
    if (!v.ok()) {
      s = v.status();
    } else if (v->header.start_hash != job.key.start || v->header.end_hash != job.key.end ||
               v->header.num_pages != job.num_pages) {
      s = DataLoss("its header names another run");
    } else if (v->tokens != job.tokens) {
      s = DataLoss("its tokens differ from the prompt's (a 64-bit hash collision or a stale file)");
    } else {
      // Verified whole: only now do host pages change.
      size_t off = 0;
      for (size_t g = 0; g < layout_.groups.size(); ++g) {
        const PoolGroupSpec& spec = layout_.groups[g];
        const size_t bytes = layout_.BytesPerPagePerTensor(static_cast<int>(g));
        for (int layer = 0; layer < spec.num_layers; ++layer) {
          for (int tensor = 0; tensor < (spec.has_v ? 2 : 1); ++tensor) {
            for (int32_t page : job.pages) {
              std::memcpy(job.host.PagePtr(static_cast<int>(g), layer, tensor, page),
                          v->payload.data() + off, bytes);
              off += bytes;
            }
          }
        }
      }
      fs_->Touch(path);  // the LRU order a restart reads; failure only costs that
    }
    if (!s.ok()) {
      s = DataLoss("hicache storage: " + path + ": " + s.message() + "; removed (a miss)");
    }
  }
  std::vector<Victim> retired;
  {
    std::lock_guard l(mu_);
    auto it = entries_.find(job.key);
    const bool ours =
        it != entries_.end() && it->second.id == job.entry_id && it->second.state == State::kStored;
    if (ours) it->second.pins -= 1;
    if (s.ok()) {
      if (ours) lru_.splice(lru_.end(), lru_, it->second.lru);  // touch
      stats_.read_pages += job.num_pages;
      c.bytes = buf.size();
    } else {
      if (s.code() == StatusCode::kDataLoss) {
        stats_.errors_corrupt += 1;
      } else {
        stats_.errors_io += 1;
      }
      if (ours) retired.push_back(RetireLocked(it));
    }
  }
  if (!retired.empty()) RemoveFiles(retired);
  if (!s.ok()) STRATA_LOG(DEBUG) << s.message();
  c.status = std::move(s);
  return c;
}

// ---- Public wrappers ----

StatusOr<std::unique_ptr<FileStorage>> FileStorage::Open(const FileStorageOptions& options,
                                                         const KvLayout& layout) {
  return Open(options, layout, PosixStorageFileSystem());
}

StatusOr<std::unique_ptr<FileStorage>> FileStorage::Open(const FileStorageOptions& options,
                                                         const KvLayout& layout,
                                                         std::shared_ptr<StorageFileSystem> fs) {
  if (options.dir.empty()) {
    return InvalidArgument(
        "--hicache-storage-path is empty: give the directory for the file storage tier");
  }
  const std::string& ns = options.namespace_id;
  const bool ns_ok = !ns.empty() && ns.size() <= kMaxNamespaceBytes && ns != "." && ns != ".." &&
                     std::all_of(ns.begin(), ns.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
                     });
  if (!ns_ok) {
    return InvalidArgument("hicache storage namespace '" + ns +
                           "' must be 1-128 characters of [A-Za-z0-9._-] (it names a directory)");
  }
  if (options.io_threads < 1) {
    return InvalidArgument("hicache storage needs at least 1 I/O thread, got " +
                           std::to_string(options.io_threads));
  }
  RETURN_IF_ERROR(layout.Validate().Annotate("hicache storage layout"));
  // mkdir -p of dir, then dir/<namespace>.
  std::string prefix;
  const std::string full = options.dir + "/" + ns;
  for (size_t pos = 0; pos != std::string::npos;) {
    const size_t next = full.find('/', pos + 1);
    prefix = full.substr(0, next);
    pos = next;
    if (prefix.empty() || prefix == "/" || prefix.back() == '/') continue;
    if (const int e = fs->MakeDir(prefix); e != 0) {
      return Status(
          StatusCode::kIoError,
          "hicache storage: cannot create directory " + full +
              (prefix == full ? "" : " (at " + prefix + ")") + ": " + ErrnoText(e) +
              "; give --hicache-storage-path a directory this process can create and write");
    }
  }
  auto impl = std::make_unique<Impl>(options, layout, std::move(fs));
  RETURN_IF_ERROR(impl->Scan());
  impl->Start();
  return std::unique_ptr<FileStorage>(new FileStorage(std::move(impl)));
}

FileStorage::FileStorage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FileStorage::~FileStorage() = default;

std::vector<StorageRun> FileStorage::Match(uint64_t start_hash,
                                           std::span<const uint64_t> page_hashes) {
  return impl_->Match(start_hash, page_hashes);
}
FileStorage::Ticket FileStorage::SubmitWrite(const StorageRun& run, std::vector<int32_t> tokens,
                                             KvPoolMemory host, std::vector<int32_t> host_pages) {
  return impl_->SubmitWrite(run, std::move(tokens), std::move(host), std::move(host_pages));
}
FileStorage::Ticket FileStorage::SubmitRead(const StorageRun& run,
                                            std::vector<int32_t> expected_tokens, KvPoolMemory host,
                                            std::vector<int32_t> host_pages) {
  return impl_->SubmitRead(run, std::move(expected_tokens), std::move(host), std::move(host_pages));
}
std::vector<FileStorage::Completion> FileStorage::Poll() { return impl_->Poll(); }
bool FileStorage::WaitFor(Ticket t, std::chrono::steady_clock::time_point deadline) {
  return impl_->WaitFor(t, deadline);
}
FileStorage::Stats FileStorage::stats() const { return impl_->stats(); }
const std::string& FileStorage::path() const { return impl_->dir(); }

}  // namespace strata
