// Endpoint: the bootstrap connections on Boost.Asio (bootstrap.h has the
// contract). One io_context run by one I/O thread (an implicit strand: no
// handler of one connection runs concurrently with another); every
// connection is a Conn:
//
//   kConnecting --TCP up--> kHandshaking --compatible Hello--> kUp
//        |                       |                               |
//        |   refused / timeout / EOF / error / no Hello / bad frame / heartbeat timeout / stall
//        v                       v                               v
//     kClosed <--linger over or peer's EOF-- kDraining <--Close / protocol error / replaced
//
// Locking: `mu` guards the table of live connections and, per connection,
// `state` and the outgoing queue (Send runs on any thread). A connection's
// state changes only on the I/O thread (under `mu`), so the I/O thread reads
// it without the lock. Callbacks run on the I/O thread with `cb_mu` held and
// `mu` not held, so they may call Send/Connect/Close; the destructor sets
// `stopping`, then waits on `cb_mu` for a running callback: none starts after.
#include "disagg/bootstrap.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "util/logging.h"

namespace strata::disagg {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr size_t kReadChunk = 64 << 10;
// One write takes at most this much of the queue (frames are copied into
// one buffer so write progress can be watched byte by byte).
constexpr size_t kWriteBatch = 1 << 20;
// How long a connection dropped on purpose waits for the peer's EOF.
constexpr milliseconds kMaxLinger{1000};

enum class ConnState { kConnecting, kHandshaking, kUp, kDraining, kClosed };

std::string Frame(const std::string& payload) {
  std::string f(4, '\0');
  const uint32_t n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  f += payload;
  return f;
}

uint32_t ReadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

const char* TypeName(const Message& m) {
  switch (m.index()) {
    case 0:
      return "hello";
    case 1:
      return "room_ready";
    case 2:
      return "room_done";
    case 3:
      return "room_failed";
    default:
      return "heartbeat";
  }
}

bool SameLayout(const KvLayout& a, const KvLayout& b) {
  if (a.page_size != b.page_size || a.groups.size() != b.groups.size()) return false;
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const PoolGroupSpec& x = a.groups[i];
    const PoolGroupSpec& y = b.groups[i];
    if (x.name != y.name || x.num_layers != y.num_layers || x.num_kv_heads != y.num_kv_heads ||
        x.head_dim != y.head_dim || x.dtype != y.dtype || x.has_v != y.has_v ||
        x.sliding_window != y.sliding_window || x.tokens_per_entry != y.tokens_per_entry) {
      return false;
    }
  }
  return true;
}

std::string Ms(milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

struct Conn {
  Conn(net::io_context& ioc, bool out)
      : outbound(out),
        socket(ioc),
        resolver(ioc),
        connect_timer(ioc),
        tick_timer(ioc),
        linger_timer(ioc) {}

  const bool outbound;
  PeerInfo info;     // ref and address from the start; hello once up (I/O thread)
  std::string host;  // outbound: where to connect
  int port = 0;
  tcp::socket socket;
  tcp::resolver resolver;
  net::steady_timer connect_timer;
  net::steady_timer tick_timer;
  net::steady_timer linger_timer;

  // Guarded by Impl::mu (written on the I/O thread only).
  ConnState state = ConnState::kConnecting;
  std::deque<std::string> out;  // framed, not yet handed to a write
  size_t queued_bytes = 0;      // out plus the write in flight
  bool write_posted = false;

  // I/O thread only.
  bool writing = false;
  std::string wbuf;  // the write in flight
  size_t wpos = 0;
  std::string rx;  // bytes read, not yet a whole frame
  std::unique_ptr<char[]> read_buf = std::make_unique<char[]>(kReadChunk);
  Clock::time_point last_rx;           // any byte in (or the TCP connect)
  Clock::time_point last_tx_progress;  // the write in flight last moved
  Clock::time_point last_heartbeat;
  uint64_t heartbeat_seq = 0;
};

struct Endpoint::Impl {
  Impl(EndpointOptions opts, Handler* h)
      : options(std::move(opts)),
        handler(h),
        hello_frame(Frame(EncodeMessage(options.hello))),
        work(net::make_work_guard(ioc)) {}

  // ---- any thread ----
  StatusOr<int> Listen(const std::string& host, int port);
  PeerRef Connect(const std::string& host, int port);
  Status Send(PeerRef ref, const Message& message);
  void Close(PeerRef ref, Status why);

  // ---- I/O thread ----
  void StartConnect(const std::shared_ptr<Conn>& c);
  void Accept(tcp::acceptor* acceptor, net::steady_timer* retry);
  void Start(const std::shared_ptr<Conn>& c);
  void StartRead(const std::shared_ptr<Conn>& c);
  void OnRead(const std::shared_ptr<Conn>& c, boost::system::error_code ec, size_t n);
  void HandleFrame(const std::shared_ptr<Conn>& c, std::string_view payload);
  Status CheckCompatible(const Conn& c, const Hello& peer) const;
  void PeerUp(const std::shared_ptr<Conn>& c, Hello hello);
  void StartWrite(const std::shared_ptr<Conn>& c);
  void WriteSome(const std::shared_ptr<Conn>& c);
  void OnWrite(const std::shared_ptr<Conn>& c, boost::system::error_code ec, size_t n);
  void StartTick(const std::shared_ptr<Conn>& c);
  void OnTick(const std::shared_ptr<Conn>& c);
  // Takes the connection down (once): `graceful` flushes and lingers.
  void Fail(const std::shared_ptr<Conn>& c, const Status& why, bool graceful);
  void CloseNow(const std::shared_ptr<Conn>& c);
  void CloseAll();
  std::string Describe(const Conn& c) const;

  void InvokeUp(const PeerInfo& p) {
    std::lock_guard<std::mutex> lock(cb_mu);
    if (!stopping.load()) handler->OnPeerUp(p);
  }
  void InvokeMessage(const PeerInfo& p, Message m) {
    std::lock_guard<std::mutex> lock(cb_mu);
    if (!stopping.load()) handler->OnMessage(p, std::move(m));
  }
  void InvokeDown(const PeerInfo& p, const Status& why) {
    std::lock_guard<std::mutex> lock(cb_mu);
    if (!stopping.load()) handler->OnPeerDown(p, why);
  }

  const EndpointOptions options;
  Handler* const handler;
  const std::string hello_frame;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::thread thread;

  mutable std::mutex mu;
  std::unordered_map<PeerRef, std::shared_ptr<Conn>> live;  // connecting, handshaking, up
  std::unordered_map<std::string, PeerRef> outbound_at;     // "host:port" -> live outbound
  int64_t num_up = 0;
  PeerRef next_ref = 1;
  struct Listener {
    std::unique_ptr<tcp::acceptor> acceptor;
    std::unique_ptr<net::steady_timer> retry;
  };
  std::vector<Listener> listeners;

  // I/O thread only.
  std::unordered_map<Conn*, std::shared_ptr<Conn>> open;          // every open socket, draining too
  std::unordered_map<std::string, PeerRef> inbound_by_instance;   // up inbound peers
  std::unordered_map<std::string, std::string> last_instance_at;  // address -> instance id
  bool closing_all = false;
  Clock::time_point last_accept_warning;

  // Held while a callback runs. The destructor sets `stopping` first and then
  // takes cb_mu once: a callback running then finishes, and every later one
  // (even one that wins the mutex first) sees `stopping` and is skipped.
  std::mutex cb_mu;
  std::atomic<bool> stopping{false};
};

std::string Endpoint::Impl::Describe(const Conn& c) const {
  std::string role = c.info.hello.role;
  if (role.empty()) role = options.hello.role == "decode" ? "prefill" : "decode";
  std::string s = role + " at " + c.info.address;
  if (!c.info.hello.instance_id.empty()) s += " (instance " + c.info.hello.instance_id + ")";
  return s;
}

// ---- Listen / Connect / Send / Close (any thread) ----------------------

StatusOr<int> Endpoint::Impl::Listen(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  if (port < 0 || port > 65535) {
    return InvalidArgument("cannot listen for bootstrap connections on " + where +
                           ": the port must be 0..65535 (--disaggregation-bootstrap-port)");
  }
  boost::system::error_code ec;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(host, std::to_string(port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return Unavailable("cannot listen for bootstrap connections on " + where +
                       ": cannot resolve '" + host + "': " + ec.message() +
                       "; give an IP address such as 0.0.0.0");
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  auto acceptor = std::make_unique<tcp::acceptor>(ioc);
  auto fail = [&](const char* step) {
    return Unavailable("cannot listen for bootstrap connections on " + where + " (" + step +
                       "): " + ec.message() +
                       (ec == net::error::address_in_use
                            ? "; another process holds the port: stop it or pick another "
                              "--disaggregation-bootstrap-port"
                            : ""));
  };
  if (acceptor->open(endpoint.protocol(), ec)) return fail("open");
  if (acceptor->set_option(net::socket_base::reuse_address(true), ec)) return fail("SO_REUSEADDR");
  if (acceptor->bind(endpoint, ec)) return fail("bind");
  if (acceptor->listen(net::socket_base::max_listen_connections, ec)) return fail("listen");
  const int bound = acceptor->local_endpoint(ec).port();
  if (ec) return fail("local address");
  Listener l{std::move(acceptor), std::make_unique<net::steady_timer>(ioc)};
  tcp::acceptor* a = l.acceptor.get();
  net::steady_timer* retry = l.retry.get();
  {
    std::lock_guard<std::mutex> lock(mu);
    listeners.push_back(std::move(l));
  }
  net::post(ioc, [this, a, retry] { Accept(a, retry); });
  STRATA_LOG(INFO) << "bootstrap: listening on " << host << ":" << bound << " as "
                   << options.hello.role << " (instance " << options.hello.instance_id << ")";
  return bound;
}

PeerRef Endpoint::Impl::Connect(const std::string& host, int port) {
  const std::string address = host + ":" + std::to_string(port);
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = outbound_at.find(address);
    if (it != outbound_at.end()) return it->second;
    c = std::make_shared<Conn>(ioc, /*out=*/true);
    c->info.ref = next_ref++;
    c->info.address = address;
    c->host = host;
    c->port = port;
    live[c->info.ref] = c;
    outbound_at[address] = c->info.ref;
  }
  net::post(ioc, [this, c] { StartConnect(c); });
  return c->info.ref;
}

Status Endpoint::Impl::Send(PeerRef ref, const Message& message) {
  if (std::holds_alternative<Hello>(message)) {
    return InvalidArgument("bootstrap Send: a Hello is sent by the endpoint itself on connect");
  }
  const std::string payload = EncodeMessage(message);
  if (payload.size() > kMaxFrameBytes) {
    return InvalidArgument("bootstrap Send: a " + std::string(TypeName(message)) + " message of " +
                           std::to_string(payload.size()) + " bytes exceeds the " +
                           std::to_string(kMaxFrameBytes >> 20) + " MiB frame limit");
  }
  std::string frame = Frame(payload);
  std::shared_ptr<Conn> c;
  bool post_write = false;
  size_t stalled_at = 0;  // bytes queued when this message found the queue full
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = live.find(ref);
    if (it == live.end()) {
      return Unavailable(
          "bootstrap peer " + std::to_string(ref) +
          " is down or unknown (its connection closed); fail the room with peer_lost");
    }
    c = it->second;
    if (c->queued_bytes > 0 && c->queued_bytes + frame.size() > options.max_queued_bytes) {
      stalled_at = c->queued_bytes;
    } else {
      c->queued_bytes += frame.size();
      c->out.push_back(std::move(frame));
      if (c->state != ConnState::kConnecting && !c->write_posted) {
        c->write_posted = true;
        post_write = true;
      }
    }
  }
  if (stalled_at > 0) {
    const std::string why = "stalled: " + std::to_string(stalled_at) +
                            " bytes of bootstrap messages queued unsent (limit " +
                            std::to_string(options.max_queued_bytes) +
                            "); it does not read its connection";
    net::post(ioc, [this, c, why] { Fail(c, Unavailable(Describe(*c) + " " + why), false); });
    return Unavailable("bootstrap peer at " + c->info.address + " " + why);
  }
  if (post_write) net::post(ioc, [this, c] { StartWrite(c); });
  return OkStatus();
}

void Endpoint::Impl::Close(PeerRef ref, Status why) {
  if (why.ok()) why = Unavailable("closed by this server");
  net::post(ioc, [this, ref, why] {
    std::shared_ptr<Conn> c;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = live.find(ref);
      if (it == live.end()) return;
      c = it->second;
    }
    Fail(c, why, true);
  });
}

// ---- I/O thread ------------------------------------------------------------

void Endpoint::Impl::StartConnect(const std::shared_ptr<Conn>& c) {
  if (c->state != ConnState::kConnecting) return;  // closed before it started
  open[c.get()] = c;
  if (c->port < 1 || c->port > 65535) {
    Fail(c,
         InvalidArgument("cannot connect to bootstrap endpoint " + c->info.address +
                         ": the port must be 1..65535"),
         false);
    return;
  }
  c->connect_timer.expires_after(options.connect_timeout);
  c->connect_timer.async_wait([this, c](boost::system::error_code ec) {
    if (ec || c->state != ConnState::kConnecting) return;
    Fail(c,
         Unavailable("cannot connect to bootstrap endpoint " + c->info.address + " within " +
                     Ms(options.connect_timeout) +
                     " (connect timeout): is the host reachable and the prefill server up?"),
         false);
  });
  c->resolver.async_resolve(
      c->host, std::to_string(c->port), tcp::resolver::numeric_service,
      [this, c](boost::system::error_code ec, tcp::resolver::results_type results) {
        if (c->state != ConnState::kConnecting) return;
        if (ec) {
          Fail(c,
               Unavailable("cannot connect to bootstrap endpoint " + c->info.address +
                           ": cannot resolve '" + c->host + "': " + ec.message()),
               false);
          return;
        }
        net::async_connect(
            c->socket, results, [this, c](boost::system::error_code ec, const tcp::endpoint&) {
              if (c->state != ConnState::kConnecting) return;
              if (ec) {
                Fail(c,
                     Unavailable(
                         "cannot connect to bootstrap endpoint " + c->info.address + ": " +
                         ec.message() +
                         " (is the prefill server running with --disaggregation-bootstrap-port " +
                         std::to_string(c->port) + "?)"),
                     false);
                return;
              }
              c->connect_timer.cancel();
              Start(c);
            });
      });
}

void Endpoint::Impl::Accept(tcp::acceptor* acceptor, net::steady_timer* retry) {
  acceptor->async_accept(
      ioc, [this, acceptor, retry](boost::system::error_code ec, tcp::socket socket) {
        if (closing_all || !acceptor->is_open()) return;
        if (ec) {
          // Out of descriptors (or a transient error): back off rather than
          // spin, and say so once a second at most.
          const Clock::time_point now = Clock::now();
          if (now - last_accept_warning >= std::chrono::seconds(1)) {
            last_accept_warning = now;
            STRATA_LOG(WARN) << "bootstrap: accept failed: " << ec.message()
                             << (ec == net::error::no_descriptors
                                     ? " (raise the open-file limit: ulimit -n)"
                                     : "");
          }
          retry->expires_after(milliseconds(50));
          retry->async_wait([this, acceptor, retry](boost::system::error_code wait_ec) {
            if (!wait_ec && !closing_all) Accept(acceptor, retry);
          });
          return;
        }
        auto c = std::make_shared<Conn>(ioc, /*out=*/false);
        c->socket = std::move(socket);
        boost::system::error_code rec;
        const tcp::endpoint remote = c->socket.remote_endpoint(rec);
        c->info.address = rec ? std::string("unknown peer")
                              : remote.address().to_string() + ":" + std::to_string(remote.port());
        {
          std::lock_guard<std::mutex> lock(mu);
          c->info.ref = next_ref++;
          live[c->info.ref] = c;
        }
        open[c.get()] = c;
        Start(c);
        Accept(acceptor, retry);
      });
}

void Endpoint::Impl::Start(const std::shared_ptr<Conn>& c) {
  boost::system::error_code ec;
  c->socket.set_option(tcp::no_delay(true), ec);  // small frames; latency matters
  std::string frame = hello_frame;
  if (options.descriptor_for) {
    Hello h = options.hello;
    h.transport_descriptor = options.descriptor_for(c->info);
    frame = Frame(EncodeMessage(h));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    c->state = ConnState::kHandshaking;
    c->queued_bytes += frame.size();
    c->out.push_front(std::move(frame));  // before anything Send queued while connecting
    c->write_posted = false;
  }
  const Clock::time_point now = Clock::now();
  c->last_rx = now;
  c->last_heartbeat = now;
  StartRead(c);
  StartWrite(c);
  StartTick(c);
}

void Endpoint::Impl::StartRead(const std::shared_ptr<Conn>& c) {
  c->socket.async_read_some(
      net::buffer(c->read_buf.get(), kReadChunk),
      [this, c](boost::system::error_code ec, size_t n) { OnRead(c, ec, n); });
}

void Endpoint::Impl::OnRead(const std::shared_ptr<Conn>& c, boost::system::error_code ec,
                            size_t n) {
  if (c->state == ConnState::kClosed) return;
  if (c->state == ConnState::kDraining) {
    // Dropped on purpose: discard input until the peer's EOF (or the linger).
    if (ec) {
      CloseNow(c);
    } else {
      StartRead(c);
    }
    return;
  }
  if (ec) {
    Fail(c,
         Unavailable(ec == net::error::eof
                         ? Describe(*c) + " closed the bootstrap connection"
                         : "bootstrap connection to " + Describe(*c) + " broke: " + ec.message()),
         false);
    return;
  }
  c->last_rx = Clock::now();
  c->rx.append(c->read_buf.get(), n);
  size_t pos = 0;
  while (c->state == ConnState::kHandshaking || c->state == ConnState::kUp) {
    if (c->rx.size() - pos < 4) break;
    const uint32_t len = ReadLe32(c->rx.data() + pos);
    if (len > kMaxFrameBytes) {
      Fail(c,
           InvalidArgument("protocol error from " + Describe(*c) + ": a frame of " +
                           std::to_string(len) + " bytes exceeds the " +
                           std::to_string(kMaxFrameBytes >> 20) +
                           " MiB limit (is it a Strata bootstrap endpoint of the same version?)"),
           true);
      break;
    }
    if (c->rx.size() - pos - 4 < len) break;
    HandleFrame(c, std::string_view(c->rx).substr(pos + 4, len));
    pos += 4 + size_t{len};
  }
  if (c->state == ConnState::kClosed) return;
  if (c->state == ConnState::kDraining) {
    c->rx.clear();
    c->rx.shrink_to_fit();
  } else {
    c->rx.erase(0, pos);
    // One large frame must not pin its buffer for the connection's life.
    if (c->rx.empty() && c->rx.capacity() > 4 * kReadChunk) c->rx.shrink_to_fit();
  }
  StartRead(c);
}

void Endpoint::Impl::HandleFrame(const std::shared_ptr<Conn>& c, std::string_view payload) {
  StatusOr<Message> m = DecodeMessage(payload);
  if (!m.ok()) {
    Fail(c, InvalidArgument("protocol error from " + Describe(*c) + ": " + m.status().message()),
         true);
    return;
  }
  if (c->state == ConnState::kHandshaking) {
    Hello* hello = std::get_if<Hello>(&*m);
    if (hello == nullptr) {
      Fail(c,
           InvalidArgument("protocol error from " + Describe(*c) +
                           ": the first message must be a hello, got " + TypeName(*m)),
           true);
      return;
    }
    const Status compatible = CheckCompatible(*c, *hello);
    if (!compatible.ok()) {
      Fail(c, compatible, true);
      return;
    }
    PeerUp(c, std::move(*hello));
    return;
  }
  if (std::holds_alternative<Hello>(*m)) {
    Fail(c,
         InvalidArgument("protocol error from " + Describe(*c) +
                         ": a second hello on one connection"),
         true);
    return;
  }
  if (std::holds_alternative<Heartbeat>(*m)) return;
  InvokeMessage(c->info, std::move(*m));
}

Status Endpoint::Impl::CheckCompatible(const Conn& c, const Hello& peer) const {
  const Hello& self = options.hello;
  const std::string who =
      peer.role + " at " + c.info.address + " (instance " + peer.instance_id + ")";
  if (peer.role == self.role) {
    return FailedPrecondition("bootstrap peer " + who + " is a " + peer.role + " server too: a " +
                              self.role + " server pairs only with " +
                              (self.role == "prefill" ? "decode" : "prefill") +
                              " servers; check the router's --prefill/--decode URLs");
  }
  if (peer.model != self.model) {
    return FailedPrecondition("bootstrap peer " + who + " serves model '" + peer.model +
                              "', this server serves '" + self.model +
                              "': start both roles with the same model (--served-model-name)");
  }
  if (!SameLayout(peer.layout, self.layout)) {
    return FailedPrecondition(
        "bootstrap peer " + who + " has KV layout [page size " +
        std::to_string(peer.layout.page_size) + "; " + peer.layout.Describe() +
        "], this server [page size " + std::to_string(self.layout.page_size) + "; " +
        self.layout.Describe() +
        "]: start both roles with the same model, --page-size and --kv-cache-dtype");
  }
  if (peer.transport != self.transport) {
    return FailedPrecondition("bootstrap peer " + who + " moves KV over '" + peer.transport +
                              "', this server over '" + self.transport +
                              "': set the same --disaggregation-transfer-backend on both roles");
  }
  return OkStatus();
}

void Endpoint::Impl::PeerUp(const std::shared_ptr<Conn>& c, Hello hello) {
  const std::string& id = hello.instance_id;
  if (c->outbound) {
    std::string& last = last_instance_at[c->info.address];
    if (!last.empty() && last != id) {
      c->info.replaced_instance_id = last;
      STRATA_LOG(WARN) << "bootstrap: " << hello.role << " at " << c->info.address
                       << " was replaced: instance " << last << " -> " << id;
    }
    last = id;
  } else {
    auto it = inbound_by_instance.find(id);
    if (it != inbound_by_instance.end()) {
      std::shared_ptr<Conn> old;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto l = live.find(it->second);
        if (l != live.end()) old = l->second;
      }
      if (old) {
        Fail(old,
             Unavailable(Describe(*old) + " was replaced by a new connection of instance " + id +
                         " from " + c->info.address),
             true);
      }
    }
    inbound_by_instance[id] = c->info.ref;
  }
  c->info.hello = std::move(hello);
  {
    std::lock_guard<std::mutex> lock(mu);
    c->state = ConnState::kUp;
    ++num_up;
  }
  STRATA_LOG(INFO) << "bootstrap: " << Describe(*c) << " is up";
  InvokeUp(c->info);
}

void Endpoint::Impl::StartWrite(const std::shared_ptr<Conn>& c) {
  if (c->writing || c->state == ConnState::kConnecting || c->state == ConnState::kClosed) return;
  c->wbuf.clear();
  c->wpos = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    c->write_posted = false;
    while (!c->out.empty() &&
           (c->wbuf.empty() || c->wbuf.size() + c->out.front().size() <= kWriteBatch)) {
      c->wbuf += c->out.front();
      c->out.pop_front();
    }
  }
  if (c->wbuf.empty()) {
    if (c->state == ConnState::kDraining) {
      boost::system::error_code ec;
      c->socket.shutdown(tcp::socket::shutdown_send, ec);  // everything queued is out: FIN
    }
    return;
  }
  c->writing = true;
  c->last_tx_progress = Clock::now();
  WriteSome(c);
}

void Endpoint::Impl::WriteSome(const std::shared_ptr<Conn>& c) {
  c->socket.async_write_some(
      net::buffer(c->wbuf.data() + c->wpos, c->wbuf.size() - c->wpos),
      [this, c](boost::system::error_code ec, size_t n) { OnWrite(c, ec, n); });
}

void Endpoint::Impl::OnWrite(const std::shared_ptr<Conn>& c, boost::system::error_code ec,
                             size_t n) {
  if (c->state == ConnState::kClosed) {
    c->writing = false;
    return;
  }
  if (ec) {
    c->writing = false;
    if (c->state == ConnState::kDraining) {
      CloseNow(c);
    } else {
      Fail(c,
           Unavailable("bootstrap connection to " + Describe(*c) +
                       " broke while writing: " + ec.message()),
           false);
    }
    return;
  }
  c->wpos += n;
  c->last_tx_progress = Clock::now();
  if (c->wpos < c->wbuf.size()) {
    WriteSome(c);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    c->queued_bytes -= std::min(c->queued_bytes, c->wbuf.size());
  }
  c->writing = false;
  StartWrite(c);
}

void Endpoint::Impl::StartTick(const std::shared_ptr<Conn>& c) {
  // Often enough to see a timeout within a quarter of peer_timeout.
  const milliseconds period =
      std::max(milliseconds(1), std::min(options.heartbeat_interval, options.peer_timeout / 4));
  c->tick_timer.expires_after(period);
  c->tick_timer.async_wait([this, c](boost::system::error_code ec) {
    if (ec || (c->state != ConnState::kHandshaking && c->state != ConnState::kUp)) return;
    OnTick(c);
  });
}

void Endpoint::Impl::OnTick(const std::shared_ptr<Conn>& c) {
  const Clock::time_point now = Clock::now();
  if (now - c->last_rx > options.peer_timeout) {
    Fail(c,
         Unavailable(c->state == ConnState::kUp
                         ? "no message from " + Describe(*c) + " for " + Ms(options.peer_timeout) +
                               " (peer timeout): the peer is stalled, stopped or unreachable"
                         : "no hello from " + Describe(*c) + " within " + Ms(options.peer_timeout) +
                               " of connecting: is it a Strata bootstrap endpoint?"),
         false);
    return;
  }
  if (c->writing && now - c->last_tx_progress > options.peer_timeout) {
    Fail(c,
         Unavailable(Describe(*c) +
                     " stalled: it has read none of our pending bootstrap messages for " +
                     Ms(options.peer_timeout) + " (peer timeout)"),
         false);
    return;
  }
  if (now - c->last_heartbeat >= options.heartbeat_interval) {
    c->last_heartbeat = now;
    bool kick = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      // Anything queued or in flight says we are alive as well as a heartbeat.
      if (c->out.empty() && !c->writing) {
        std::string f = Frame(EncodeMessage(Heartbeat{++c->heartbeat_seq}));
        c->queued_bytes += f.size();
        c->out.push_back(std::move(f));
        kick = true;
      }
    }
    if (kick) StartWrite(c);
  }
  StartTick(c);
}

void Endpoint::Impl::Fail(const std::shared_ptr<Conn>& c, const Status& why, bool graceful) {
  if (c->state == ConnState::kDraining || c->state == ConnState::kClosed) return;
  const bool was_up = c->state == ConnState::kUp;
  // Only a connected socket can be flushed and shut down.
  graceful = graceful && c->state != ConnState::kConnecting;
  {
    std::lock_guard<std::mutex> lock(mu);
    live.erase(c->info.ref);
    if (c->outbound) {
      auto it = outbound_at.find(c->info.address);
      if (it != outbound_at.end() && it->second == c->info.ref) outbound_at.erase(it);
    }
    if (was_up) --num_up;
    c->state = graceful ? ConnState::kDraining : ConnState::kClosed;
    if (!graceful) {
      c->out.clear();
      c->queued_bytes = 0;
    }
  }
  if (!c->outbound && was_up) {
    auto it = inbound_by_instance.find(c->info.hello.instance_id);
    if (it != inbound_by_instance.end() && it->second == c->info.ref) inbound_by_instance.erase(it);
  }
  c->connect_timer.cancel();
  c->tick_timer.cancel();
  c->resolver.cancel();
  if (graceful) {
    c->linger_timer.expires_after(std::min(kMaxLinger, options.peer_timeout));
    c->linger_timer.async_wait([this, c](boost::system::error_code ec) {
      if (!ec) CloseNow(c);
    });
    StartWrite(c);  // flushes what is queued, then shuts down for writing
  } else {
    CloseNow(c);
  }
  const bool notify = was_up || c->outbound;
  if (was_up) {
    STRATA_LOG(WARN) << "bootstrap: lost " << Describe(*c) << ": " << why.message();
  } else {
    STRATA_LOG(WARN) << "bootstrap: connection " << (c->outbound ? "to " : "from ")
                     << c->info.address << " did not come up: " << why.message();
  }
  if (notify) InvokeDown(c->info, why);
}

void Endpoint::Impl::CloseNow(const std::shared_ptr<Conn>& c) {
  {
    std::lock_guard<std::mutex> lock(mu);
    c->state = ConnState::kClosed;
  }
  boost::system::error_code ec;
  c->socket.close(ec);
  c->connect_timer.cancel();
  c->tick_timer.cancel();
  c->linger_timer.cancel();
  c->resolver.cancel();
  open.erase(c.get());
}

void Endpoint::Impl::CloseAll() {
  closing_all = true;
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (Listener& l : listeners) {
      boost::system::error_code ec;
      l.acceptor->close(ec);
      l.retry->cancel();
    }
    for (auto& [ref, c] : live) conns.push_back(c);
    live.clear();
    outbound_at.clear();
    num_up = 0;
  }
  for (auto& [p, c] : open) conns.push_back(c);
  for (const std::shared_ptr<Conn>& c : conns) CloseNow(c);
  open.clear();
}

// ---- Endpoint --------------------------------------------------------------

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<Endpoint>> Endpoint::Create(EndpointOptions options, Handler* handler) {
  if (handler == nullptr) return InvalidArgument("bootstrap endpoint: no handler");
  StatusOr<Message> own = DecodeMessage(EncodeMessage(options.hello));
  if (!own.ok()) {
    return InvalidArgument("bootstrap endpoint: this server's own hello is invalid: " +
                           own.status().message());
  }
  if (options.heartbeat_interval.count() <= 0 || options.connect_timeout.count() <= 0) {
    return InvalidArgument(
        "bootstrap endpoint: heartbeat interval and connect timeout must be > 0 ms");
  }
  if (options.peer_timeout < 2 * options.heartbeat_interval) {
    return InvalidArgument("bootstrap endpoint: the peer timeout (" + Ms(options.peer_timeout) +
                           ") must be at least twice the heartbeat interval (" +
                           Ms(options.heartbeat_interval) +
                           "), or live peers time out between heartbeats");
  }
  if (options.max_queued_bytes == 0)
    return InvalidArgument("bootstrap endpoint: max_queued_bytes must be > 0");
  auto impl = std::make_unique<Impl>(std::move(options), handler);
  Impl* p = impl.get();
  try {
    impl->thread = std::thread([p] { p->ioc.run(); });
  } catch (const std::exception& e) {
    return Internal(std::string("bootstrap endpoint: cannot start its I/O thread: ") + e.what());
  }
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

Endpoint::~Endpoint() {
  STRATA_CHECK(std::this_thread::get_id() != impl_->thread.get_id())
      << "a bootstrap Endpoint must not be destroyed from its own handler callback";
  impl_->stopping.store(true);
  { std::lock_guard<std::mutex> wait_for_running_callback(impl_->cb_mu); }
  Impl* p = impl_.get();
  net::post(p->ioc, [p] { p->CloseAll(); });
  p->work.reset();
  p->thread.join();  // run() returns once every closed socket's handlers ran
}

StatusOr<int> Endpoint::Listen(const std::string& host, int port) {
  return impl_->Listen(host, port);
}
PeerRef Endpoint::Connect(const std::string& host, int port) { return impl_->Connect(host, port); }
Status Endpoint::Send(PeerRef peer, const Message& message) { return impl_->Send(peer, message); }
void Endpoint::Close(PeerRef peer, const Status& why) { impl_->Close(peer, why); }

int64_t Endpoint::num_peers() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->num_up;
}

}  // namespace strata::disagg
