// Bootstrap control plane, the Endpoint over real sockets on 127.0.0.1
// (hello exchange, ordering, liveness, protocol errors, replacement, a child
// process killed with SIGKILL, destruction with callbacks in flight). The
// codec: bootstrap_messages_test.cc.
// Timing checks are generous bounds ("seconds, not a hang"); the lower
// bounds are what a timeout cannot undercut.
#include "disagg/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "disagg/bootstrap_test_util.h"
#include "util/stop_process.h"
extern char** environ;

namespace strata::disagg {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

using test::MakeHello;
using test::TestLayout;

// ---- endpoint helpers --------------------------------------------------------

struct Event {
  enum Kind { kUp, kMessage, kDown } kind;
  PeerInfo peer;
  std::optional<Message> message;
  Status why;
};

// Records every callback; tests wait on predicates over the record.
class Recorder : public Handler {
 public:
  void OnPeerUp(const PeerInfo& peer) override { Add({Event::kUp, peer, std::nullopt, {}}); }
  void OnMessage(const PeerInfo& peer, Message message) override {
    if (on_message) on_message(peer, message);
    Add({Event::kMessage, peer, std::move(message), {}});
  }
  void OnPeerDown(const PeerInfo& peer, const Status& why) override {
    Add({Event::kDown, peer, std::nullopt, why});
  }

  // Waits (up to `timeout`) until pred(events) holds.
  bool WaitFor(const std::function<bool(const std::vector<Event>&)>& pred,
               std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(events_); });
  }
  bool WaitCount(Event::Kind kind, size_t n, std::chrono::milliseconds timeout = 10s) {
    return WaitFor([&](const std::vector<Event>& e) { return CountOf(e, kind) >= n; }, timeout);
  }
  std::vector<Event> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  size_t Count(Event::Kind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    return CountOf(events_, kind);
  }
  // The first event of `kind` (REQUIRES: one happened).
  Event First(Event::Kind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Event& e : events_) {
      if (e.kind == kind) return e;
    }
    ADD_FAILURE() << "no event of kind " << kind;
    return {};
  }
  static size_t CountOf(const std::vector<Event>& e, Event::Kind kind) {
    return static_cast<size_t>(
        std::count_if(e.begin(), e.end(), [&](const Event& x) { return x.kind == kind; }));
  }

  std::function<void(const PeerInfo&, const Message&)> on_message;  // set before use

 private:
  void Add(Event e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;
};

EndpointOptions Options(const std::string& role, std::chrono::milliseconds heartbeat = 100ms,
                        std::chrono::milliseconds timeout = 5000ms) {
  EndpointOptions o;
  o.hello = MakeHello(role);
  o.heartbeat_interval = heartbeat;
  o.peer_timeout = timeout;
  o.connect_timeout = 5000ms;
  return o;
}

std::unique_ptr<Endpoint> MakeEndpoint(EndpointOptions o, Handler* h) {
  StatusOr<std::unique_ptr<Endpoint>> e = Endpoint::Create(std::move(o), h);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

bool Contains(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string::npos;
}

std::string FrameOf(const std::string& payload) {
  std::string f(4, '\0');
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>(n >> (8 * i));
  return f + payload;
}

// A hand-driven TCP peer speaking raw frames (POSIX sockets, blocking).
class RawSocket {
 public:
  explicit RawSocket(int fd = -1) : fd_(fd) {}
  RawSocket(RawSocket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ~RawSocket() {
    if (fd_ >= 0) close(fd_);
  }
  static RawSocket ConnectTo(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
    return RawSocket(fd);
  }
  int fd() const { return fd_; }
  bool SendBytes(std::string_view b) {
    while (!b.empty()) {
      const ssize_t n = send(fd_, b.data(), b.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      b.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  bool Send(const Message& m) { return SendBytes(FrameOf(EncodeMessage(m))); }
  // Reads n bytes; false on EOF/error/timeout.
  bool ReadN(char* p, size_t n, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (n > 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd pfd{fd_, POLLIN, 0};
      if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t k = recv(fd_, p, n, 0);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  std::optional<Message> ReadMessage(std::chrono::milliseconds timeout = 10s) {
    char h[4];
    if (!ReadN(h, 4, timeout)) return std::nullopt;
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= uint32_t{static_cast<uint8_t>(h[i])} << (8 * i);
    std::string body(len, '\0');
    if (!ReadN(body.data(), len, timeout)) return std::nullopt;
    StatusOr<Message> m = DecodeMessage(body);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  // Reads and drops input until EOF (true) or the timeout (false).
  bool WaitEof(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd pfd{fd_, POLLIN, 0};
      if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t k = recv(fd_, buf, sizeof buf, 0);
      if (k <= 0) return true;
    }
  }

 private:
  int fd_;
};

// A raw listening socket on 127.0.0.1 (an ephemeral port).
class RawListener {
 public:
  RawListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RawListener() { close(fd_); }
  int port() const { return port_; }
  RawSocket Accept() {
    pollfd pfd{fd_, POLLIN, 0};
    EXPECT_GT(poll(&pfd, 1, 10000), 0) << "nobody connected";
    return RawSocket(accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC));
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A listener that never accepts, with its accept queue filled: Linux drops
// further SYNs, so a connect to it hangs (until the connect timeout).
class FullListener {
 public:
  FullListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 0), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    // Fill the queue: connects that complete without an accept.
    for (int i = 0; i < 4; ++i) {
      const int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
      fillers_.push_back(c);
    }
    std::this_thread::sleep_for(100ms);
  }
  ~FullListener() {
    for (int c : fillers_) close(c);
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> fillers_;
};

// A port nothing listens on (bound, then closed).
int ClosedPort() {
  RawListener l;
  return l.port();
}

// A listener endpoint (prefill) and a connector (decode), connected and up.
struct Pair {
  Recorder lrec, crec;
  std::unique_ptr<Endpoint> listener, connector;
  int port = 0;
  PeerRef at_connector = 0;  // the prefill, as the decode sees it
  PeerRef at_listener = 0;   // the decode, as the prefill sees it

  explicit Pair(EndpointOptions lo = Options("prefill"), EndpointOptions co = Options("decode"),
                bool connect = true) {
    co.hello.model = lo.hello.model;
    listener = MakeEndpoint(std::move(lo), &lrec);
    connector = MakeEndpoint(std::move(co), &crec);
    StatusOr<int> p = listener->Listen("127.0.0.1", 0);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    port = p.ok() ? *p : 0;
    if (connect) Up();
  }
  void Up() {
    at_connector = connector->Connect("127.0.0.1", port);
    EXPECT_TRUE(crec.WaitCount(Event::kUp, 1)) << "connector never saw the listener's hello";
    EXPECT_TRUE(lrec.WaitCount(Event::kUp, 1)) << "listener never saw the connector's hello";
    at_listener = lrec.First(Event::kUp).peer.ref;
  }
};

std::vector<uint64_t> RoomsReceived(Recorder& r) {
  std::vector<uint64_t> rooms;
  for (const Event& e : r.Events()) {
    if (e.kind != Event::kMessage) continue;
    if (const auto* m = std::get_if<RoomReady>(&*e.message)) rooms.push_back(m->room);
    if (const auto* m = std::get_if<RoomDone>(&*e.message)) rooms.push_back(m->room);
  }
  return rooms;
}

// ---- endpoint ----------------------------------------------------------------

TEST(BootstrapEndpoint, CreateRejectsWhatCannotWork) {
  Recorder r;
  EndpointOptions o = Options("decode");
  o.hello.role = "router";
  StatusOr<std::unique_ptr<Endpoint>> e = Endpoint::Create(o, &r);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(Contains(e.status(), "role")) << e.status().ToString();
  o = Options("decode");
  o.hello.layout.page_size = 0;
  EXPECT_FALSE(Endpoint::Create(o, &r).ok());
  o = Options("decode", 1000ms, 1500ms);
  e = Endpoint::Create(o, &r);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(Contains(e.status(), "twice the heartbeat")) << e.status().ToString();
  EXPECT_FALSE(Endpoint::Create(Options("decode"), nullptr).ok());
}

TEST(BootstrapEndpoint, ListenSaysWhyItCannotBind) {
  Recorder r;
  auto e = MakeEndpoint(Options("prefill"), &r);
  RawListener taken;
  StatusOr<int> p = e->Listen("127.0.0.1", taken.port());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(p.status(), "127.0.0.1:" + std::to_string(taken.port())))
      << p.status().ToString();
  EXPECT_TRUE(Contains(p.status(), "--disaggregation-bootstrap-port")) << p.status().ToString();
  EXPECT_EQ(e->Listen("127.0.0.1", 65536).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(e->Listen("no such host.invalid", 0).ok());
  // Two ports on one endpoint work.
  EXPECT_TRUE(e->Listen("127.0.0.1", 0).ok());
  EXPECT_TRUE(e->Listen("127.0.0.1", 0).ok());
}

TEST(BootstrapEndpoint, HelloExchangeAndMessagesBothWays) {
  EndpointOptions lo = Options("prefill");
  EndpointOptions co = Options("decode");
  const std::string lid = lo.hello.instance_id, cid = co.hello.instance_id;
  Pair p(lo, co);
  const Event cu = p.crec.First(Event::kUp);
  EXPECT_EQ(cu.peer.hello.instance_id, lid);
  EXPECT_EQ(cu.peer.hello.role, "prefill");
  EXPECT_EQ(cu.peer.address, "127.0.0.1:" + std::to_string(p.port));
  EXPECT_TRUE(cu.peer.replaced_instance_id.empty());
  EXPECT_EQ(cu.peer.ref, p.at_connector);
  const Event lu = p.lrec.First(Event::kUp);
  EXPECT_EQ(lu.peer.hello.instance_id, cid);
  EXPECT_EQ(lu.peer.hello.role, "decode");
  EXPECT_EQ(lu.peer.hello.transport_descriptor, co.hello.transport_descriptor);
  EXPECT_EQ(p.listener->num_peers(), 1);
  EXPECT_EQ(p.connector->num_peers(), 1);
  // Connect to the same address reuses the live connection.
  EXPECT_EQ(p.connector->Connect("127.0.0.1", p.port), p.at_connector);

  ASSERT_TRUE(p.connector->Send(p.at_connector, RoomReady{42, 100, 2, {5, 6, 7}}).ok());
  ASSERT_TRUE(p.lrec.WaitCount(Event::kMessage, 1));
  const Event lm = p.lrec.First(Event::kMessage);
  EXPECT_EQ(lm.peer.ref, p.at_listener);
  EXPECT_EQ(std::get<RoomReady>(*lm.message).dst_pages, (std::vector<int32_t>{5, 6, 7}));

  ASSERT_TRUE(p.listener->Send(p.at_listener, RoomDone{42, 9, -0.5f, {}, 100, 32, false, ""}).ok());
  ASSERT_TRUE(p.crec.WaitCount(Event::kMessage, 1));
  EXPECT_EQ(std::get<RoomDone>(*p.crec.First(Event::kMessage).message).cached_tokens, 32);

  // Heartbeats flow (interval 100 ms) but are not delivered as messages.
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(p.lrec.Count(Event::kMessage), 1u);
  EXPECT_EQ(p.crec.Count(Event::kDown), 0u);

  // A Hello is not the caller's to send; unknown refs are Unavailable.
  EXPECT_EQ(p.connector->Send(p.at_connector, MakeHello("decode")).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(p.connector->Send(987654, Heartbeat{1}).code(), StatusCode::kUnavailable);
}

TEST(BootstrapEndpoint, OrderIsKeptAndMessagesSentBeforeUpArrive) {
  Pair p(Options("prefill"), Options("decode"), /*connect=*/false);
  constexpr int kBefore = 3000, kAfter = 3000;
  const PeerRef ref = p.connector->Connect("127.0.0.1", p.port);
  // Queued while connecting: they go out right behind the Hello.
  for (int i = 0; i < kBefore; ++i) {
    ASSERT_TRUE(p.connector->Send(ref, RoomReady{uint64_t(i), 10, 0, {i % 100}}).ok());
  }
  ASSERT_TRUE(p.crec.WaitCount(Event::kUp, 1));
  for (int i = kBefore; i < kBefore + kAfter; ++i) {
    ASSERT_TRUE(p.connector->Send(ref, RoomReady{uint64_t(i), 10, 0, {i % 100}}).ok());
  }
  ASSERT_TRUE(p.lrec.WaitCount(Event::kMessage, kBefore + kAfter)) << p.lrec.Count(Event::kMessage);
  std::vector<uint64_t> want(kBefore + kAfter);
  for (size_t i = 0; i < want.size(); ++i) want[i] = i;
  EXPECT_EQ(RoomsReceived(p.lrec), want);

  // And back, from two threads at once: each thread's own order is kept.
  const PeerRef back = p.lrec.First(Event::kUp).peer.ref;
  auto sender = [&](uint64_t base) {
    for (uint64_t i = 0; i < 2000; ++i) {
      ASSERT_TRUE(p.listener->Send(back, RoomDone{base + i, 1, 0, {}, 1, 0, false, ""}).ok());
    }
  };
  std::thread t1(sender, 0), t2(sender, 1000000);
  t1.join();
  t2.join();
  ASSERT_TRUE(p.crec.WaitCount(Event::kMessage, 4000));
  std::vector<uint64_t> a, b;
  for (uint64_t r : RoomsReceived(p.crec)) (r < 1000000 ? a : b).push_back(r);
  ASSERT_EQ(a.size(), 2000u);
  ASSERT_EQ(b.size(), 2000u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
  EXPECT_EQ(p.crec.Count(Event::kDown), 0u);
}

TEST(BootstrapEndpoint, ListenerGoneIsNoticedAtOnce) {
  Pair p;
  const auto t0 = Clock::now();
  p.listener.reset();  // closes its sockets
  ASSERT_TRUE(p.crec.WaitCount(Event::kDown, 1)) << "the connector never noticed";
  const auto took = Clock::now() - t0;
  EXPECT_LT(took, 3s) << "noticed only after the heartbeat timeout, not from the socket";
  const Event d = p.crec.First(Event::kDown);
  EXPECT_EQ(d.peer.ref, p.at_connector);
  EXPECT_EQ(d.why.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(d.peer.hello.instance_id.empty());
  EXPECT_EQ(p.connector->num_peers(), 0);
  EXPECT_EQ(p.connector->Send(p.at_connector, Heartbeat{1}).code(), StatusCode::kUnavailable);
  // The listener's destructor ran no callback.
  EXPECT_EQ(p.lrec.Count(Event::kDown), 0u);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(p.crec.Count(Event::kDown), 1u);  // exactly once
}

TEST(BootstrapEndpoint, CloseFlushesWhatWasQueuedThenDrops) {
  Pair p;
  ASSERT_TRUE(
      p.listener->Send(p.at_listener, RoomFailed{7, FailureReason::kRejected, "queue full"}).ok());
  p.listener->Close(p.at_listener, Aborted("test closes it"));
  ASSERT_TRUE(p.lrec.WaitCount(Event::kDown, 1));
  const Event ld = p.lrec.First(Event::kDown);
  EXPECT_EQ(ld.why.code(), StatusCode::kAborted);
  EXPECT_EQ(ld.why.message(), "test closes it");
  ASSERT_TRUE(p.crec.WaitCount(Event::kDown, 1));
  // The RoomFailed queued before Close arrived, before the down.
  const std::vector<Event> ev = p.crec.Events();
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[1].kind, Event::kMessage);
  EXPECT_EQ(std::get<RoomFailed>(*ev[1].message).reason, FailureReason::kRejected);
  EXPECT_EQ(ev[2].kind, Event::kDown);
  EXPECT_EQ(p.listener->Send(p.at_listener, Heartbeat{1}).code(), StatusCode::kUnavailable);
  p.listener->Close(p.at_listener, Aborted("again"));  // a no-op
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(p.lrec.Count(Event::kDown), 1u);
  // A new Connect opens a new connection: a new peer.
  const PeerRef again = p.connector->Connect("127.0.0.1", p.port);
  EXPECT_NE(again, p.at_connector);
  ASSERT_TRUE(p.crec.WaitCount(Event::kUp, 2));
  EXPECT_TRUE(p.crec.Events().back().peer.replaced_instance_id.empty()) << "same instance";
}

TEST(BootstrapEndpoint, ConnectToClosedPortReportsWhy) {
  Recorder r;
  auto e = MakeEndpoint(Options("decode"), &r);
  const int port = ClosedPort();
  const PeerRef ref = e->Connect("127.0.0.1", port);
  // Queued while connecting (dropped with the connection), or already
  // refused: on loopback the refusal can win the race with this Send.
  const Status early = e->Send(ref, RoomReady{1, 1, 0, {}});
  EXPECT_TRUE(early.ok() || early.code() == StatusCode::kUnavailable) << early.ToString();
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.peer.ref, ref);
  EXPECT_TRUE(d.peer.hello.instance_id.empty());
  EXPECT_EQ(d.why.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.why, "cannot connect")) << d.why.ToString();
  EXPECT_TRUE(Contains(d.why, "127.0.0.1:" + std::to_string(port))) << d.why.ToString();
  EXPECT_EQ(r.Count(Event::kUp), 0u);
  EXPECT_EQ(e->Send(ref, Heartbeat{1}).code(), StatusCode::kUnavailable);
  // A bad port is a down too, not a crash.
  const PeerRef bad = e->Connect("127.0.0.1", 70000);
  ASSERT_TRUE(r.WaitCount(Event::kDown, 2));
  EXPECT_EQ(r.Events().back().peer.ref, bad);
}

TEST(BootstrapEndpoint, ConnectThatHangsTimesOut) {
  Recorder r;
  EndpointOptions o = Options("decode");
  o.connect_timeout = 300ms;
  auto e = MakeEndpoint(o, &r);
  FullListener full;
  const auto t0 = Clock::now();
  const PeerRef ref = e->Connect("127.0.0.1", full.port());
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  const auto took = Clock::now() - t0;
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.peer.ref, ref);
  EXPECT_EQ(d.why.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.why, "within 300 ms")) << d.why.ToString();
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 5s);
}

TEST(BootstrapEndpoint, SilentPeerIsDownAfterPeerTimeout) {
  Recorder r;
  auto e = MakeEndpoint(Options("prefill", 50ms, 200ms), &r);
  StatusOr<int> port = e->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  RawSocket raw = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(raw.Send(MakeHello("decode")));
  std::optional<Message> first = raw.ReadMessage();
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(std::holds_alternative<Hello>(*first));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  const auto up_at = Clock::now();
  // Now silent (reading nothing, sending nothing).
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1)) << "a silent peer was never dropped";
  const auto took = Clock::now() - up_at;
  EXPECT_GE(took, 150ms) << "dropped before its timeout";
  EXPECT_LT(took, 5s);
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.why.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.why, "no message")) << d.why.ToString();
  EXPECT_TRUE(Contains(d.why, "200 ms")) << d.why.ToString();
  // The raw side got heartbeats meanwhile, then EOF.
  std::optional<Message> hb = raw.ReadMessage(2s);
  ASSERT_TRUE(hb.has_value());
  EXPECT_TRUE(std::holds_alternative<Heartbeat>(*hb));
  EXPECT_TRUE(raw.WaitEof());
}

TEST(BootstrapEndpoint, HeartbeatsKeepAnIdlePeerUp) {
  Pair p(Options("prefill", 50ms, 200ms), Options("decode", 50ms, 200ms));
  std::this_thread::sleep_for(1500ms);  // 7 timeouts' worth of idleness
  EXPECT_EQ(p.crec.Count(Event::kDown), 0u);
  EXPECT_EQ(p.lrec.Count(Event::kDown), 0u);
  EXPECT_TRUE(p.connector->Send(p.at_connector, RoomReady{1, 1, 0, {}}).ok());
  EXPECT_TRUE(p.lrec.WaitCount(Event::kMessage, 1));
}

TEST(BootstrapEndpoint, ListenerThatSendsNoHelloTimesOutTheConnect) {
  Recorder r;
  auto e = MakeEndpoint(Options("decode", 50ms, 200ms), &r);
  RawListener l;
  const PeerRef ref = e->Connect("127.0.0.1", l.port());
  RawSocket s = l.Accept();
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.peer.ref, ref);
  EXPECT_TRUE(Contains(d.why, "no hello")) << d.why.ToString();
  EXPECT_EQ(r.Count(Event::kUp), 0u);
}

TEST(BootstrapEndpoint, ListenerThatGoesSilentIsDown) {
  Recorder r;
  auto e = MakeEndpoint(Options("decode", 50ms, 200ms), &r);
  RawListener l;
  e->Connect("127.0.0.1", l.port());
  RawSocket s = l.Accept();
  ASSERT_TRUE(s.Send(MakeHello("prefill")));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  EXPECT_TRUE(Contains(r.First(Event::kDown).why, "no message"))
      << r.First(Event::kDown).why.ToString();
}

TEST(BootstrapEndpoint, FrameOverTheLimitIsAProtocolError) {
  Recorder r;
  auto e = MakeEndpoint(Options("prefill"), &r);
  StatusOr<int> port = e->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  RawSocket raw = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(raw.Send(MakeHello("decode")));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  const uint32_t len = static_cast<uint32_t>(kMaxFrameBytes + 1);
  std::string header(4, '\0');
  for (int i = 0; i < 4; ++i) header[i] = static_cast<char>(len >> (8 * i));
  ASSERT_TRUE(raw.SendBytes(header + "{\"type\":"));
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.why.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(d.why, "protocol error")) << d.why.ToString();
  EXPECT_TRUE(Contains(d.why, "16 MiB")) << d.why.ToString();
  EXPECT_TRUE(raw.WaitEof());
}

TEST(BootstrapEndpoint, GarbageFrameIsAProtocolError) {
  Recorder r;
  auto e = MakeEndpoint(Options("prefill"), &r);
  StatusOr<int> port = e->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  RawSocket raw = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(raw.Send(MakeHello("decode")));
  ASSERT_TRUE(raw.SendBytes(FrameOf(
      R"({"type":"room_ready","room":1,"prompt_tokens":5,"first_page":0,"dst_pages":[-3]})")));
  ASSERT_TRUE(raw.Send(RoomReady{2, 5, 0, {}}));  // after the error: never delivered
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  const Event d = r.First(Event::kDown);
  EXPECT_TRUE(Contains(d.why, "protocol error")) << d.why.ToString();
  EXPECT_TRUE(Contains(d.why, "dst_pages[0]")) << d.why.ToString();
  EXPECT_TRUE(raw.WaitEof());
  EXPECT_EQ(r.Count(Event::kMessage), 0u);
}

TEST(BootstrapEndpoint, FirstMessageMustBeHello) {
  {  // Listening side: an accepted connection that never came up: no callbacks.
    Recorder r;
    auto e = MakeEndpoint(Options("prefill"), &r);
    StatusOr<int> port = e->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok());
    RawSocket raw = RawSocket::ConnectTo(*port);
    ASSERT_TRUE(raw.Send(Heartbeat{1}));
    EXPECT_TRUE(raw.WaitEof());
    EXPECT_TRUE(r.Events().empty());
    EXPECT_EQ(e->num_peers(), 0);
  }
  {  // Connecting side: OnPeerDown names it.
    Recorder r;
    auto e = MakeEndpoint(Options("decode"), &r);
    RawListener l;
    e->Connect("127.0.0.1", l.port());
    RawSocket s = l.Accept();
    ASSERT_TRUE(s.Send(RoomDone{1, 1, 0, {}, 1, 0, false, ""}));
    ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
    const Event d = r.First(Event::kDown);
    EXPECT_EQ(d.why.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(d.why, "first message must be a hello")) << d.why.ToString();
    EXPECT_EQ(r.Count(Event::kUp), 0u);
  }
  {  // A second Hello on an up connection.
    Recorder r;
    auto e = MakeEndpoint(Options("prefill"), &r);
    StatusOr<int> port = e->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok());
    RawSocket raw = RawSocket::ConnectTo(*port);
    ASSERT_TRUE(raw.Send(MakeHello("decode")));
    ASSERT_TRUE(raw.Send(MakeHello("decode")));
    ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
    EXPECT_TRUE(Contains(r.First(Event::kDown).why, "second hello"));
  }
}

TEST(BootstrapEndpoint, IncompatiblePeersAreRefusedOnBothSides) {
  struct Case {
    std::function<void(Hello&)> edit;  // applied to the connector's hello
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](Hello& h) { h.model = "other-model"; }, "other-model"},
      {[](Hello& h) { h.role = "prefill"; }, "prefill server too"},
      {[](Hello& h) { h.layout.page_size = 1; }, "KV layout"},
      {[](Hello& h) { h.layout.groups[0].dtype = DType::kF16; }, "KV layout"},
      {[](Hello& h) { h.transport = "nixl"; }, "nixl"},
  };
  for (const Case& c : cases) {
    Recorder lrec, crec;
    auto l = MakeEndpoint(Options("prefill"), &lrec);
    EndpointOptions co = Options("decode");
    c.edit(co.hello);
    auto cn = MakeEndpoint(co, &crec);
    StatusOr<int> port = l->Listen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok());
    cn->Connect("127.0.0.1", *port);
    ASSERT_TRUE(crec.WaitCount(Event::kDown, 1)) << c.needle;
    const Event d = crec.First(Event::kDown);
    EXPECT_EQ(d.why.code(), StatusCode::kFailedPrecondition) << d.why.ToString();
    EXPECT_TRUE(Contains(d.why, c.needle)) << d.why.ToString();
    EXPECT_EQ(crec.Count(Event::kUp), 0u);
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(lrec.Events().empty()) << "the listener must not bring up an incompatible peer";
  }
}

TEST(BootstrapEndpoint, SameInstanceReconnectingReplacesItsOldConnection) {
  Recorder r;
  auto e = MakeEndpoint(Options("prefill"), &r);
  StatusOr<int> port = e->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const Hello h = MakeHello("decode");
  RawSocket a = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(a.Send(h));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  const PeerRef first = r.First(Event::kUp).peer.ref;
  // Another instance from the same host is another peer, not a replacement.
  RawSocket other = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(other.Send(MakeHello("decode")));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 2));
  EXPECT_EQ(r.Count(Event::kDown), 0u);
  // The same instance again: its old connection goes first.
  RawSocket b = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(b.Send(h));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 3));
  ASSERT_EQ(r.Count(Event::kDown), 1u) << "the down must come before the new up";
  const std::vector<Event> ev = r.Events();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[2].kind, Event::kDown);
  EXPECT_EQ(ev[2].peer.ref, first);
  EXPECT_TRUE(Contains(ev[2].why, "replaced by a new connection of instance " + h.instance_id))
      << ev[2].why.ToString();
  EXPECT_EQ(ev[3].kind, Event::kUp);
  EXPECT_NE(ev[3].peer.ref, first);
  EXPECT_TRUE(a.WaitEof());
  EXPECT_EQ(e->num_peers(), 2);
  EXPECT_EQ(e->Send(first, Heartbeat{1}).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(e->Send(ev[3].peer.ref, Heartbeat{1}).ok());
}

TEST(BootstrapEndpoint, PeerWhoseQueueOverflowsIsDroppedAsStalled) {
  Recorder r;
  EndpointOptions o = Options("prefill", 1000ms, 30000ms);
  o.max_queued_bytes = 256 << 10;
  auto e = MakeEndpoint(o, &r);
  StatusOr<int> port = e->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  RawSocket raw = RawSocket::ConnectTo(*port);  // never reads
  ASSERT_TRUE(raw.Send(MakeHello("decode")));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  const PeerRef ref = r.First(Event::kUp).peer.ref;
  RoomReady big{1, 1, 0, std::vector<int32_t>(20000, 123456)};  // ~140 KB a frame
  Status last;
  int sent = 0;
  for (; sent < 5000 && (last = e->Send(ref, big)).ok(); ++sent) {
  }
  ASSERT_FALSE(last.ok()) << "the kernel buffers cannot hold " << sent << " frames";
  EXPECT_EQ(last.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(last, "stalled")) << last.ToString();
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1));
  EXPECT_TRUE(Contains(r.First(Event::kDown).why, "stalled"))
      << r.First(Event::kDown).why.ToString();
  EXPECT_EQ(e->num_peers(), 0);
}

TEST(BootstrapEndpoint, PeerThatSendsButDoesNotReadIsDropped) {
  Recorder r;
  auto e = MakeEndpoint(Options("prefill", 50ms, 1000ms), &r);
  StatusOr<int> port = e->Listen("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  RawSocket raw = RawSocket::ConnectTo(*port);
  ASSERT_TRUE(raw.Send(MakeHello("decode")));
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  std::atomic<bool> stop{false};
  std::thread beats([&] {  // alive, but never reads
    for (uint64_t i = 0; !stop && raw.Send(Heartbeat{i}); ++i) std::this_thread::sleep_for(50ms);
  });
  const PeerRef ref = r.First(Event::kUp).peer.ref;
  RoomReady big{1, 1, 0, std::vector<int32_t>(50000, 123456)};  // ~350 KB a frame
  for (int i = 0; i < 120 && e->Send(ref, big).ok(); ++i) {
  }
  const bool down = r.WaitCount(Event::kDown, 1);
  stop = true;
  beats.join();
  ASSERT_TRUE(down);
  const Status why = r.First(Event::kDown).why;
  EXPECT_TRUE(Contains(why, "stalled")) << why.ToString();
}

// ---- a peer process killed with SIGKILL --------------------------------------

// Runs only as the child of SpawnChild (re-executing this binary): a
// prefill endpoint on the given port that answers each RoomReady with a
// RoomDone, until it is killed.
class EchoHandler : public Handler {
 public:
  Endpoint* endpoint = nullptr;
  void OnPeerUp(const PeerInfo&) override {}
  void OnMessage(const PeerInfo& peer, Message m) override {
    if (const auto* r = std::get_if<RoomReady>(&m)) {
      (void)endpoint->Send(peer.ref, RoomDone{r->room, 1, 0, {}, r->prompt_tokens, 0, false, ""});
    }
  }
  void OnPeerDown(const PeerInfo&, const Status&) override {}
};

TEST(BootstrapChildProcess, ServesUntilKilled) {
  const char* port = std::getenv("STRATA_BOOTSTRAP_TEST_CHILD_PORT");
  const char* fd = std::getenv("STRATA_BOOTSTRAP_TEST_CHILD_FD");
  if (port == nullptr || fd == nullptr) GTEST_SKIP() << "runs only as a child of the SIGKILL test";
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  EchoHandler h;
  EndpointOptions o = Options("prefill");
  const std::string id = o.hello.instance_id;
  auto e = MakeEndpoint(o, &h);
  ASSERT_NE(e, nullptr);
  h.endpoint = e.get();
  StatusOr<int> bound = e->Listen("127.0.0.1", std::atoi(port));
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  const std::string line = std::to_string(*bound) + " " + id + "\n";
  ASSERT_EQ(write(std::atoi(fd), line.data(), line.size()), static_cast<ssize_t>(line.size()));
  for (;;) pause();
}

struct Child {
  pid_t pid = -1;
  int port = 0;
  std::string instance_id;
  ~Child() { Kill(); }
  void Kill() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

// Starts this test binary again as BootstrapChildProcess.ServesUntilKilled
// listening on `port` (0: any) and reads back its port and instance id.
void SpawnChild(int port, Child* child) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  const int child_fd = 50;  // the pipe's write end, as the child sees it
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  env.push_back("STRATA_BOOTSTRAP_TEST_CHILD_PORT=" + std::to_string(port));
  env.push_back("STRATA_BOOTSTRAP_TEST_CHILD_FD=" + std::to_string(child_fd));
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe",
              filter = "--gtest_filter=BootstrapChildProcess.ServesUntilKilled";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], child_fd);  // dup2 clears O_CLOEXEC
  const int rc = posix_spawn(&child->pid, exe.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  ASSERT_EQ(rc, 0) << strerror(rc);
  std::string line;
  char c;
  pollfd pfd{p[0], POLLIN, 0};
  while (poll(&pfd, 1, 20000) > 0 && read(p[0], &c, 1) == 1 && c != '\n') line += c;
  close(p[0]);
  const size_t sp = line.find(' ');
  ASSERT_NE(sp, std::string::npos) << "the child did not report its port: '" << line << "'";
  child->port = std::atoi(line.substr(0, sp).c_str());
  child->instance_id = line.substr(sp + 1);
}

TEST(BootstrapEndpoint, KilledPeerProcessIsNoticedAndItsReplacementIsUsable) {
  Child first;
  ASSERT_NO_FATAL_FAILURE(SpawnChild(0, &first));
  Recorder r;
  auto e = MakeEndpoint(Options("decode"), &r);  // heartbeat 100 ms, peer timeout 5 s
  const PeerRef ref = e->Connect("127.0.0.1", first.port);
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  EXPECT_EQ(r.First(Event::kUp).peer.hello.instance_id, first.instance_id);
  ASSERT_TRUE(e->Send(ref, RoomReady{1, 10, 0, {1}}).ok());
  ASSERT_TRUE(r.WaitCount(Event::kMessage, 1)) << "the child does not answer";

  const auto t0 = Clock::now();
  first.Kill();  // SIGKILL
  ASSERT_TRUE(r.WaitCount(Event::kDown, 1, 10s)) << "a killed peer was not noticed";
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  std::printf("kill -9 noticed after %lld ms\n", static_cast<long long>(took.count()));
  EXPECT_LT(took, 10s);
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.peer.ref, ref);
  EXPECT_EQ(d.why.code(), StatusCode::kUnavailable);
  EXPECT_EQ(e->Send(ref, RoomReady{2, 10, 0, {1}}).code(), StatusCode::kUnavailable);

  // A new process on the same port (SO_REUSEADDR): Connect works again and
  // the replacement is visible.
  Child second;
  ASSERT_NO_FATAL_FAILURE(SpawnChild(first.port, &second));
  ASSERT_EQ(second.port, first.port);
  ASSERT_NE(second.instance_id, first.instance_id);
  const PeerRef ref2 = e->Connect("127.0.0.1", second.port);
  EXPECT_NE(ref2, ref);
  ASSERT_TRUE(r.WaitCount(Event::kUp, 2));
  const Event up2 = r.Events().back();
  EXPECT_EQ(up2.kind, Event::kUp);
  EXPECT_EQ(up2.peer.ref, ref2);
  EXPECT_EQ(up2.peer.hello.instance_id, second.instance_id);
  EXPECT_EQ(up2.peer.replaced_instance_id, first.instance_id);
  ASSERT_TRUE(e->Send(ref2, RoomReady{3, 10, 0, {1}}).ok());
  ASSERT_TRUE(r.WaitCount(Event::kMessage, 2));
  EXPECT_EQ(std::get<RoomDone>(*r.Events().back().message).room, 3u);
}

TEST(BootstrapEndpoint, StoppedPeerProcessIsDownAfterThePeerTimeout) {
  Child child;
  ASSERT_NO_FATAL_FAILURE(SpawnChild(0, &child));
  Recorder r;
  auto e = MakeEndpoint(Options("decode", 100ms, 500ms), &r);
  const PeerRef ref = e->Connect("127.0.0.1", child.port);
  ASSERT_TRUE(r.WaitCount(Event::kUp, 1));
  ASSERT_TRUE(StopProcess(child.pid));  // its sockets stay open: only silence tells
  const auto t0 = Clock::now();
  const bool down = r.WaitCount(Event::kDown, 1, 10s);
  const auto took = Clock::now() - t0;
  kill(child.pid, SIGCONT);
  ASSERT_TRUE(down) << "a SIGSTOPped peer was never dropped";
  EXPECT_GE(took, 350ms) << "dropped before the peer timeout";
  const Event d = r.First(Event::kDown);
  EXPECT_EQ(d.peer.ref, ref);
  EXPECT_EQ(d.why.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(d.why, "no message")) << d.why.ToString();
  // Resumed, the same process is usable again through a new connection.
  const PeerRef again = e->Connect("127.0.0.1", child.port);
  ASSERT_TRUE(r.WaitCount(Event::kUp, 2));
  EXPECT_TRUE(r.Events().back().peer.replaced_instance_id.empty());
  ASSERT_TRUE(e->Send(again, RoomReady{5, 10, 0, {1}}).ok());
  ASSERT_TRUE(r.WaitCount(Event::kMessage, 1));
}

// ---- destruction ---------------------------------------------------------------

TEST(BootstrapEndpoint, DestructorWithCallbacksInFlightNeitherHangsNorCallsBack) {
  for (int round = 0; round < 3; ++round) {
    Pair p;
    std::atomic<bool> destroyed{false};
    std::atomic<int> after{0};
    std::atomic<int> seen{0};
    p.crec.on_message = [&](const PeerInfo&, const Message&) {
      if (destroyed) ++after;
      ++seen;
      std::this_thread::sleep_for(std::chrono::microseconds(200 * round));  // a slow handler
    };
    std::atomic<bool> stop{false};
    std::thread flood([&] {
      for (uint64_t i = 0; !stop; ++i) {
        if (!p.listener->Send(p.at_listener, RoomDone{i, 1, 0, {}, 1, 0, false, ""}).ok()) break;
        if (i % 256 == 0) std::this_thread::yield();
      }
    });
    const auto flood_deadline = Clock::now() + 10s;
    while (seen < 500 && Clock::now() < flood_deadline) std::this_thread::sleep_for(1ms);
    if (seen < 500) {
      stop = true;
      flood.join();
      FAIL() << "the flood never arrived";
    }
    // A connect in flight and a stalled peer at destruction too.
    RawListener silent;
    p.connector->Connect("127.0.0.1", silent.port());
    RawSocket accepted = silent.Accept();
    const auto t0 = Clock::now();
    p.connector.reset();
    destroyed = true;
    EXPECT_LT(Clock::now() - t0, 5s);
    const size_t events = p.crec.Events().size();
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(after.load(), 0);
    EXPECT_EQ(p.crec.Events().size(), events) << "a callback ran after the destructor";
    // The listener sees the connector go and keeps working.
    ASSERT_TRUE(p.lrec.WaitCount(Event::kDown, 1));
    stop = true;
    flood.join();
    p.listener.reset();
  }
}

TEST(BootstrapEndpoint, DestructorWaitsForARunningCallback) {
  Pair p;
  std::atomic<bool> in_callback{false}, callback_done{false};
  p.crec.on_message = [&](const PeerInfo&, const Message&) {
    in_callback = true;
    std::this_thread::sleep_for(300ms);
    callback_done = true;
  };
  ASSERT_TRUE(p.listener->Send(p.at_listener, RoomDone{1, 1, 0, {}, 1, 0, false, ""}).ok());
  ASSERT_TRUE(p.listener->Send(p.at_listener, RoomDone{2, 1, 0, {}, 1, 0, false, ""}).ok());
  const auto deadline = Clock::now() + 10s;
  while (!in_callback && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(in_callback) << "no message arrived";
  p.connector.reset();
  EXPECT_TRUE(callback_done) << "the destructor returned while a callback still ran";
  std::this_thread::sleep_for(100ms);
  EXPECT_LE(p.crec.Count(Event::kMessage), 1u)
      << "the second message was delivered after destruction";
}

}  // namespace
}  // namespace strata::disagg
