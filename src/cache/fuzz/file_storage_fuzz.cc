// Fuzz target: one storage file's bytes (header, tokens, payload, checksum)
// through ParseStorageHeader and ParseStorageFile, against each of two
// layouts, as read and again with both checksums recomputed (so mutations
// reach the checks behind them), plus the file-name parser.
// Checks: every error is DataLoss with a message; a file accepted is exactly
// what EncodeStorageFile writes for its header, tokens and payload (no byte
// of it unchecked); the header parser agrees with the file parser.
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "cache/storage_format.h"
#include "cache/fuzz/cache_fuzz.h"

namespace strata::fuzz {

namespace {

PoolGroupSpec Group(const char* name, int layers, int heads, int dim, DType dtype, bool has_v) {
  PoolGroupSpec g;
  g.name = name;
  g.num_layers = layers;
  g.num_kv_heads = heads;
  g.head_dim = dim;
  g.dtype = dtype;
  g.has_v = has_v;
  return g;
}

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void CheckOne(std::span<const uint8_t> bytes, const FuzzStorageLayout& l) {
  StatusOr<StorageFileHeader> h = ParseStorageHeader(bytes, l.ns, l.layout);
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == StatusCode::kDataLoss);
    FUZZ_CHECK(!h.status().message().empty());
  } else {
    FUZZ_CHECK(h->num_pages >= 1 && h->num_pages <= kMaxStoragePagesPerFile);
    FUZZ_CHECK(h->header_bytes == StorageHeaderBytes(l.ns, l.layout));
    FUZZ_CHECK(h->header_bytes <= bytes.size());
    FUZZ_CHECK(h->file_bytes == StorageFileBytes(l.ns, l.layout, h->num_pages));
  }
  StatusOr<StorageFileView> v = ParseStorageFile(bytes, l.ns, l.layout);
  if (!v.ok()) {
    FUZZ_CHECK(v.status().code() == StatusCode::kDataLoss);
    FUZZ_CHECK(!v.status().message().empty());
    return;
  }
  FUZZ_CHECK(h.ok());
  FUZZ_CHECK(v->header.start_hash == h->start_hash && v->header.end_hash == h->end_hash);
  FUZZ_CHECK(v->header.file_bytes == bytes.size());
  FUZZ_CHECK(v->tokens.size() == static_cast<size_t>(v->header.num_pages) * l.layout.page_size);
  FUZZ_CHECK(v->payload.data() >= bytes.data() &&
             v->payload.data() + v->payload.size() <= bytes.data() + bytes.size());
  FUZZ_CHECK(v->payload.size() ==
             static_cast<size_t>(v->header.num_pages) * l.layout.BytesPerPage());
  const std::vector<uint8_t> again = EncodeStorageFile(
      l.ns, l.layout, {v->header.start_hash, v->header.end_hash, v->header.num_pages}, v->tokens,
      v->payload);
  FUZZ_CHECK(again.size() == bytes.size() &&
             std::memcmp(again.data(), bytes.data(), bytes.size()) == 0);
}

}  // namespace

const FuzzStorageLayout& FileStorageFuzzLayout(int i) {
  static const FuzzStorageLayout kLayouts[2] = {
      {"fuzz-a",
       [] {
         KvLayout l;
         l.page_size = 4;
         l.groups = {Group("full_attention", 2, 2, 8, DType::kBF16, true)};
         return l;
       }()},
      {"fuzz-b",
       [] {
         KvLayout l;
         l.page_size = 2;
         l.groups = {Group("full_attention", 2, 1, 4, DType::kF32, true),
                     Group("latent", 1, 1, 8, DType::kF16, false)};
         return l;
       }()},
  };
  return kLayouts[i];
}

int FileStorageOneInput(const uint8_t* data, size_t size) {
  // libFuzzer passes a heap copy of exactly `size` bytes, so ASan reports any
  // read past the end.
  const std::span<const uint8_t> bytes(data, size);
  for (int i = 0; i < 2; ++i) {
    const FuzzStorageLayout& l = FileStorageFuzzLayout(i);
    CheckOne(bytes, l);
    // The same bytes with the header checksum and the trailing checksum made
    // right, so that a mutation of a field or the size is judged by the
    // checks after them rather than only by a checksum mismatch.
    const uint64_t hb = StorageHeaderBytes(l.ns, l.layout);
    if (size >= hb) {
      std::vector<uint8_t> fixed(data, data + size);
      PutU64(fixed.data() + hb - 8, StorageChecksumOf(std::span(fixed).first(hb - 8)));
      if (size >= hb + 8) {
        PutU64(fixed.data() + size - 8, StorageChecksumOf(std::span(fixed).first(size - 8)));
      }
      CheckOne(fixed, l);
    }
  }
  // The first bytes as a file name: only canonical names parse.
  const std::string_view name(reinterpret_cast<const char*>(data), size < 36 ? size : 36);
  uint64_t start = 0, end = 0;
  if (ParseStorageFileName(name, &start, &end)) FUZZ_CHECK(StorageFileName(start, end) == name);
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(FileStorageOneInput)
