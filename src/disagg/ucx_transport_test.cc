// UcxTransport against real UCX (no mocks): two transports in this process
// (sender and receiver, each with its own UCP context and worker), and, for
// peer death, a receiver in a child process (this binary re-executed) that
// is killed with SIGKILL.
//
// Every suite runs per UCX_TLS value (UcxTransportOptions::tls, the same
// setting as the environment variable): tcp and, on one host, shared memory
// (shm = posix + sysv + cma, or posix,cma / sysv alone). Every value here
// must work; UCX_TLS=cma alone must be refused with the fix.
#include "disagg/ucx_transport.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "disagg/page_ops.h"
#include "util/stop_process.h"

namespace strata::disagg {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr char kTlsValues[][16] = {"tcp", "tcp,cma", "all", "shm", "sm", "posix,cma", "sysv"};
// UcxTransportTest runs these too: "+messages" forces the transport's own
// active messages (UcxTransportOptions::Writes::kMessages), which tcp gets
// by default, over shared memory as well.
constexpr char kForcedMessages[][24] = {"shm+messages", "posix,cma+messages"};

// UcxTransportOptions for a test parameter: UCX_TLS, and "+messages".
UcxTransportOptions OptionsFor(const std::string& param) {
  UcxTransportOptions opt;
  opt.tls = param;
  if (const size_t plus = param.find("+messages"); plus != std::string::npos) {
    opt.tls = param.substr(0, plus);
    opt.writes = UcxTransportOptions::Writes::kMessages;
  }
  return opt;
}

// Whether writes of this parameter go as the transport's own messages.
bool ByMessages(const std::string& param) {
  return param.rfind("tcp", 0) == 0 || param.find("+messages") != std::string::npos;
}

std::string TestName(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), ',', '_');
  std::replace(s.begin(), s.end(), '+', '_');
  return s;
}

uint64_t Fnv(const char* p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

void FillRandom(std::vector<char>* v, uint32_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= v->size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(v->data() + i, &x, 8);
  }
  for (; i < v->size(); ++i) (*v)[i] = static_cast<char>(rng());
}

// Counts calls of each batch's `done`, so "exactly once" is checkable.
class Completions {
 public:
  explicit Completions(size_t n) : calls_(n, 0), status_(n) {}

  std::function<void(Status)> Callback(size_t i) {
    return [this, i](Status st) {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_[i];
      status_[i] = st;
      thread_ = std::this_thread::get_id();
      cv_.notify_all();
    };
  }
  // True when every batch completed within `timeout`.
  bool WaitAll(Clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      return std::all_of(calls_.begin(), calls_.end(), [](int c) { return c > 0; });
    });
  }
  int calls(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[i];
  }
  Status status(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return status_[i];
  }
  std::thread::id thread() {
    std::lock_guard<std::mutex> lock(mu_);
    return thread_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> calls_;
  std::vector<Status> status_;
  std::thread::id thread_;
};

// Writes `ops` and waits; the batch's final status.
Status WriteAndWait(KvTransport& t, PeerId peer, std::span<const WriteOp> ops) {
  Completions c(1);
  Status st = t.Write(peer, ops, c.Callback(0));
  if (!st.ok()) return st;
  if (!c.WaitAll(seconds(60))) return Internal("write did not complete within 60 s");
  return c.status(0);
}

// Applies ops to a byte image: what the receiver's memory must look like.
void Apply(std::span<const WriteOp> ops, const std::vector<char>& src, std::vector<char>* dst) {
  for (const WriteOp& op : ops)
    std::memcpy(dst->data() + op.dst_offset, src.data() + op.src_offset, op.length);
}

// First mismatching byte, or -1.
int64_t FirstDiff(const std::vector<char>& a, const std::vector<char>& b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin());
  return ia == a.end() ? -1 : ia - a.begin();
}

class UcxTransportTest : public testing::TestWithParam<std::string> {
 protected:
  static constexpr size_t kRegion = 8 << 20;

  void SetUp() override {
    const UcxTransportOptions opt = OptionsFor(GetParam());
    auto s = UcxTransport::Create(opt);
    auto r = UcxTransport::Create(opt);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    sender_ = std::move(s).value();
    receiver_ = std::move(r).value();
    src_.resize(kRegion);
    FillRandom(&src_, 1);
    dst_.assign(kRegion, static_cast<char>(0xEE));
    ASSERT_EQ(*sender_->RegisterRegion(src_.data(), src_.size()), 0);
    ASSERT_EQ(*receiver_->RegisterRegion(dst_.data(), dst_.size()), 0);
    auto desc = receiver_->LocalDescriptor();
    ASSERT_TRUE(desc.ok());
    descriptor_ = *desc;
    auto peer = sender_->Connect(descriptor_);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString() << "; offered: " << sender_->resources();
    peer_ = *peer;
  }

  std::vector<char> src_, dst_;                      // outlive the transports
  std::unique_ptr<UcxTransport> receiver_, sender_;  // the sender goes first
  std::string descriptor_;
  PeerId peer_ = 0;
};

TEST_P(UcxTransportTest, WritesLandExactlyAndNothingElseChanges) {
  std::vector<char> want = dst_;
  // Odd sizes and offsets, one byte, a page, across the region's end.
  const std::vector<WriteOp> ops = {
      {0, 0, 0, 0, 1},
      {0, 4096, 0, 12345, 4096},
      {0, 1000003, 0, 2000001, 77777},
      {0, kRegion - 3333, 0, kRegion - 3333, 3333},
      {0, 17, 0, 5000000, 0},  // zero length: allowed, moves nothing
  };
  Apply(ops, src_, &want);
  ASSERT_TRUE(WriteAndWait(*sender_, peer_, ops).ok());
  EXPECT_EQ(FirstDiff(dst_, want), -1);
  const TransportStats st = sender_->stats();
  EXPECT_EQ(st.writes_ok, 1u);
  EXPECT_EQ(st.bytes_written, 1u + 4096 + 77777 + 3333);
  EXPECT_EQ(st.bytes_by_messages, ByMessages(GetParam()) ? st.bytes_written : 0u)
      << "tcp (and +messages) write by the transport's own messages, the rest by UCX's puts";
  EXPECT_EQ(st.peers, 1);
  // Which transport UCX picked (ucp_ep_print_info's lane lines).
  const std::string info = sender_->PeerInfo(peer_);
  EXPECT_NE(info.find("lane["), std::string::npos) << info;
  for (size_t pos = info.find("lane["); pos != std::string::npos;
       pos = info.find("lane[", pos + 1)) {
    std::printf("[ info     ] UCX_TLS=%s: %s\n", GetParam().c_str(),
                info.substr(pos, info.find('\n', pos) - pos).c_str());
  }
}

TEST_P(UcxTransportTest, ManyBatchesOfPagesInFlight) {
  // Pages of a small two-group layout, like a prefill's chunks.
  KvLayout layout;
  layout.page_size = 16;
  layout.groups.push_back({"full", 4, 2, 64, DType::kBF16, true, 0});
  layout.groups.push_back({"latent", 2, 1, 32, DType::kF32, false, 0});
  // Both pools live in the one registered region per side: two groups
  // need two regions, so register each group's slice as its own region.
  const int64_t src_pages = 64, dst_pages = 220;
  const size_t s0 = layout.BytesPerPage(0) * src_pages, d0 = layout.BytesPerPage(0) * dst_pages;
  const size_t s1 = layout.BytesPerPage(1) * src_pages, d1 = layout.BytesPerPage(1) * dst_pages;
  ASSERT_LE(s0 + s1, kRegion);
  ASSERT_LE(d0 + d1, kRegion);
  ASSERT_EQ(*sender_->RegisterRegion(src_.data(), s0), 1);
  ASSERT_EQ(*sender_->RegisterRegion(src_.data() + s0, s1), 2);
  ASSERT_EQ(*receiver_->RegisterRegion(dst_.data(), d0), 1);
  ASSERT_EQ(*receiver_->RegisterRegion(dst_.data() + d0, d1), 2);
  // The descriptor now has the new regions: connect again.
  auto peer = sender_->Connect(*receiver_->LocalDescriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  std::mt19937 rng(3);
  std::vector<int32_t> dst_ids(dst_pages);
  std::iota(dst_ids.begin(), dst_ids.end(), 0);
  std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
  std::vector<char> want = dst_;
  constexpr int kBatches = 100;
  Completions c(kBatches);
  int used = 0;
  for (int b = 0; b < kBatches; ++b) {
    // Each batch: 1-3 consecutive source pages into destination pages no
    // other batch writes (batches in flight are not ordered), while they
    // last.
    const int n = 1 + static_cast<int>(rng() % 3);
    std::vector<int32_t> sp, dp;
    const int32_t first = static_cast<int32_t>(rng() % (src_pages - n));
    for (int i = 0; i < n && used < dst_pages; ++i) {
      sp.push_back(first + i);
      dp.push_back(dst_ids[used++]);
    }
    auto ops = PageWriteOps(layout, {src_pages, 1}, {dst_pages, 1}, sp, dp);
    ASSERT_TRUE(ops.ok()) << ops.status().ToString();
    for (const WriteOp& op : *ops) {
      const size_t sbase = op.src_region == 1 ? 0 : s0, dbase = op.dst_region == 1 ? 0 : d0;
      std::memcpy(want.data() + dbase + op.dst_offset, src_.data() + sbase + op.src_offset,
                  op.length);
    }
    ASSERT_TRUE(sender_->Write(*peer, *ops, c.Callback(b)).ok());
  }
  ASSERT_TRUE(c.WaitAll(seconds(60)));
  for (int b = 0; b < kBatches; ++b) {
    EXPECT_EQ(c.calls(b), 1) << "batch " << b;
    EXPECT_TRUE(c.status(b).ok()) << "batch " << b << ": " << c.status(b).ToString();
  }
  EXPECT_NE(c.thread(), std::this_thread::get_id());
  EXPECT_EQ(FirstDiff(dst_, want), -1);
}

TEST_P(UcxTransportTest, LargeWrite64MiB) {
  constexpr size_t kBig = 64 << 20;
  std::vector<char> src(kBig), dst(kBig + 8192, static_cast<char>(0x5A));
  FillRandom(&src, 9);
  const RegionId s = *sender_->RegisterRegion(src.data(), src.size());
  const RegionId d = *receiver_->RegisterRegion(dst.data(), dst.size());
  auto peer = sender_->Connect(*receiver_->LocalDescriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const WriteOp op{s, 0, d, 4096, kBig};
  ASSERT_TRUE(WriteAndWait(*sender_, *peer, std::span<const WriteOp>(&op, 1)).ok());
  EXPECT_EQ(std::memcmp(dst.data() + 4096, src.data(), kBig), 0);
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + 4096, [](char c) { return c == 0x5A; }));
  EXPECT_TRUE(std::all_of(dst.end() - 4096, dst.end(), [](char c) { return c == 0x5A; }));
}

TEST_P(UcxTransportTest, CompletionMayWriteAgain) {
  // A completion chains the next write (allowed by the contract); the
  // chain of 20 ends with every piece landed.
  std::vector<char> want = dst_;
  std::vector<WriteOp> ops;
  for (int i = 0; i < 20; ++i)
    ops.push_back({0, uint64_t(i) * 65536, 0, uint64_t(i) * 65536 + 7, 65536});
  Apply(ops, src_, &want);
  Completions last(1);
  std::function<void(size_t, Status)> next = [&](size_t i, Status st) {
    if (!st.ok() || i + 1 == ops.size()) return last.Callback(0)(st);
    Status w = sender_->Write(peer_, std::span<const WriteOp>(&ops[i + 1], 1),
                              [&, i](Status s) { next(i + 1, s); });
    if (!w.ok()) last.Callback(0)(w);
  };
  ASSERT_TRUE(
      sender_->Write(peer_, std::span<const WriteOp>(&ops[0], 1), [&](Status s) { next(0, s); })
          .ok());
  ASSERT_TRUE(last.WaitAll(seconds(60)));
  ASSERT_TRUE(last.status(0).ok()) << last.status(0).ToString();
  EXPECT_EQ(FirstDiff(dst_, want), -1);
}

TEST_P(UcxTransportTest, DisconnectWhileWritesInFlightCompletesEachOnce) {
  constexpr int kBatches = 64;
  Completions c(kBatches);
  for (int b = 0; b < kBatches; ++b) {
    const WriteOp op{0, 0, 0, uint64_t(b % 8) * (1 << 20), 1 << 20};
    ASSERT_TRUE(sender_->Write(peer_, std::span<const WriteOp>(&op, 1), c.Callback(b)).ok());
  }
  sender_->Disconnect(peer_);
  // Disconnect returned: every batch has ended, none runs later.
  int aborted = 0;
  for (int b = 0; b < kBatches; ++b) {
    ASSERT_EQ(c.calls(b), 1) << "batch " << b;
    const Status st = c.status(b);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
      EXPECT_EQ(st.message(), "disconnected");
      ++aborted;
    }
  }
  std::this_thread::sleep_for(milliseconds(300));
  for (int b = 0; b < kBatches; ++b) EXPECT_EQ(c.calls(b), 1) << "batch " << b;
  std::printf("[ info     ] %d of %d batches were cancelled by Disconnect\n", aborted, kBatches);

  // The peer is gone for Write; Disconnect again is a no-op; a new Connect
  // to the same receiver works.
  const WriteOp op{0, 0, 0, 0, 16};
  bool called = false;
  const Status st =
      sender_->Write(peer_, std::span<const WriteOp>(&op, 1), [&](Status) { called = true; });
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  sender_->Disconnect(peer_);
  EXPECT_EQ(sender_->stats().peers, 0);
  auto again = sender_->Connect(descriptor_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(*again, peer_);
  EXPECT_TRUE(WriteAndWait(*sender_, *again, std::span<const WriteOp>(&op, 1)).ok());
  EXPECT_FALSE(called);
}

TEST_P(UcxTransportTest, DisconnectFromACompletionEndsTheRestOnce) {
  // The first batch's completion gives the peer up (what a caller does on
  // a transfer error): it cannot wait there, and the other batches still
  // end exactly once each.
  constexpr int kBatches = 32;
  Completions c(kBatches);
  std::atomic<bool> disconnected{false};
  for (int b = 0; b < kBatches; ++b) {
    const WriteOp op{0, 0, 0, uint64_t(b % 8) * (1 << 20), 1 << 20};
    auto cb = c.Callback(b);
    std::function<void(Status)> done = cb;
    if (b == 0) {
      done = [this, cb, &disconnected](Status st) {
        sender_->Disconnect(peer_);
        disconnected = true;
        cb(st);
      };
    }
    const Status st = sender_->Write(peer_, std::span<const WriteOp>(&op, 1), done);
    if (!st.ok()) {
      // Batch 0 may finish (and give the peer up) while we still post.
      ASSERT_TRUE(disconnected) << st.ToString();
      ASSERT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
      cb(st);  // never posted: count it here, so "once each" still holds
    }
  }
  ASSERT_TRUE(c.WaitAll(seconds(60)));
  std::this_thread::sleep_for(milliseconds(200));
  for (int b = 0; b < kBatches; ++b) {
    EXPECT_EQ(c.calls(b), 1) << "batch " << b;
    const Status st = c.status(b);
    EXPECT_TRUE(st.ok() || st.code() == StatusCode::kAborted || st.code() == StatusCode::kNotFound)
        << st.ToString();
  }
  EXPECT_EQ(sender_->stats().peers, 0);
}

TEST_P(UcxTransportTest, OpOutsideARegionIsRefusedBeforePosting) {
  bool called = false;
  auto done = [&](Status) { called = true; };
  const std::vector<std::pair<WriteOp, const char*>> bad = {
      {{0, kRegion - 10, 0, 0, 11}, "outside local region 0"},
      {{0, 0, 0, kRegion, 1}, "outside region 0 of peer"},
      {{0, 0, 0, 1, kRegion}, "outside region 0 of peer"},
      {{0, ~uint64_t{0} - 2, 0, 0, 8}, "outside local region 0"},  // offset + length wraps
      {{3, 0, 0, 0, 8}, "no local region 3"},
      {{0, 0, 7, 0, 8}, "no region 7 at peer"},
      {{-1, 0, 0, 0, 8}, "no local region -1"},
  };
  for (const auto& [op, what] : bad) {
    // The bad op second: the whole batch is refused, nothing is posted.
    const std::vector<WriteOp> ops = {{0, 0, 0, 0, 8}, op};
    const Status st = sender_->Write(peer_, ops, done);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("KV write op 1: "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  }
  const Status st = sender_->Write(peer_ + 100, {}, done);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(called);
  EXPECT_EQ(dst_[0], static_cast<char>(0xEE));  // the good first op never went
  EXPECT_EQ(sender_->stats().writes_ok + sender_->stats().writes_failed, 0u);
}

TEST_P(UcxTransportTest, BadDescriptorIsInvalidArgument) {
  for (const std::string& bad :
       {std::string(), std::string("garbage"), descriptor_.substr(0, descriptor_.size() / 2),
        descriptor_ + "x"}) {
    auto peer = sender_->Connect(bad);
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), StatusCode::kInvalidArgument) << peer.status().ToString();
    EXPECT_NE(peer.status().message().find("KV transport descriptor"), std::string::npos);
  }
  EXPECT_EQ(sender_->stats().peers, 1);
}

std::vector<std::string> TlsAndForcedMessages() {
  std::vector<std::string> v(std::begin(kTlsValues), std::end(kTlsValues));
  v.insert(v.end(), std::begin(kForcedMessages), std::end(kForcedMessages));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest, testing::ValuesIn(TlsAndForcedMessages()),
                         TestName);

// A write by messages is checked by the receiver against its own regions,
// never trusted: one into a region the receiver freed after exporting its
// descriptor (which the sender cannot know) is refused, named as such, and
// nothing is written; the next write into a live region lands.
class RefusedWriteTest : public testing::TestWithParam<std::string> {};

TEST_P(RefusedWriteTest, AWriteIntoAFreedRegionIsRefusedAndTheNextLands) {
  const UcxTransportOptions opt = OptionsFor(GetParam());
  auto r = UcxTransport::Create(opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  UcxTransport& receiver = **r;
  std::vector<char> live(1 << 20, static_cast<char>(0xEE));
  auto gone = receiver.AllocateRegion(1 << 20);
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  ASSERT_EQ(*receiver.RegisterRegion(live.data(), live.size()), 1);
  auto desc = receiver.LocalDescriptor();
  ASSERT_TRUE(desc.ok());
  receiver.FreeRegion(gone->id);
  std::vector<char> src(1 << 20);
  FillRandom(&src, 5);
  // Not mapped here (direct copies would not ask the receiver).
  UcxTransportOptions no_direct = opt;
  no_direct.direct_copy = false;
  auto s2 = UcxTransport::Create(no_direct);
  ASSERT_TRUE(s2.ok());
  ASSERT_EQ(*(*s2)->RegisterRegion(src.data(), src.size()), 0);
  auto peer = (*s2)->Connect(*desc);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  // Two pieces (over kAmPiece), both refused.
  const std::vector<WriteOp> bad = {{0, 0, 0, 100, 700000}};
  const Status st = WriteAndWait(**s2, *peer, bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("refused a write: region 0 was freed"), std::string::npos)
      << st.ToString();
  std::vector<char> want(live.size(), static_cast<char>(0xEE));
  EXPECT_EQ(FirstDiff(live, want), -1) << "the live region is untouched";
  const std::vector<WriteOp> good = {{0, 0, 1, 0, 4096}, {0, 8192, 1, 600000, 400000}};
  Apply(good, src, &want);
  ASSERT_TRUE(WriteAndWait(**s2, *peer, good).ok());
  EXPECT_EQ(FirstDiff(live, want), -1);
  const TransportStats stats = (*s2)->stats();
  EXPECT_EQ(stats.writes_failed, 1u);
  EXPECT_EQ(stats.bytes_by_messages, 4096u + 400000u);
}

// The receiver's WriteGuard sees each write by messages with the key of
// the descriptor it came through, and a refusal ends the batch naming the
// guard's reason with nothing written.
TEST_P(RefusedWriteTest, TheWriteGuardSeesTheKeyAndItsRefusalLandsNothing) {
  const UcxTransportOptions opt = OptionsFor(GetParam());
  auto r = UcxTransport::Create(opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  UcxTransport& receiver = **r;
  std::vector<char> dst(1 << 20, static_cast<char>(0xEE));
  ASSERT_EQ(*receiver.RegisterRegion(dst.data(), dst.size()), 0);
  std::mutex mu;
  std::vector<std::string> keys;
  receiver.SetWriteGuard(
      [&](const std::string& key, RegionId region, uint64_t offset, uint64_t length) {
        std::lock_guard<std::mutex> lock(mu);
        keys.push_back(key);
        if (key == "room-holder" && region == 0 && offset + length <= 65536) return std::string();
        return "bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
               ") belong to no room of " + (key.empty() ? "the shared descriptor" : key);
      });
  std::vector<char> src(1 << 20);
  FillRandom(&src, 8);
  auto s = UcxTransport::Create(opt);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(*(*s)->RegisterRegion(src.data(), src.size()), 0);
  auto own = (*s)->Connect(*receiver.LocalDescriptorFor("room-holder"));
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  std::vector<char> want = dst;
  const std::vector<WriteOp> allowed = {{0, 100, 0, 0, 65536}};
  Apply(allowed, src, &want);
  ASSERT_TRUE(WriteAndWait(**s, *own, allowed).ok());
  EXPECT_EQ(FirstDiff(dst, want), -1);
  const std::vector<WriteOp> outside = {{0, 0, 0, 65536, 4096}};
  Status st = WriteAndWait(**s, *own, outside);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("refused a write: bytes [65536, +4096) belong to no room of "
                              "room-holder"),
            std::string::npos)
      << st.ToString();
  auto shared = (*s)->Connect(*receiver.LocalDescriptor());
  ASSERT_TRUE(shared.ok());
  st = WriteAndWait(**s, *shared, allowed);
  EXPECT_NE(st.message().find("belong to no room of the shared descriptor"), std::string::npos)
      << st.ToString();
  EXPECT_EQ(FirstDiff(dst, want), -1) << "a refused write landed";
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(keys, (std::vector<std::string>{"room-holder", "room-holder", ""}));
}

// Over tcp only: over shared memory a freed region's key cannot even be
// unpacked (its segment is gone), so Connect fails first.
INSTANTIATE_TEST_SUITE_P(Tls, RefusedWriteTest, testing::Values("tcp", "tcp,cma"), TestName);

// cma alone moves bytes but has no active messages, which UCX needs to set
// an endpoint up: refused at Connect with the values that work.
TEST(UcxTransportTlsTest, CmaAloneIsRefusedAtConnectWithTheFix) {
  UcxTransportOptions opt;
  opt.tls = "cma";
  auto s = UcxTransport::Create(opt);
  auto r = UcxTransport::Create(opt);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<char> dst(4096);
  ASSERT_TRUE((*r)->RegisterRegion(dst.data(), dst.size()).ok());
  auto peer = (*s)->Connect(*(*r)->LocalDescriptor());
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(peer.status().message().find("cma alone has no active messages"), std::string::npos)
      << peer.status().ToString();
  EXPECT_NE(peer.status().message().find("shm / posix,cma (one host)"), std::string::npos)
      << peer.status().ToString();
}

TEST(CreateKvTransportTest, KnowsUcxAndNamesTheKnownBackends) {
  auto t = CreateKvTransport({"ucx"});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->name(), "ucx");
  auto bad = CreateKvTransport({"nixl"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"nixl\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("known: ucx"), std::string::npos);
}

// ---- memory the transport allocates (AllocateRegion) ---------------------

// UCX_TLS values whose memory UCX allocates in shared memory (UCX_ALLOC_PRIO
// starts with sysv, then posix), so a sender on this host maps it.
bool AllocatesSharedMemory(const std::string& tls) { return tls != "tcp" && tls != "tcp,cma"; }

class AllocatedRegionTest : public testing::TestWithParam<std::string> {};

TEST_P(AllocatedRegionTest, WritesLandInItCopiedDirectlyOverSharedMemoryAndItFrees) {
  constexpr size_t kBytes = 8 << 20;
  UcxTransportOptions opt;
  opt.tls = GetParam();
  auto r = UcxTransport::Create(opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  UcxTransport& receiver = **r;
  auto a = receiver.AllocateRegion(kBytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->id, 0);
  EXPECT_GE(a->length, kBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->base) % 64, 0u);
  // Registering exactly it gives its id back (PdRole registers every pool
  // group, wherever its memory came from).
  EXPECT_EQ(*receiver.RegisterRegion(a->base, a->length), a->id);
  const std::string memory = receiver.RegionMemory(a->id);
  std::printf("[ info     ] UCX_TLS=%s: region in %s\n", GetParam().c_str(), memory.c_str());
  EXPECT_NE(memory.find("(allocated by ucx)"), std::string::npos) << memory;
  if (AllocatesSharedMemory(GetParam())) {
    EXPECT_NE(memory.find("shared memory"), std::string::npos) << memory;
  }
  char* dst = static_cast<char*>(a->base);
  std::memset(dst, 0xEE, kBytes);
  auto desc = receiver.LocalDescriptor();
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();

  std::vector<char> src(kBytes);
  FillRandom(&src, 11);
  std::vector<char> want(kBytes, static_cast<char>(0xEE));
  // Once with direct copies allowed, once with UCX's puts only: both land.
  for (bool direct : {true, false}) {
    UcxTransportOptions so = opt;
    so.direct_copy = direct;
    auto s = UcxTransport::Create(so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ(*(*s)->RegisterRegion(src.data(), src.size()), 0);
    EXPECT_NE((*s)->RegionMemory(0).find("(registered)"), std::string::npos)
        << (*s)->RegionMemory(0);
    auto peer = (*s)->Connect(*desc);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    const uint64_t shift = direct ? 0 : 3;  // different bytes the second time
    const std::vector<WriteOp> ops = {
        {0, 0 + shift, 0, 0, 1},
        {0, 4096 + shift, 0, 12345, 4096},
        {0, 1000003 + shift, 0, 2000001, 77777},
        {0, kBytes - 3333 - shift, 0, kBytes - 3333, 3333},
        {0, 17, 0, 5000000, 0},
    };
    Apply(ops, src, &want);
    ASSERT_TRUE(WriteAndWait(**s, *peer, ops).ok());
    EXPECT_EQ(FirstDiff(std::vector<char>(dst, dst + kBytes), want), -1) << "direct=" << direct;
    const TransportStats st = (*s)->stats();
    EXPECT_EQ(st.bytes_written, 1u + 4096 + 77777 + 3333);
    EXPECT_EQ(st.bytes_copied_directly,
              direct && AllocatesSharedMemory(GetParam()) ? st.bytes_written : 0u)
        << "direct=" << direct;
    (*s)->Disconnect(*peer);
  }

  receiver.FreeRegion(a->id);
  EXPECT_EQ(receiver.RegionMemory(a->id), "freed");
  receiver.FreeRegion(a->id);  // once is enough; again is ignored
  auto after = receiver.LocalDescriptor();
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kFailedPrecondition) << after.status().ToString();
  EXPECT_EQ(receiver.AllocateRegion(0).status().code(), StatusCode::kInvalidArgument);
}

// Direct copies (into a mapped shared-memory region) from writers on two
// threads race a Disconnect: every batch Write accepted completes exactly
// once, on the progress thread (not a writer's), and none after Disconnect
// returned.
TEST_P(AllocatedRegionTest, DisconnectDuringDirectCopiesFromTwoWritersRunsEachDoneOnceAndNoneAfter) {
  if (!AllocatesSharedMemory(GetParam())) GTEST_SKIP() << "no direct copies over tcp";
  constexpr size_t kBytes = 4 << 20, kPiece = 64 << 10;
  UcxTransportOptions opt;
  opt.tls = GetParam();
  auto r = UcxTransport::Create(opt);
  auto s = UcxTransport::Create(opt);
  ASSERT_TRUE(r.ok() && s.ok());
  auto a = (*r)->AllocateRegion(kBytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<char> src(kBytes);
  FillRandom(&src, 21);
  ASSERT_EQ(*(*s)->RegisterRegion(src.data(), src.size()), 0);
  auto peer = (*s)->Connect(*(*r)->LocalDescriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  std::mutex mu;
  std::map<uint64_t, int> calls;  // batch -> dones
  std::set<std::thread::id> writer_threads;
  int after_disconnect = 0, on_writer_thread = 0;
  std::atomic<bool> disconnected{false};
  std::atomic<uint64_t> next{0};
  auto writer = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      writer_threads.insert(std::this_thread::get_id());
    }
    for (;;) {
      const uint64_t id = next++;
      const uint64_t off = (id * kPiece) % kBytes;
      const WriteOp op{0, off, 0, off, kPiece};
      Status st = (*s)->Write(*peer, std::span<const WriteOp>(&op, 1), [&, id](Status) {
        std::lock_guard<std::mutex> lock(mu);
        ++calls[id];
        if (disconnected) ++after_disconnect;
        if (writer_threads.count(std::this_thread::get_id())) ++on_writer_thread;
      });
      if (!st.ok()) return;  // disconnected: NotFound
      std::lock_guard<std::mutex> lock(mu);
      calls.try_emplace(id, 0);
    }
  };
  std::thread w1(writer), w2(writer);
  std::this_thread::sleep_for(milliseconds(50));
  (*s)->Disconnect(*peer);
  disconnected = true;
  w1.join();
  w2.join();
  std::this_thread::sleep_for(milliseconds(100));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_GT(calls.size(), 10u) << "the writers hardly wrote";
  for (const auto& [id, n] : calls) EXPECT_EQ(n, 1) << "batch " << id;
  EXPECT_EQ(after_disconnect, 0);
  EXPECT_EQ(on_writer_thread, 0) << "done must run on the transport's progress thread";
  EXPECT_GT((*s)->stats().bytes_copied_directly, 0u);
  (*s)->DisconnectAll();
  (*r)->FreeRegion(a->id);
}

INSTANTIATE_TEST_SUITE_P(Tls, AllocatedRegionTest,
                         testing::ValuesIn(std::vector<std::string>(std::begin(kTlsValues),
                                                                    std::end(kTlsValues))),
                         TestName);

// ---- peer death: a receiver in a child process ----------------------------

// What a helper process (ChildProcess, below) was spawned with: its pipe
// ends, UCX_TLS and region size. False when this process is no helper.
struct ChildSide {
  int in = -1, out = -1;
  UcxTransportOptions opt;
  size_t bytes = 0;
};
bool ChildSideFromEnv(ChildSide* c) {
  const char* fds = std::getenv("STRATA_UCX_CHILD_FDS");
  if (fds == nullptr || std::sscanf(fds, "%d,%d", &c->in, &c->out) != 2) return false;
  c->opt.tls = std::getenv("STRATA_UCX_CHILD_TLS");
  c->bytes = std::stoull(std::getenv("STRATA_UCX_CHILD_BYTES"));
  return true;
}
// A length-prefixed string to the parent (ChildProcess::ReadString).
void SendString(int fd, const std::string& m) {
  const uint32_t len = static_cast<uint32_t>(m.size());
  if (write(fd, &len, 4) != 4 || write(fd, m.data(), len) != static_cast<ssize_t>(len)) _exit(5);
}

// The child's side: runs only when a PeerDeath test spawned this binary with
// STRATA_UCX_CHILD_FDS set. Creates a receiver, registers a region of 0xEE,
// sends its descriptor, then answers "hash your region" requests until its
// command pipe closes (or it is killed).
TEST(UcxChildReceiver, Serve) {
  ChildSide child;
  if (!ChildSideFromEnv(&child))
    GTEST_SKIP() << "helper process of the PeerDeath tests; runs only when they spawn it";
  const int in = child.in, out = child.out;
  const size_t bytes = child.bytes;
  const bool allocate = std::string(std::getenv("STRATA_UCX_CHILD_MEMORY")) == "ucx";
  auto t = UcxTransport::Create(child.opt);
  if (!t.ok()) _exit(3);
  std::vector<char> heap;
  char* region = nullptr;
  if (allocate) {
    auto a = (*t)->AllocateRegion(bytes);
    if (!a.ok()) _exit(4);
    region = static_cast<char*>(a->base);
  } else {
    heap.resize(bytes);
    region = heap.data();
    if (!(*t)->RegisterRegion(region, bytes).ok()) _exit(4);
  }
  std::memset(region, 0xEE, bytes);
  SendString(out, *(*t)->LocalDescriptor());
  char cmd;
  while (read(in, &cmd, 1) == 1) {
    const uint64_t h = Fnv(region, bytes);
    if (write(out, &h, 8) != 8) _exit(6);
  }
  _exit(0);
}

// A helper process: this test binary re-executed with one gtest filter and
// extra environment, talking over two pipes.
class ChildProcess {
 public:
  ~ChildProcess() { Kill(); }

  // Everything the child needs is built before fork: this process has
  // threads, so the child may only make async-signal-safe calls.
  void Spawn(const char* filter, std::vector<std::string> extra_env) {
    int to_child[2], from_child[2];
    ASSERT_EQ(pipe(to_child), 0);
    ASSERT_EQ(pipe(from_child), 0);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.push_back("STRATA_UCX_CHILD_FDS=" + std::to_string(to_child[0]) + "," +
                  std::to_string(from_child[1]));
    for (std::string& e : extra_env) env.push_back(std::move(e));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    char arg0[] = "ucx_transport_test";
    std::string arg1 = std::string("--gtest_filter=") + filter;
    char* argv[] = {arg0, arg1.data(), nullptr};
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      // Keep only the two pipe ends (not this process's UCX sockets).
      for (int fd = 3; fd < 4096; ++fd) {
        if (fd != to_child[0] && fd != from_child[1]) close(fd);
      }
      execve("/proc/self/exe", argv, envp.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = to_child[1];
    from_ = from_child[0];
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    to_ = from_ = -1;
  }

  void Signal(int sig) { kill(pid_, sig); }
  // SIGSTOP, returning once every thread of the child is stopped.
  bool Stop() { return StopProcess(pid_); }

 protected:
  bool ReadFull(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = read(from_, c, n);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  bool WriteFull(const void* p, size_t n) {
    return write(to_, p, n) == static_cast<ssize_t>(n);
  }
  // A length-prefixed string from the child ("" when it died first).
  std::string ReadString() {
    uint32_t len = 0;
    if (!ReadFull(&len, 4)) return "";
    std::string s(len, '\0');
    if (!ReadFull(s.data(), len)) return "";
    return s;
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
};

class ChildReceiver : public ChildProcess {
 public:
  // Spawns this test binary running UcxChildReceiver.Serve; its region is
  // heap memory it registers, or with memory "ucx" AllocateRegion's.
  void Start(const std::string& tls, size_t bytes, const std::string& memory = "heap") {
    ASSERT_NO_FATAL_FAILURE(Spawn("UcxChildReceiver.Serve",
                                  {"STRATA_UCX_CHILD_TLS=" + tls,
                                   "STRATA_UCX_CHILD_BYTES=" + std::to_string(bytes),
                                   "STRATA_UCX_CHILD_MEMORY=" + memory}));
    descriptor_ = ReadString();
    ASSERT_FALSE(descriptor_.empty()) << "the child receiver died before sending its descriptor";
  }

  uint64_t Hash() {
    const char c = 'h';
    uint64_t h = 0;
    EXPECT_TRUE(WriteFull(&c, 1));
    EXPECT_TRUE(ReadFull(&h, 8));
    return h;
  }

  const std::string& descriptor() const { return descriptor_; }

 private:
  std::string descriptor_;
};

// The sender's side of KilledSenderLeavesTheReceiverUsable: reads the
// receiver's descriptor, registers `bytes` of FillRandom(seed), connects,
// and answers "connected" or why not. Then 'w': the whole region written
// into the receiver's (2 MiB pieces, all in flight), answered with the
// status; 'l': the same in a loop, never answered (until killed).
TEST(UcxChildSender, Serve) {
  ChildSide child;
  if (!ChildSideFromEnv(&child))
    GTEST_SKIP() << "helper process of the PeerDeath tests; runs only when they spawn it";
  const int in = child.in, out = child.out;
  const size_t bytes = child.bytes;
  auto send = [&](const std::string& m) { SendString(out, m); };
  auto t = UcxTransport::Create(child.opt);
  if (!t.ok()) _exit(3);
  std::vector<char> src(bytes);
  FillRandom(&src, static_cast<uint32_t>(std::stoul(std::getenv("STRATA_UCX_CHILD_SEED"))));
  if (!(*t)->RegisterRegion(src.data(), src.size()).ok()) _exit(4);
  uint32_t len = 0;
  if (read(in, &len, 4) != 4) _exit(6);
  std::string desc(len, '\0');
  for (size_t got = 0; got < len;) {
    const ssize_t r = read(in, desc.data() + got, len - got);
    if (r <= 0) _exit(6);
    got += static_cast<size_t>(r);
  }
  const auto t0 = Clock::now();
  auto peer = (*t)->Connect(desc);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!peer.ok()) {
    send("connect failed after " + std::to_string(took) + " s: " + peer.status().ToString());
    _exit(0);
  }
  send("connected");
  constexpr size_t kPiece = 2 << 20;
  std::vector<WriteOp> ops;
  for (size_t off = 0; off < bytes; off += kPiece)
    ops.push_back({0, off, 0, off, std::min(kPiece, bytes - off)});
  char cmd;
  while (read(in, &cmd, 1) == 1) {
    do {
      Status st = WriteAndWait(**t, *peer, ops);
      if (cmd == 'w') send(st.ok() ? "ok" : st.ToString());
    } while (cmd == 'l');
  }
  _exit(0);
}

class ChildSender : public ChildProcess {
 public:
  // Spawns UcxChildSender.Serve writing FillRandom(seed) into `descriptor`;
  // returns "connected" or the child's reason it is not.
  std::string Start(const std::string& tls, size_t bytes, uint32_t seed,
                    const std::string& descriptor) {
    Spawn("UcxChildSender.Serve", {"STRATA_UCX_CHILD_TLS=" + tls,
                                   "STRATA_UCX_CHILD_BYTES=" + std::to_string(bytes),
                                   "STRATA_UCX_CHILD_SEED=" + std::to_string(seed)});
    if (pid_ < 0) return "spawn failed";
    const uint32_t len = static_cast<uint32_t>(descriptor.size());
    if (!WriteFull(&len, 4) || !WriteFull(descriptor.data(), len)) return "child gone";
    const std::string said = ReadString();
    return said.empty() ? "the child sender died before connecting" : said;
  }
  // 'w' (one pass, its status returned) or 'l' (writes until killed; "").
  std::string Command(char c) {
    if (!WriteFull(&c, 1)) return "child gone";
    return c == 'w' ? ReadString() : "";
  }
};

class PeerDeathTest : public testing::TestWithParam<std::string> {};

TEST_P(PeerDeathTest, KilledReceiverFailsWritesAndARestartedOneWorks) {
  constexpr size_t kBytes = 64 << 20;
  constexpr size_t kPiece = 2 << 20;
  UcxTransportOptions opt;
  opt.tls = GetParam();
  auto created = UcxTransport::Create(opt);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  UcxTransport& sender = **created;
  std::vector<char> src(kBytes);
  FillRandom(&src, 5);
  ASSERT_EQ(*sender.RegisterRegion(src.data(), src.size()), 0);

  // The receiver's region after our first 1 MiB write, to compare hashes.
  std::vector<char> image(kBytes, static_cast<char>(0xEE));
  std::memcpy(image.data(), src.data(), 1 << 20);
  const uint64_t want = Fnv(image.data(), image.size());
  const WriteOp first{0, 0, 0, 0, 1 << 20};

  ChildReceiver child;
  ASSERT_NO_FATAL_FAILURE(child.Start(GetParam(), kBytes));
  auto peer = sender.Connect(child.descriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(WriteAndWait(sender, *peer, std::span<const WriteOp>(&first, 1)).ok());
  EXPECT_EQ(child.Hash(), want) << "bytes written into the child did not land as sent";

  // Writes in flight, then kill -9.
  constexpr int kInFlight = static_cast<int>(kBytes / kPiece);
  Completions c(kInFlight);
  for (int i = 0; i < kInFlight; ++i) {
    const WriteOp op{0, uint64_t(i) * kPiece, 0, uint64_t(i) * kPiece, kPiece};
    ASSERT_TRUE(sender.Write(*peer, std::span<const WriteOp>(&op, 1), c.Callback(i)).ok());
  }
  const auto killed_at = Clock::now();
  child.Kill();
  ASSERT_TRUE(c.WaitAll(seconds(20)))
      << "writes in flight to a killed peer did not complete within 20 s";
  int failed = 0;
  for (int i = 0; i < kInFlight; ++i) {
    EXPECT_EQ(c.calls(i), 1) << "write " << i;
    const Status st = c.status(i);
    if (st.ok()) continue;
    ++failed;
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << "write " << i << ": " << st.ToString();
    EXPECT_EQ(st.message().rfind("peer lost: ", 0), 0u) << "write " << i << ": " << st.message();
  }

  // The next writes fail too, within seconds of the kill (the peer may
  // look alive until UCX notices: keep writing until it does).
  Status next;
  while (Clock::now() - killed_at < seconds(20)) {
    next = WriteAndWait(sender, *peer, std::span<const WriteOp>(&first, 1));
    if (!next.ok()) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  const double noticed_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::printf(
      "[ info     ] UCX_TLS=%s: %d of %d writes in flight failed; a dead peer was noticed after "
      "%.2f s: %s\n",
      GetParam().c_str(), failed, kInFlight, noticed_s, next.ToString().c_str());
  ASSERT_EQ(next.code(), StatusCode::kUnavailable) << "a killed peer was not noticed within 20 s";
  EXPECT_EQ(next.message().rfind("peer lost: ", 0), 0u) << next.message();
  EXPECT_EQ(sender.Write(*peer, std::span<const WriteOp>(&first, 1), [](Status) {}).code(),
            StatusCode::kUnavailable);

  // Disconnect works and returns promptly; the dead descriptor is refused.
  const auto t0 = Clock::now();
  sender.Disconnect(*peer);
  EXPECT_LT(Clock::now() - t0, seconds(10));
  EXPECT_EQ(sender.stats().peers, 0);
  // Nothing is waited on any more (the progress thread spins while it is).
  EXPECT_EQ(sender.stats().writes_in_flight, 0);
  const auto stale_at = Clock::now();
  auto stale = sender.Connect(child.descriptor());
  const double stale_s = std::chrono::duration<double>(Clock::now() - stale_at).count();
  std::printf("[ info     ] UCX_TLS=%s: connecting to the dead descriptor failed after %.2f s: %s\n",
              GetParam().c_str(), stale_s, stale.status().ToString().c_str());
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable) << stale.status().ToString();
  // A dead peer is not told as a missing transport (tcp reports it as
  // unreachable; the cma hint used to follow it).
  EXPECT_EQ(stale.status().message().find("cma alone"), std::string::npos)
      << stale.status().ToString();
  EXPECT_NE(stale.status().message().find("is it up?"), std::string::npos)
      << stale.status().ToString();

  // A restarted receiver is usable without restarting the sender. (CI once
  // failed somewhere in here on shm after ~5 s and its log was cut: every
  // step says what it saw, so a recurrence is explainable.)
  ChildReceiver again;
  ASSERT_NO_FATAL_FAILURE(again.Start(GetParam(), kBytes));
  const auto again_at = Clock::now();
  auto peer2 = sender.Connect(again.descriptor());
  ASSERT_TRUE(peer2.ok()) << "connecting to the restarted receiver failed after "
                          << std::chrono::duration<double>(Clock::now() - again_at).count()
                          << " s: " << peer2.status().ToString();
  const Status wrote = WriteAndWait(sender, *peer2, std::span<const WriteOp>(&first, 1));
  ASSERT_TRUE(wrote.ok()) << "writing to the restarted receiver: " << wrote.ToString();
  EXPECT_EQ(again.Hash(), want) << "bytes written into the restarted receiver did not land as sent";
  sender.Disconnect(*peer2);
}

// A stalled peer (SIGSTOP: its connections stay open, nothing answers) is
// the caller's deadline to notice; Disconnect must still end its writes at
// once, and Connect to it must give up at connect_timeout.
TEST_P(PeerDeathTest, StoppedReceiverDisconnectsPromptlyAndConnectTimesOut) {
  constexpr size_t kBytes = 64 << 20;
  constexpr size_t kPiece = 2 << 20;
  UcxTransportOptions opt;
  opt.tls = GetParam();
  opt.connect_timeout = milliseconds(1000);
  auto created = UcxTransport::Create(opt);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  UcxTransport& sender = **created;
  std::vector<char> src(kBytes);
  FillRandom(&src, 6);
  ASSERT_EQ(*sender.RegisterRegion(src.data(), src.size()), 0);
  ChildReceiver child;
  ASSERT_NO_FATAL_FAILURE(child.Start(GetParam(), kBytes));
  auto peer = sender.Connect(child.descriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  constexpr int kInFlight = static_cast<int>(kBytes / kPiece);
  Completions c(kInFlight);
  ASSERT_TRUE(child.Stop());
  for (int i = 0; i < kInFlight; ++i) {
    const WriteOp op{0, uint64_t(i) * kPiece, 0, uint64_t(i) * kPiece, kPiece};
    ASSERT_TRUE(sender.Write(*peer, std::span<const WriteOp>(&op, 1), c.Callback(i)).ok());
  }
  std::this_thread::sleep_for(milliseconds(300));
  auto t0 = Clock::now();
  sender.Disconnect(*peer);
  EXPECT_LT(Clock::now() - t0, seconds(10));
  int aborted = 0;
  for (int i = 0; i < kInFlight; ++i) {
    ASSERT_EQ(c.calls(i), 1) << "batch " << i;
    if (!c.status(i).ok()) {
      EXPECT_EQ(c.status(i).code(), StatusCode::kAborted) << c.status(i).ToString();
      ++aborted;
    }
  }
  EXPECT_GT(aborted, 0) << "a stopped peer took every write";
  // UCX leaves some of these flushes pending after the forced close; the
  // transport must not wait on them (its progress thread spins while it
  // does).
  EXPECT_EQ(sender.stats().writes_in_flight, 0);

  t0 = Clock::now();
  auto stalled = sender.Connect(child.descriptor());
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(stalled.ok());
  EXPECT_EQ(stalled.status().code(), StatusCode::kUnavailable) << stalled.status().ToString();
  EXPECT_LT(waited, 10.0);
  std::printf(
      "[ info     ] UCX_TLS=%s: %d of %d writes to a stopped peer aborted; Connect gave up after "
      "%.2f s: %s\n",
      GetParam().c_str(), aborted, kInFlight, waited, stalled.status().ToString().c_str());
  EXPECT_EQ(sender.stats().peers, 0);
  child.Signal(SIGCONT);
}

// The decode's pool in memory UCX allocated (what `strata serve` does):
// over shared memory the sender copies into the child's mapped segment
// itself, so nothing is in flight when it dies; the death must still be
// noticed (UCX's keepalive), Disconnect must unmap it promptly, and the
// dead descriptor must be refused.
TEST_P(PeerDeathTest, KilledReceiverWithAllocatedMemoryIsNoticedAndDisconnects) {
  constexpr size_t kBytes = 16 << 20;
  UcxTransportOptions opt;
  opt.tls = GetParam();
  auto created = UcxTransport::Create(opt);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  UcxTransport& sender = **created;
  std::vector<char> src(kBytes);
  FillRandom(&src, 7);
  ASSERT_EQ(*sender.RegisterRegion(src.data(), src.size()), 0);
  std::vector<char> image(kBytes, static_cast<char>(0xEE));
  std::memcpy(image.data(), src.data(), 1 << 20);
  const WriteOp first{0, 0, 0, 0, 1 << 20};

  ChildReceiver child;
  ASSERT_NO_FATAL_FAILURE(child.Start(GetParam(), kBytes, "ucx"));
  auto peer = sender.Connect(child.descriptor());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(WriteAndWait(sender, *peer, std::span<const WriteOp>(&first, 1)).ok());
  EXPECT_EQ(child.Hash(), Fnv(image.data(), image.size()));
  EXPECT_EQ(sender.stats().bytes_copied_directly,
            AllocatesSharedMemory(GetParam()) ? uint64_t{1} << 20 : 0u);

  const auto killed_at = Clock::now();
  child.Kill();
  Status next;
  while (Clock::now() - killed_at < seconds(20)) {
    next = WriteAndWait(sender, *peer, std::span<const WriteOp>(&first, 1));
    if (!next.ok()) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  std::printf("[ info     ] UCX_TLS=%s, allocated memory: a dead peer was noticed after %.2f s: %s\n",
              GetParam().c_str(),
              std::chrono::duration<double>(Clock::now() - killed_at).count(),
              next.ToString().c_str());
  ASSERT_EQ(next.code(), StatusCode::kUnavailable) << "a killed peer was not noticed within 20 s";
  EXPECT_EQ(next.message().rfind("peer lost: ", 0), 0u) << next.message();
  const auto t0 = Clock::now();
  sender.Disconnect(*peer);
  EXPECT_LT(Clock::now() - t0, seconds(10));
  EXPECT_EQ(sender.stats().peers, 0);
  EXPECT_EQ(sender.stats().writes_in_flight, 0);
  auto stale = sender.Connect(child.descriptor());
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable) << stale.status().ToString();
}

// The other direction: a sender killed (SIGKILL) while its writes stream
// into this receiver. The receiver must stay usable: a new sender connects
// and its bytes land exactly. Each sender gets its own descriptor
// (LocalDescriptorFor), as strata serve's decode gives each prefill
// connection, so the receive FIFO the dead sender may leave stopped over
// shared memory is that sender's alone. Through the shared LocalDescriptor
// this failed alone on 2026-12-04 (shm 1/3, all 1/3, posix,cma 3/3: the new
// sender's Connect got no answer within 5 s).
// Over tcp the writes are the transport's own messages: with UCX 1.13's
// emulated puts there (UcxTransportOptions::Writes::kPuts) their handler
// aborted this process when its completion reply to the dead sender failed
// ("ucp_request.inl:346 Fatal: unexpected error: Endpoint timeout", 1 in 3
// runs; 0 in 60 with the messages).
TEST_P(PeerDeathTest, KilledSenderLeavesTheReceiverUsable) {
  constexpr size_t kBytes = 32 << 20;
  UcxTransportOptions opt;
  opt.tls = GetParam();
  auto created = UcxTransport::Create(opt);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  UcxTransport& receiver = **created;
  std::vector<char> region(kBytes, static_cast<char>(0xEE));
  ASSERT_EQ(*receiver.RegisterRegion(region.data(), region.size()), 0);
  auto desc1 = receiver.LocalDescriptorFor("first");
  ASSERT_TRUE(desc1.ok()) << desc1.status().ToString();
  EXPECT_EQ(*receiver.LocalDescriptorFor("first"), *desc1) << "one key, one descriptor";

  ChildSender first;
  ASSERT_EQ(first.Start(GetParam(), kBytes, 11, *desc1), "connected");
  first.Command('l');
  std::this_thread::sleep_for(milliseconds(300));  // writes streaming in
  first.Kill();
  receiver.ForgetPeer("first");

  std::vector<char> want(kBytes);
  FillRandom(&want, 12);
  auto desc2 = receiver.LocalDescriptorFor("second");
  ASSERT_TRUE(desc2.ok()) << desc2.status().ToString();
  EXPECT_NE(*desc2, *desc1);
  const auto t0 = Clock::now();
  ChildSender second;
  const std::string said = second.Start(GetParam(), kBytes, 12, *desc2);
  const double connect_s = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(said, "connected") << "a new sender after one was killed mid-write";
  ASSERT_EQ(second.Command('w'), "ok");
  EXPECT_EQ(Fnv(region.data(), kBytes), Fnv(want.data(), kBytes))
      << "the new sender's bytes did not land as sent";
  std::printf("[ info     ] UCX_TLS=%s: a new sender connected %.2f s after one was killed "
              "mid-write, and its %zu MiB landed exactly\n",
              GetParam().c_str(), connect_s, kBytes >> 20);
  // The shared descriptor still works beside the per-peer ones.
  ChildSender third;
  ASSERT_EQ(third.Start(GetParam(), kBytes, 13, *receiver.LocalDescriptor()), "connected");
  ASSERT_EQ(third.Command('w'), "ok");
  FillRandom(&want, 13);
  EXPECT_EQ(Fnv(region.data(), kBytes), Fnv(want.data(), kBytes));
}

INSTANTIATE_TEST_SUITE_P(Tls, PeerDeathTest,
                         testing::Values("tcp", "tcp,cma", "all", "shm", "posix,cma"), TestName);

}  // namespace
}  // namespace strata::disagg
