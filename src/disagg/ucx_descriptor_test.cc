#include "disagg/ucx_descriptor.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace strata::disagg {
namespace {

// `body` behind a valid frame (magic, version 2, length) and checksum.
std::string Frame(const std::string& body) {
  std::string out("STRATAKV", 8);
  auto u32 = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>(v >> (8 * k)));
  };
  u32(2);
  u32(static_cast<uint32_t>(body.size()));
  out += body;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : out) {
    h ^= c;
    h *= 1099511628211ull;
  }
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<char>(h >> (8 * k)));
  return out;
}

UcxDescriptor SampleDescriptor() {
  UcxDescriptor d;
  d.nonce = 0x0123456789abcdefull;
  d.label = "host pid 42";
  d.worker_address = std::string("\x01\x02\x00\x03worker", 10);
  d.regions = {{0x7f0000000000, 1 << 30, "rkey-0"},
               {0x7f1000000000, 4096, std::string(200, '\x07')}};
  return d;
}

TEST(UcxDescriptorTest, RoundTrips) {
  const UcxDescriptor d = SampleDescriptor();
  auto back = ParseUcxDescriptor(EncodeUcxDescriptor(d));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->nonce, d.nonce);
  EXPECT_EQ(back->label, d.label);
  EXPECT_EQ(back->worker_address, d.worker_address);
  ASSERT_EQ(back->regions.size(), 2u);
  EXPECT_EQ(back->regions[1].length, 4096u);
  EXPECT_EQ(back->regions[1].rkey, d.regions[1].rkey);
}

// A descriptor of version 1 (a build whose Connect read a probe region)
// is refused, naming both versions, before anything else is read.
TEST(UcxDescriptorTest, AnOlderVersionIsRefusedNamingBoth) {
  std::string bytes = EncodeUcxDescriptor(SampleDescriptor());
  bytes[8] = 1;
  auto r = ParseUcxDescriptor(bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("version 1, this build reads version 2"), std::string::npos)
      << r.status().ToString();
}

void ExpectRejected(const std::string& bytes, const std::string& what) {
  auto r = ParseUcxDescriptor(bytes);
  ASSERT_FALSE(r.ok()) << what;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
  EXPECT_NE(r.status().message().find("KV transport descriptor: "), std::string::npos) << what;
}

TEST(UcxDescriptorTest, RejectsEveryTruncationAndByteFlip) {
  const std::string good = EncodeUcxDescriptor(SampleDescriptor());
  for (size_t n = 0; n < good.size(); ++n)
    ExpectRejected(good.substr(0, n), "truncated to " + std::to_string(n));
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit : {0, 7}) {
      std::string b = good;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      ExpectRejected(b,
                     "bit " + std::to_string(bit) + " of byte " + std::to_string(i) + " flipped");
    }
  }
  ExpectRejected(good + '\0', "one byte appended");
}

TEST(UcxDescriptorTest, RejectsGarbageThatPassesTheFrame) {
  // Random bodies behind a valid frame and checksum: only the body parser
  // stands between them and UCX.
  std::mt19937 rng(11);
  int accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string body(rng() % 200, '\0');
    for (char& c : body) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 8);
    auto r = ParseUcxDescriptor(Frame(body));
    if (r.ok()) {
      ++accepted;  // only structurally valid bodies parse
      EXPECT_FALSE(r->worker_address.empty());
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_LT(accepted, 50);
  // Plain random bytes.
  for (int i = 0; i < 5000; ++i) {
    std::string s(rng() % 300, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    ExpectRejected(s, "random bytes");
  }
}

TEST(UcxDescriptorTest, RejectsAHugeLengthBehindAValidFrame) {
  // nonce, then a label claiming 4 GiB: refused without allocating it.
  std::string body(8, '\0');
  body += std::string("\xf0\xff\xff\xff", 4);
  auto r = ParseUcxDescriptor(Frame(body));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("label claims 4294967280 bytes"), std::string::npos)
      << r.status().message();
  // A valid descriptor without regions is fine (a sender's own descriptor).
  UcxDescriptor d = SampleDescriptor();
  d.regions.clear();
  EXPECT_TRUE(ParseUcxDescriptor(EncodeUcxDescriptor(d)).ok());
}

}  // namespace
}  // namespace strata::disagg
