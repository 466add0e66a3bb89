// The `file` storage tier's on-disk format: byte order, checksum, header,
// file names. Pure functions, no I/O (see storage_format.h).
#include "cache/storage_format.h"

#include <cstring>

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

std::vector<uint8_t> EncodeStorageTrailer(uint64_t checksum) {
  std::vector<uint8_t> out;
  PutU64(out, checksum);
  return out;
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
  if (ns_len > kMaxStorageNamespaceBytes || kFixedHeaderBytes + ns_len > bytes.size()) {
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

}  // namespace strata
