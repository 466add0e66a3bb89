#include "disagg/ucx_descriptor.h"

#include <cstring>

namespace strata::disagg {

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'K', 'V'};
constexpr uint32_t kVersion = 2;
constexpr size_t kFrameBytes = 8 + 4 + 4 + 8;  // magic, version, body length, checksum
// A worker address or a packed rkey is tens to a few hundred bytes; the
// bounds only keep a corrupt length from allocating gigabytes.
constexpr uint32_t kMaxField = 1 << 20;
constexpr uint32_t kMaxRegions = 1 << 16;

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutStr(std::string* out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
void PutRegion(std::string* out, const UcxRemoteRegion& r) {
  PutU64(out, r.base);
  PutU64(out, r.length);
  PutStr(out, r.rkey);
}

uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

Status DescriptorError(const std::string& what) {
  return InvalidArgument("KV transport descriptor: " + what +
                         " (expected the bytes of UcxTransport::LocalDescriptor from a Strata "
                         "server of the same version)");
}

// Bounds-checked reads over the body; the first failure sticks.
class Reader {
 public:
  Reader(std::string_view in, size_t base) : in_(in), base_(base) {}

  bool U32(uint32_t* v, const char* what) {
    if (!Need(4, what)) return false;
    *v = LoadU32(in_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v, const char* what) {
    if (!Need(8, what)) return false;
    *v = LoadU64(in_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool Str(std::string* s, const char* what) {
    uint32_t n = 0;
    if (!U32(&n, what)) return false;
    if (n > kMaxField) {
      Fail(std::string(what) + " claims " + std::to_string(n) + " bytes (at most " +
           std::to_string(kMaxField) + ")");
      return false;
    }
    if (!Need(n, what)) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Region(UcxRemoteRegion* r, const std::string& what) {
    if (!U64(&r->base, what.c_str()) || !U64(&r->length, what.c_str()) ||
        !Str(&r->rkey, what.c_str())) {
      return false;
    }
    if (r->base + r->length < r->base) {
      Fail(what + " [" + std::to_string(r->base) + ", +" + std::to_string(r->length) +
           ") wraps around the address space");
      return false;
    }
    if (r->rkey.empty()) {
      Fail(what + " has an empty remote key");
      return false;
    }
    return true;
  }
  void Fail(const std::string& what) {
    if (error_.ok()) error_ = DescriptorError(what + " at byte " + std::to_string(base_ + pos_));
  }
  bool at_end() const { return pos_ == in_.size(); }
  const Status& error() const { return error_; }

 private:
  bool Need(size_t n, const char* what) {
    if (in_.size() - pos_ < n) {
      Fail(std::string("truncated reading ") + what);
      return false;
    }
    return true;
  }
  std::string_view in_;
  size_t base_;  // offset of in_ in the whole descriptor, for messages
  size_t pos_ = 0;
  Status error_;
};

}  // namespace

std::string EncodeUcxDescriptor(const UcxDescriptor& d) {
  std::string body;
  PutU64(&body, d.nonce);
  PutStr(&body, d.label);
  PutStr(&body, d.worker_address);
  PutU32(&body, static_cast<uint32_t>(d.regions.size()));
  for (const UcxRemoteRegion& r : d.regions) PutRegion(&body, r);
  std::string out(kMagic, sizeof(kMagic));
  PutU32(&out, kVersion);
  PutU32(&out, static_cast<uint32_t>(body.size()));
  out += body;
  PutU64(&out, Fnv1a(out));
  return out;
}

StatusOr<UcxDescriptor> ParseUcxDescriptor(std::string_view bytes) {
  if (bytes.size() < kFrameBytes) {
    return DescriptorError(std::to_string(bytes.size()) + " bytes, shorter than the " +
                           std::to_string(kFrameBytes) + "-byte frame");
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DescriptorError("does not start with \"STRATAKV\"");
  }
  const uint32_t version = LoadU32(bytes.data() + 8);
  if (version != kVersion) {
    return DescriptorError("version " + std::to_string(version) + ", this build reads version " +
                           std::to_string(kVersion));
  }
  const uint32_t body_len = LoadU32(bytes.data() + 12);
  if (body_len != bytes.size() - kFrameBytes) {
    return DescriptorError("body of " + std::to_string(body_len) + " bytes announced, " +
                           std::to_string(bytes.size() - kFrameBytes) + " present (truncated?)");
  }
  const size_t sum_at = bytes.size() - 8;
  if (Fnv1a(bytes.substr(0, sum_at)) != LoadU64(bytes.data() + sum_at)) {
    return DescriptorError("checksum mismatch (corrupted or truncated in transit)");
  }
  UcxDescriptor d;
  Reader r(bytes.substr(16, body_len), 16);
  uint32_t n = 0;
  if (r.U64(&d.nonce, "nonce") && r.Str(&d.label, "label") &&
      r.Str(&d.worker_address, "worker address") &&
      r.U32(&n, "region count")) {
    if (d.worker_address.empty()) r.Fail("empty worker address");
    if (n > kMaxRegions)
      r.Fail("region count " + std::to_string(n) + " over " + std::to_string(kMaxRegions));
    for (uint32_t i = 0; r.error().ok() && i < n; ++i) {
      d.regions.emplace_back();
      r.Region(&d.regions.back(), "region " + std::to_string(i));
    }
    if (r.error().ok() && !r.at_end()) r.Fail("trailing bytes");
  }
  if (!r.error().ok()) return r.error();
  return d;
}

}  // namespace strata::disagg
