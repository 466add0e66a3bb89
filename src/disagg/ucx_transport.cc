#include "disagg/ucx_transport.h"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>
#include <utility>

#include "disagg/ucx_info.h"
#include "disagg/ucx_messages.h"
#include "util/logging.h"

namespace strata::disagg {

namespace {

using namespace ucx_messages;  // NOLINT: the wire format of this transport

// Rounds of ucp_worker_progress without events before the progress thread
// arms the worker and sleeps: keeps a burst of completions off the sleep
// path without burning a core when idle.
constexpr int kSpinRounds = 256;
// Sleep bound in poll() when idle: a safety net should a transport not
// raise an event. While batches are in flight the thread does not sleep
// (poll timeout 0): with a 1 ms sleep there, 4 KiB puts over tcp looked
// ~1.5x slower (one noisy measurement on a loaded 2-core machine; the
// likely cause, not checked: no worker event when tcp's socket becomes
// writable again). The cost: one busy core on the sender while its writes
// are in flight.
constexpr int kIdlePollMs = 100;
constexpr int kBusyPollMs = 0;
// How long a closed peer's worker is kept (progressed) before it is
// destroyed: the other side's replies to our last puts land in it.
constexpr std::chrono::milliseconds kRetireGrace{2000};

// A message this process sends whose header (and data) must live until UCX
// completes the send: freed by the send's callback.
struct OwnedMessage {
  std::string header;
  std::string data;
};


}  // namespace

class UcxTransport::Impl {
 public:
  struct Batch;
  struct Probe;

  // A worker that receives: the main one (LocalDescriptor's) or a peer's
  // own (LocalDescriptorFor).
  struct Listener {
    Impl* impl = nullptr;  // set by Receive
    std::string key;       // LocalDescriptorFor's; "" for the main worker
    ucp_worker_h worker = nullptr;
    int efd = -1;
    std::string address;
  };

  struct LocalRegion {
    char* base = nullptr;
    size_t length = 0;
    ucp_mem_h memh = nullptr;  // null once FreeRegion unmapped it
    std::string rkey;
    bool allocated = false;  // by AllocateRegion (UCX owns the bytes)
    std::string memory;      // RegionMemory
  };

  struct Peer {
    Impl* impl = nullptr;
    PeerId id = 0;
    UcxDescriptor desc;
    std::atomic<bool> closing{false};  // Disconnect began: no new batch posts
    // Guarded by Impl::mu_.
    bool lost = false;
    std::string lost_reason;
    // Set once `lost` is: PostBatch reads it without mu_ (its per-batch
    // check would otherwise contend with every Write for the mutex).
    std::atomic<bool> lost_seen{false};
    // Progress thread only.
    // The peer's own worker: its endpoint lives there, so what the peer
    // sends back (wireup, replies, keepalives) lands in a receive queue of
    // this peer alone. A shared-memory peer killed while writing into our
    // FIFO leaves an element that never completes and stops that queue for
    // every sender behind it (UCX 1.13's mm transport: seen as every later
    // Connect timing out, PeerDeathTest); with a worker per peer the wedged
    // queue is this one, destroyed kRetireGrace after the peer is closed
    // (ClosePeer, ReapRetired).
    ucp_worker_h worker = nullptr;
    int efd = -1;
    ucp_ep_h ep = nullptr;
    std::vector<ucp_rkey_h> rkeys;
    // Per region: where it is mapped in this process (ucp_rkey_ptr: the
    // peer's memory is shared memory UCX allocated), else null. Cleared
    // with the rkeys (destroying them unmaps it).
    std::vector<char*> direct;
    // Writes by active messages (UcxTransportOptions::writes) instead of
    // ucp_put_nbx: decided at Connect.
    bool by_messages = false;
    bool used_puts = false;  // a put was posted: ClosePeer keeps the worker for kRetireGrace
    uint64_t sender_id = 0;  // random: names this connection's batches at the receiver
    uint64_t next_seq = 0;
    // Connect's probe (kAmProbe) until its reply.
    std::shared_ptr<Probe> probe;
    WireProbe probe_header;
    std::unordered_set<Batch*> batches;  // not yet ended
    std::unordered_map<uint64_t, Batch*> awaiting;  // by messages: by seq, until the ack
    // Batches already ended whose callbacks UCX still owes (Batch::ucx_owes):
    // freed by the last of them, or after the peer's worker is destroyed.
    std::unordered_set<Batch*> orphans;
    bool closed = false;
  };

  // One op resolved at Write time (addresses fixed, regions checked).
  struct Put {
    const char* src = nullptr;
    uint64_t remote_addr = 0;
    size_t length = 0;
    int dst_region = 0;
  };

  // A posted Write. It is in flight (Peer::batches, counted in inflight_)
  // until End; its memory lives until UCX owes it no callback either.
  struct Batch {
    std::shared_ptr<Peer> peer;
    std::vector<Put> puts;
    std::function<void(Status)> done;
    uint64_t bytes = 0;
    bool finished = false;  // ended: done ran
    // Callbacks UCX still owes: the flush (puts), or the sends of pieces
    // that did not complete at once (messages; they read `headers`).
    int ucx_owes = 0;
    // By messages: the batch number, one header per piece, the pieces' run
    // tables one after the other, and each piece's iov (its table, then its
    // runs' source bytes). UCX reads them until the sends complete.
    uint64_t seq = 0;
    std::vector<WireWrite> headers;
    std::vector<WireRun> tables;
    std::vector<ucp_dt_iov_t> iovs;
  };

  // Connect's probe (kAmProbe and its reply); shared with the UCX
  // callbacks, which may outlive a Connect that timed out.
  struct Probe {
    uint64_t value = 0;
    std::promise<ucs_status_t> result;
    bool set = false;  // progress thread only
    void Set(ucs_status_t st) {
      if (set) return;
      set = true;
      result.set_value(st);
    }
  };

  explicit Impl(UcxTransportOptions options) : options_(std::move(options)) {}

  Status Init() {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK)
      return Unavailable(std::string("UCX: reading its configuration failed: ") +
                         ucs_status_string(st));
    // Settings of this context; each one the environment sets is left to it
    // (UCX_TLS through UcxTransportOptions::tls, which overrides it).
    std::vector<std::pair<std::string, std::string>> settings;
    if (!options_.tls.empty()) settings.emplace_back("TLS", options_.tls);
    if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
      settings.emplace_back("KEEPALIVE_INTERVAL",
                            std::to_string(options_.keepalive_interval.count()) + "ms");
    }
    for (const auto& [name, value] : settings) {
      st = ucp_config_modify(config, name.c_str(), value.c_str());
      if (st != UCS_OK) {
        ucp_config_release(config);
        return InvalidArgument("UCX: bad setting UCX_" + name + "=\"" + value +
                               "\": " + ucs_status_string(st));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context_);
    // Shared memory (posix/sysv) needs two settings of its own, made only
    // for a context that offers it (UCX warns of a setting no transport of
    // the context uses), so such a context is made again with them:
    // - MM_ERROR_HANDLING: UCX 1.13 leaves posix/sysv out of endpoints with
    //   peer error handling unless told they may report a dead peer, which
    //   they do from UCX's keepalive (it checks that the peer's pid still
    //   runs the same process; see the header). Without it UCX_TLS=shm finds
    //   no transport for active messages and Connect fails "unreachable".
    // - MM_FIFO_SIZE: puts into memory UCX did not allocate are active
    //   messages through the receiver's FIFO; with UCX's 64 entries the
    //   sender waits for the receiver to wake up every 64 fragments
    //   (UcxTransportOptions::shm_fifo_size).
    // MM_ is the prefix both posix and sysv read; a user's
    // UCX_{POSIX,SYSV,MM}_<name> wins.
    auto user_set = [](const std::string& name) {
      for (const char* tl : {"POSIX", "SYSV", "MM"}) {
        if (std::getenv(("UCX_" + std::string(tl) + "_" + name).c_str()) != nullptr) return true;
      }
      return false;
    };
    if (st == UCS_OK) {
      const std::string offered = " " + ResourcesOf(context_);
      std::vector<std::pair<std::string, std::string>> shm;
      if (!user_set("ERROR_HANDLING")) shm.emplace_back("MM_ERROR_HANDLING", "y");
      if (!user_set("FIFO_SIZE"))
        shm.emplace_back("MM_FIFO_SIZE", std::to_string(options_.shm_fifo_size));
      if (!shm.empty() && (offered.find(" posix/") != std::string::npos ||
                           offered.find(" sysv/") != std::string::npos)) {
        ucp_cleanup(context_);
        context_ = nullptr;
        for (const auto& [name, value] : shm) {
          st = ucp_config_modify(config, name.c_str(), value.c_str());
          if (st != UCS_OK) {
            ucp_config_release(config);
            return InvalidArgument("UCX: bad setting UCX_" + name + "=\"" + value +
                                   "\": " + ucs_status_string(st));
          }
        }
        st = ucp_init(&params, config, &context_);
      }
    }
    ucp_config_release(config);
    if (st != UCS_OK) {
      context_ = nullptr;
      return Unavailable(std::string("UCX: ucp_init failed: ") + ucs_status_string(st) +
                         " (UCX_TLS=\"" + TlsForMessages() +
                         "\"; `ucx_info -d` lists this host's transports)");
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) {
      worker_ = nullptr;
      return Unavailable(std::string("UCX: ucp_worker_create failed: ") + ucs_status_string(st) +
                         " (UCX_TLS=\"" + TlsForMessages() + "\")");
    }
    st = ucp_worker_get_efd(worker_, &efd_);
    if (st != UCS_OK)
      return Unavailable(std::string("UCX: ucp_worker_get_efd failed: ") + ucs_status_string(st));
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (st != UCS_OK)
      return Unavailable(std::string("UCX: ucp_worker_get_address failed: ") +
                         ucs_status_string(st));
    worker_address_.assign(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);
    // (Only with a transport of active messages: UCX 1.13 asserts in the
    // query without one, and Connect then says what to use instead.)
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    if (TlsHaveActiveMessages() &&
        ((st = ucp_worker_query(worker_, &attr)) != UCS_OK ||
         attr.max_am_header < sizeof(WireWrite))) {
      return Unavailable("UCX: its active messages take headers of " +
                         std::to_string(attr.max_am_header) + " bytes, this transport needs " +
                         std::to_string(sizeof(WireWrite)));
    }
    main_rx_.worker = worker_;
    main_rx_.efd = efd_;
    RETURN_IF_ERROR(Receive(&main_rx_));

    std::random_device rd;
    nonce_ = (uint64_t{rd()} << 32) ^ rd();
    label_ = Hostname() + " pid " + std::to_string(getpid());
    resources_ = ResourcesOf(context_);
    STRATA_LOG(INFO) << "KV transport ucx: UCX " << ucp_get_version_string() << ", UCX_TLS=\""
                     << TlsForMessages() << "\", offers: " << resources_;
    thread_ = std::thread([this] { Loop(); });
    owner_ = thread_.get_id();
    return OkStatus();
  }

  ~Impl() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        pending_.store(true, std::memory_order_release);
      }
      ucp_worker_signal(worker_);
      thread_.join();
    }
    // The progress thread is gone: this thread owns the worker now (so a
    // completion that calls Disconnect from here does not wait on itself).
    owner_ = std::this_thread::get_id();
    shutting_down_ = true;
    RunQueued();
    std::map<PeerId, std::shared_ptr<Peer>> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers.swap(peers_);
    }
    for (auto& [id, peer] : peers) ClosePeer(peer);
    // Commands that completions queued while closing: writes fail now.
    while (RunQueued()) {
    }
    ReapRetired(/*all=*/true);
    for (LocalRegion& r : regions_)
      if (r.memh != nullptr) ucp_mem_unmap(context_, r.memh);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  std::string TlsForMessages() const {
    if (!options_.tls.empty()) return options_.tls;
    const char* env = std::getenv("UCX_TLS");
    return env != nullptr ? env : "all";
  }

  // Whether UCX_TLS (as in TlsForMessages) names a transport with active
  // messages, which endpoint setup needs: anything but cma/knem/xpmem/cuda_ipc
  // alone. "all", an exclusion list ("^ib") and aliases count as having them.
  bool TlsHaveActiveMessages() const {
    const std::string tls = TlsForMessages();
    if (tls.empty() || tls[0] == '^') return true;
    size_t start = 0;
    while (start <= tls.size()) {
      size_t end = tls.find(',', start);
      if (end == std::string::npos) end = tls.size();
      const std::string t = tls.substr(start, end - start);
      if (!t.empty() && t != "cma" && t != "knem" && t != "xpmem" && t != "cuda_ipc" &&
          t != "cuda_copy" && t != "rocm_copy" && t != "rocm_ipc")
        return true;
      start = end + 1;
    }
    return false;
  }

  bool OnProgressThread() const { return std::this_thread::get_id() == owner_.load(); }

  // ---- commands (any thread) -------------------------------------------

  // REQUIRES: mu_ held. The caller signals the worker after unlocking.
  void EnqueueLocked(std::function<void()> cmd) {
    queue_.push_back(std::move(cmd));
    pending_.store(true, std::memory_order_release);
  }

  void Signal() { ucp_worker_signal(worker_); }

  // Runs `fn` on the progress thread and waits for it. REQUIRES: not on the
  // progress thread.
  void RunSync(std::function<void()> fn) {
    std::promise<void> finished;
    std::future<void> f = finished.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      EnqueueLocked([&] {
        fn();
        finished.set_value();
      });
    }
    Signal();
    f.wait();
  }

  StatusOr<RegionId> RegisterRegion(void* base, size_t length) {
    if (base == nullptr || length == 0) {
      return InvalidArgument("KV transport: RegisterRegion needs a non-empty region (got base " +
                             std::string(base == nullptr ? "null" : "set") + ", " +
                             std::to_string(length) + " bytes)");
    }
    if (OnProgressThread())
      return FailedPrecondition("KV transport: RegisterRegion called from a completion");
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < regions_.size(); ++i) {
        const LocalRegion& r = regions_[i];
        if (r.allocated && r.memh != nullptr && r.base == base && r.length == length)
          return static_cast<RegionId>(i);
      }
    }
    StatusOr<LocalRegion> region = Internal("unset");
    RunSync([&] { region = MapRegion(base, length); });
    if (!region.ok()) return region.status();
    std::lock_guard<std::mutex> lock(mu_);
    regions_.push_back(*region);
    return static_cast<RegionId>(regions_.size() - 1);
  }

  StatusOr<AllocatedRegion> AllocateRegion(size_t length) {
    if (length == 0)
      return InvalidArgument("KV transport: AllocateRegion needs a non-zero length");
    if (OnProgressThread())
      return FailedPrecondition("KV transport: AllocateRegion called from a completion");
    StatusOr<LocalRegion> region = Internal("unset");
    RunSync([&] { region = MapRegion(nullptr, length); });
    if (!region.ok()) return region.status();
    std::lock_guard<std::mutex> lock(mu_);
    regions_.push_back(*region);
    return AllocatedRegion{static_cast<RegionId>(regions_.size() - 1), region->base,
                           region->length};
  }

  void FreeRegion(RegionId id) {
    ucp_mem_h memh = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (id < 0 || static_cast<size_t>(id) >= regions_.size()) return;
      LocalRegion& r = regions_[static_cast<size_t>(id)];
      if (!r.allocated || r.memh == nullptr) return;
      memh = r.memh;
      r.memh = nullptr;
    }
    if (OnProgressThread()) {
      ucp_mem_unmap(context_, memh);
    } else {
      RunSync([&] { ucp_mem_unmap(context_, memh); });
    }
  }

  std::string RegionMemory(RegionId id) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (id < 0 || static_cast<size_t>(id) >= regions_.size()) return "";
    const LocalRegion& r = regions_[static_cast<size_t>(id)];
    if (r.memh == nullptr) return "freed";
    return r.memory;
  }

  void DisconnectAll() {
    std::vector<PeerId> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, peer] : peers_) ids.push_back(id);
    }
    for (PeerId id : ids) Disconnect(id);
  }

  StatusOr<std::string> LocalDescriptor() { return DescriptorOf(worker_address_); }

  StatusOr<std::string> LocalDescriptorFor(const std::string& key) {
    if (OnProgressThread())
      return FailedPrecondition("KV transport: LocalDescriptorFor from a completion");
    std::string address;
    Status st;
    RunSync([&] { st = ListenerAddress(key, &address); });
    if (!st.ok()) return st;
    return DescriptorOf(address);
  }

  void SetWriteGuard(WriteGuard guard) {
    std::lock_guard<std::mutex> lock(mu_);
    guard_ = guard ? std::make_shared<const WriteGuard>(std::move(guard)) : nullptr;
  }

  void ForgetPeer(const std::string& key) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      EnqueueLocked([this, key] {
        auto it = listeners_.find(key);
        if (it == listeners_.end()) return;
        retired_listeners_.push_back(
            {std::move(it->second), std::chrono::steady_clock::now() + kRetireGrace});
        listeners_.erase(it);
      });
    }
    Signal();
  }

  StatusOr<std::string> DescriptorOf(const std::string& worker_address) {
    UcxDescriptor d;
    d.nonce = nonce_;
    d.label = label_;
    d.worker_address = worker_address;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < regions_.size(); ++i) {
      const LocalRegion& r = regions_[i];
      if (r.memh == nullptr)
        return FailedPrecondition("KV transport: region " + std::to_string(i) +
                                  " was freed; a descriptor would name memory that is gone");
      d.regions.push_back({reinterpret_cast<uint64_t>(r.base), r.length, r.rkey});
    }
    return EncodeUcxDescriptor(d);
  }

  StatusOr<PeerId> Connect(const std::string& descriptor) {
    if (OnProgressThread())
      return FailedPrecondition("KV transport: Connect called from a completion");
    StatusOr<UcxDescriptor> desc = ParseUcxDescriptor(descriptor);
    if (!desc.ok()) return desc.status();
    auto peer = std::make_shared<Peer>();
    peer->impl = this;
    peer->desc = std::move(desc).value();
    auto probe = std::make_shared<Probe>();
    std::future<ucs_status_t> result = probe->result.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer->id = next_peer_id_++;
      EnqueueLocked([this, peer, probe] { StartConnect(peer, probe); });
    }
    Signal();
    std::string why;
    std::string fix =
        "is it up? UCX_TLS=\"" + TlsForMessages() + "\" here; both sides need a common transport";
    if (result.wait_for(options_.connect_timeout) != std::future_status::ready) {
      why = "no answer within " + std::to_string(options_.connect_timeout.count()) + " ms";
    } else if (ucs_status_t st = result.get(); st != UCS_OK) {
      why = ucs_status_string(st);
      if (st == UCS_ERR_UNREACHABLE && TlsHaveActiveMessages()) {
        // Our side can set endpoints up: the peer is down, or its UCX_TLS
        // shares nothing with ours (seen as this, not as a timeout, over tcp).
        fix = "is it up? UCX_TLS=\"" + TlsForMessages() +
              "\" here; if it is, its UCX_TLS shares no transport with this one";
      } else if (st == UCS_ERR_UNREACHABLE) {
        fix =
            "UCX has no transport to it for active messages that can report a dead peer, "
            "which this transport needs (cma alone has no active messages; tcp, shm, posix and "
            "sysv have). UCX_TLS=\"" +
            TlsForMessages() + "\" here: use tcp (any host), or shm / posix,cma (one host)";
        for (const char* v :
             {"UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING", "UCX_MM_ERROR_HANDLING"}) {
          if (const char* val = std::getenv(v))
            fix += std::string("; ") + v + "=" + val + " is set: shared memory needs it on (y)";
        }
      }
    } else if (probe->value != peer->desc.nonce) {
      why = "the process at that address is not the one that wrote the descriptor (restarted?)";
    }
    if (!why.empty()) {
      RunSync([&] { ClosePeer(peer); });
      return Unavailable("KV transport: cannot reach peer " + peer->desc.label + ": " + why + " (" +
                         fix + ")");
    }
    std::string info;
    RunSync([&] {
      info = EpInfo(*peer);
      // UCX prints a "put[i]" line for each lane it puts natively on.
      peer->by_messages =
          options_.writes == UcxTransportOptions::Writes::kMessages ||
          (options_.writes == UcxTransportOptions::Writes::kAuto &&
           info.find("put[") == std::string::npos);
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[peer->id] = peer;
    }
    STRATA_LOG(INFO) << "KV transport ucx: connected to " << peer->desc.label << " (peer "
                     << peer->id << ", " << peer->desc.regions.size() << " regions) over "
                     << LanesOf(info) << ", writes by "
                     << (peer->by_messages ? "active messages" : "puts")
                     << "; writes copied directly into "
                     << std::count_if(peer->direct.begin(), peer->direct.end(),
                                      [](const char* p) { return p != nullptr; })
                     << " of " << peer->desc.regions.size() << " regions";
    STRATA_LOG(DEBUG) << "KV transport ucx: endpoint of peer " << peer->id << ":\n" << info;
    return peer->id;
  }

  void Disconnect(PeerId id) {
    std::shared_ptr<Peer> peer;
    std::promise<void> closed;
    std::future<void> f = closed.get_future();
    const bool wait = !OnProgressThread();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(id);
      if (it == peers_.end()) return;
      peer = it->second;
      peers_.erase(it);
      peer->closing = true;
      // Enqueued under mu_ like every Write of this peer, so no batch of it
      // is posted after the close.
      EnqueueLocked([this, peer, &closed, wait] {
        ClosePeer(peer);
        if (wait) closed.set_value();
      });
    }
    Signal();
    if (wait) f.wait();
  }

  Status Write(PeerId id, std::span<const WriteOp> ops, std::function<void(Status)> done) {
    bool wake = false;
    auto batch = std::make_unique<Batch>();
    batch->done = std::move(done);
    batch->puts.reserve(ops.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(id);
      if (it == peers_.end()) {
        return NotFound("KV transport: no peer " + std::to_string(id) +
                        " (never connected, or disconnected)");
      }
      const Peer& peer = *it->second;
      if (peer.lost) return Unavailable(peer.lost_reason);
      for (size_t i = 0; i < ops.size(); ++i) {
        const WriteOp& op = ops[i];
        // Built only for a message: this loop runs once per put.
        auto name = [i] { return "KV write op " + std::to_string(i) + ": "; };
        if (op.src_region < 0 || static_cast<size_t>(op.src_region) >= regions_.size()) {
          return InvalidArgument(name() + "no local region " + std::to_string(op.src_region) +
                                 " (" + std::to_string(regions_.size()) + " registered)");
        }
        if (op.dst_region < 0 || static_cast<size_t>(op.dst_region) >= peer.desc.regions.size()) {
          return InvalidArgument(name() + "no region " + std::to_string(op.dst_region) +
                                 " at peer " + peer.desc.label + " (" +
                                 std::to_string(peer.desc.regions.size()) + " exported)");
        }
        const LocalRegion& src = regions_[static_cast<size_t>(op.src_region)];
        if (src.memh == nullptr)
          return InvalidArgument(name() + "local region " + std::to_string(op.src_region) +
                                 " was freed");
        const UcxRemoteRegion& dst = peer.desc.regions[static_cast<size_t>(op.dst_region)];
        if (op.src_offset > src.length || op.length > src.length - op.src_offset) {
          return InvalidArgument(name() + "[" + std::to_string(op.src_offset) + ", +" +
                                 std::to_string(op.length) + ") is outside local region " +
                                 std::to_string(op.src_region) + " of " +
                                 std::to_string(src.length) + " bytes");
        }
        if (op.dst_offset > dst.length || op.length > dst.length - op.dst_offset) {
          return InvalidArgument(name() + "[" + std::to_string(op.dst_offset) + ", +" +
                                 std::to_string(op.length) + ") is outside region " +
                                 std::to_string(op.dst_region) + " of peer " + peer.desc.label +
                                 " (" + std::to_string(dst.length) + " bytes)");
        }
        if (op.length == 0) continue;
        batch->puts.push_back(
            {src.base + op.src_offset, dst.base + op.dst_offset, op.length, op.dst_region});
        batch->bytes += op.length;
      }
      batch->peer = it->second;
      EnqueueLocked([this, b = batch.release()] { PostBatch(b); });
      // An awake progress thread sees the command before it sleeps (it
      // checks the queue under mu_ first): the signal, a system call, is
      // needed only when it is in poll(). Writes are the hot path.
      wake = sleeping_;
    }
    if (wake) Signal();
    return OkStatus();
  }

  TransportStats stats() const {
    TransportStats s;
    s.bytes_written = bytes_written_.load();
    s.bytes_copied_directly = direct_bytes_.load();
    s.bytes_by_messages = message_bytes_.load();
    s.writes_ok = writes_ok_.load();
    s.writes_failed = writes_failed_.load();
    s.writes_in_flight = inflight_.load();
    std::lock_guard<std::mutex> lock(mu_);
    s.peers = static_cast<int64_t>(peers_.size());
    return s;
  }

  const std::string& resources() const { return resources_; }

  std::string PeerInfo(PeerId id) {
    std::shared_ptr<Peer> peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(id);
      if (it == peers_.end()) return "";
      peer = it->second;
    }
    if (OnProgressThread()) return EpInfo(*peer);
    std::string info;
    RunSync([&] { info = EpInfo(*peer); });
    return info;
  }

 private:
  // ---- progress thread ---------------------------------------------------

  void Loop() {
    int idle = 0;
    for (;;) {
      // The lock only when something was enqueued (or stop_ set): spinning
      // for completions must not contend with Write for mu_ (2 cores).
      if (pending_.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
      }
      const bool ran = RunQueued();
      ReapRetired(false);
      bool progressed = false;
      while (ucp_worker_progress(worker_) != 0) progressed = true;
      for (Peer* p : live_) {
        while (ucp_worker_progress(p->worker) != 0) progressed = true;
      }
      for (Listener* l : listening_) {
        while (ucp_worker_progress(l->worker) != 0) progressed = true;
      }
      if (ran || progressed) {
        idle = 0;
        continue;
      }
      if (++idle < kSpinRounds) continue;
      idle = 0;
      bool busy = ucp_worker_arm(worker_) == UCS_ERR_BUSY;
      for (Peer* p : live_) busy = busy || ucp_worker_arm(p->worker) == UCS_ERR_BUSY;
      for (Listener* l : listening_) busy = busy || ucp_worker_arm(l->worker) == UCS_ERR_BUSY;
      if (busy) continue;  // events arrived meanwhile
      {
        // A command enqueued after this check signals the armed worker
        // (Write signals only while sleeping_ is set).
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_ || !queue_.empty()) continue;
        sleeping_ = true;
      }
      // Signal() wakes the main worker's descriptor; each peer's worker
      // raises its own for its endpoint's events.
      pollfds_.assign(1, pollfd{efd_, POLLIN, 0});
      for (Peer* p : live_) pollfds_.push_back(pollfd{p->efd, POLLIN, 0});
      for (Listener* l : listening_) pollfds_.push_back(pollfd{l->efd, POLLIN, 0});
      poll(pollfds_.data(), pollfds_.size(), inflight_ > 0 ? kBusyPollMs : kIdlePollMs);
      std::lock_guard<std::mutex> lock(mu_);
      sleeping_ = false;
    }
  }

  // Runs the queued commands; true when there were any.
  bool RunQueued() {
    if (!pending_.load(std::memory_order_acquire)) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.swap(queue_);
      pending_.store(stop_, std::memory_order_relaxed);  // stop_ keeps Loop looking
    }
    for (auto& cmd : running_) cmd();
    const bool ran = !running_.empty();
    running_.clear();  // keeps its capacity: no allocation per batch
    return ran;
  }

  // Registers [base, base + length), or with base null has UCX allocate
  // `length` bytes (UCP_MEM_MAP_ALLOCATE).
  StatusOr<LocalRegion> MapRegion(void* base, size_t length) {
    LocalRegion r;
    r.base = static_cast<char*>(base);
    r.length = length;
    r.allocated = base == nullptr;
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = base;
    p.length = length;
    if (r.allocated) {
      p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      p.flags = UCP_MEM_MAP_ALLOCATE;
    }
    ucs_status_t st = ucp_mem_map(context_, &p, &r.memh);
    if (st != UCS_OK) {
      return Unavailable("KV transport: " +
                         std::string(r.allocated ? "allocating " : "registering ") +
                         std::to_string(length) + " bytes with UCX failed: " +
                         ucs_status_string(st));
    }
    if (r.allocated) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      st = ucp_mem_query(r.memh, &attr);
      const auto addr = reinterpret_cast<uintptr_t>(attr.address);
      if (st != UCS_OK || attr.length < length || addr % 64 != 0) {
        ucp_mem_unmap(context_, r.memh);
        return Unavailable("KV transport: UCX allocated " + std::to_string(length) +
                           " bytes but " +
                           (st != UCS_OK ? std::string("ucp_mem_query failed: ") +
                                               ucs_status_string(st)
                                         : "not 64-byte aligned or shorter than asked"));
      }
      r.base = static_cast<char*>(attr.address);
    }
    r.memory = MemoryKindAt(r.base) + (r.allocated ? " (allocated by ucx)" : " (registered)");
    void* rkey = nullptr;
    size_t rkey_len = 0;
    st = ucp_rkey_pack(context_, r.memh, &rkey, &rkey_len);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, r.memh);
      return Unavailable(std::string("KV transport: packing a UCX remote key failed: ") +
                         ucs_status_string(st));
    }
    r.rkey.assign(static_cast<const char*>(rkey), rkey_len);
    ucp_rkey_buffer_release(rkey);
    return r;
  }

  static void OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->impl->MarkLost(*peer, status);
  }

  void MarkLost(Peer& peer, ucs_status_t status) {
    const std::string reason = std::string("peer lost: ") + ucs_status_string(status) +
                               " (KV transport peer " + peer.desc.label + ")";
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (peer.lost) return;
      peer.lost = true;
      peer.lost_reason = reason;
      peer.lost_seen.store(true, std::memory_order_release);
    }
    // A peer being disconnected ends its batches as "disconnected", however
    // UCX reports the close.
    const Status st = peer.closing ? Aborted("disconnected") : Unavailable(reason);
    if (!peer.closing) STRATA_LOG(WARN) << "KV transport ucx: " << reason;
    // End them now so a caller waiting on them hears at once (UCX
    // completes what it still owes with an error too, and that frees them;
    // no ack comes for writes by messages).
    const std::vector<Batch*> inflight(peer.batches.begin(), peer.batches.end());
    for (Batch* b : inflight) {
      End(b, st);
      FreeIfDone(b);
    }
  }

  void StartConnect(const std::shared_ptr<Peer>& peer, const std::shared_ptr<Probe>& probe) {
    if (shutting_down_) return probe->Set(UCS_ERR_CANCELED);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(peer->desc.worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Impl::OnEpError;
    ep.err_handler.arg = peer.get();
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t st = ucp_worker_create(context_, &wp, &peer->worker);
    if (st != UCS_OK) {
      peer->worker = nullptr;
      return probe->Set(st);
    }
    st = ucp_worker_get_efd(peer->worker, &peer->efd);
    if (st != UCS_OK) return probe->Set(st);  // ClosePeer destroys the worker
    live_.push_back(peer.get());
    st = ucp_ep_create(peer->worker, &ep, &peer->ep);
    if (st != UCS_OK) {
      peer->ep = nullptr;
      return probe->Set(st);
    }
    for (const UcxRemoteRegion& r : peer->desc.regions) {
      ucp_rkey_h rkey = nullptr;
      st = ucp_ep_rkey_unpack(peer->ep, r.rkey.data(), &rkey);
      if (st != UCS_OK) return probe->Set(st);
      peer->rkeys.push_back(rkey);
      void* local = nullptr;
      const bool mapped = options_.direct_copy && ucp_rkey_ptr(rkey, r.base, &local) == UCS_OK;
      peer->direct.push_back(mapped ? static_cast<char*>(local) : nullptr);
    }
    // What the receiver sends back lands in the peer's worker: acks of
    // writes by messages and the probe's reply.
    for (const auto& [id, cb] : {std::pair{kAmAck, &Impl::OnAckAm},
                                 std::pair{kAmProbeReply, &Impl::OnProbeReplyAm}}) {
      ucp_am_handler_param_t h{};
      h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
      h.id = id;
      h.cb = cb;
      h.arg = peer.get();
      h.flags = UCP_AM_FLAG_WHOLE_MSG;
      st = ucp_worker_set_am_recv_handler(peer->worker, &h);
      if (st != UCS_OK) return probe->Set(st);
    }
    // The probe: a message the receiver answers with its nonce. An active
    // message, not a read of a word of the peer's: over tcp UCX 1.13
    // emulates reads with messages whose handler aborts the process that
    // answers when the asker died meanwhile (see PostMessages).
    std::random_device rd;
    peer->sender_id = (uint64_t{rd()} << 32) ^ rd();
    peer->probe = probe;
    peer->probe_header.token = peer->sender_id;
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = &Impl::OnProbeSent;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    auto* holder = new std::shared_ptr<Probe>(probe);
    p.user_data = holder;
    ucs_status_ptr_t req = ucp_am_send_nbx(peer->ep, kAmProbe, &peer->probe_header,
                                           sizeof(peer->probe_header), nullptr, 0, &p);
    if (UCS_PTR_IS_PTR(req)) return;  // OnProbeSent follows; the reply sets the probe
    delete holder;
    if (UCS_PTR_IS_ERR(req)) probe->Set(UCS_PTR_STATUS(req));
  }

  // The probe's send completed: only an error says anything (the reply
  // sets the probe).
  static void OnProbeSent(void* request, ucs_status_t status, void* user_data) {
    auto* holder = static_cast<std::shared_ptr<Probe>*>(user_data);
    if (status != UCS_OK) (*holder)->Set(status);
    delete holder;
    ucp_request_free(request);
  }

  static ucs_status_t OnProbeReplyAm(void* arg, const void* header, size_t header_length,
                                     void* /*data*/, size_t /*length*/,
                                     const ucp_am_recv_param_t* /*param*/) {
    auto* peer = static_cast<Peer*>(arg);
    WireProbe reply;
    if (peer->probe == nullptr || !ReadHeader(header, header_length, &reply) ||
        reply.token != peer->probe_header.token)
      return UCS_OK;  // not our probe's answer
    peer->probe->value = reply.nonce;
    peer->probe->Set(UCS_OK);
    peer->probe = nullptr;
    return UCS_OK;
  }

  void PostBatch(Batch* b) {
    Peer& peer = *b->peer;
    if (shutting_down_) return FinishAndFree(b, Aborted("KV transport shutting down"));
    if (peer.closing) return FinishAndFree(b, Aborted("disconnected"));
    if (peer.lost_seen.load(std::memory_order_acquire)) {
      std::string lost;
      {
        std::lock_guard<std::mutex> lock(mu_);
        lost = peer.lost_reason;
      }
      return FinishAndFree(b, Unavailable(lost));
    }
    if (CopyDirect(*b)) return FinishAndFree(b, OkStatus());
    if (b->puts.empty()) return FinishAndFree(b, OkStatus());
    if (peer.by_messages) return PostMessages(b);
    peer.used_puts = true;
    ucp_request_param_t none{};
    for (const Put& put : b->puts) {
      ucs_status_ptr_t req = ucp_put_nbx(peer.ep, put.src, put.length, put.remote_addr,
                                         peer.rkeys[static_cast<size_t>(put.dst_region)], &none);
      if (UCS_PTR_IS_ERR(req)) {
        MarkLost(peer, UCS_PTR_STATUS(req));
        return FinishAndFree(b, LostStatus(peer, UCS_PTR_STATUS(req)));
      }
      // The flush below reports completion (and errors) of every put.
      if (req != nullptr) ucp_request_free(req);
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Impl::OnFlushDone;
    p.user_data = b;
    ucs_status_ptr_t req = ucp_ep_flush_nbx(peer.ep, &p);
    if (req == nullptr) return FinishAndFree(b, OkStatus());
    if (UCS_PTR_IS_ERR(req)) {
      MarkLost(peer, UCS_PTR_STATUS(req));
      return FinishAndFree(b, LostStatus(peer, UCS_PTR_STATUS(req)));
    }
    b->ucx_owes = 1;
    peer.batches.insert(b);
    ++inflight_;
  }

  // A batch as active messages of our own: each put in pieces of at most
  // kPieceBytes (kAmWrite, eager: UCX's rendezvous over tcp would bring
  // back the emulated puts), and `done` from the receiver's kAmAck once all
  // of them landed (remote completion, as a flush gives the puts). Why not
  // ucp_put_nbx here: over tcp UCX 1.13 has no native puts and emulates each
  // with a message whose handler, in the receiving process, sends a
  // completion back and aborts that process when the send fails ("Fatal:
  // unexpected error: Endpoint timeout", ucp_request.inl), i.e. when the
  // sender died mid-write: a prefill killed mid-transfer would take the
  // decode down with it. Our handler's sends report errors instead.
  void PostMessages(Batch* b) {
    const std::shared_ptr<Peer> keep = b->peer;  // b may end (and go) before this returns
    Peer& peer = *keep;
    b->seq = ++peer.next_seq;
    std::vector<WireRun> ops;
    ops.reserve(b->puts.size());
    for (const Put& put : b->puts) {
      const UcxRemoteRegion& region = peer.desc.regions[static_cast<size_t>(put.dst_region)];
      ops.push_back({static_cast<uint32_t>(put.dst_region), 0, put.remote_addr - region.base,
                     put.length});
    }
    const PiecePlan plan = PlanPieces(ops);
    b->headers.resize(plan.pieces.size());
    b->tables.resize(plan.runs.size());
    for (size_t i = 0; i < plan.runs.size(); ++i) b->tables[i] = plan.runs[i].run;
    b->iovs.resize(plan.runs.size() + plan.pieces.size());
    peer.batches.insert(b);
    peer.awaiting[b->seq] = b;
    ++inflight_;
    // Held while posting: a failed send marks the peer lost, which ends
    // every batch of it, this one too, and must not free it under us.
    ++b->ucx_owes;
    size_t iov_at = 0;
    for (size_t k = 0; k < plan.pieces.size(); ++k) {
      if (b->finished) {  // the peer was lost meanwhile: no more pieces
        --b->ucx_owes;
        return FreeIfDone(b);
      }
      const PlannedPiece& piece = plan.pieces[k];
      WireWrite& h = b->headers[k];
      h.runs = static_cast<uint32_t>(piece.count);
      h.sender = peer.sender_id;
      h.seq = b->seq;
      h.length = piece.bytes;
      h.total = static_cast<uint32_t>(plan.pieces.size());
      ucp_dt_iov_t* iov = &b->iovs[iov_at];
      iov[0] = {&b->tables[piece.first], piece.count * sizeof(WireRun)};
      for (size_t j = 0; j < piece.count; ++j) {
        const PlannedRun& r = plan.runs[piece.first + j];
        iov[1 + j] = {const_cast<char*>(b->puts[r.op].src + r.op_offset), r.run.length};
      }
      iov_at += 1 + piece.count;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
      p.cb.send = &Impl::OnPieceSent;
      p.user_data = b;
      p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
      p.datatype = ucp_dt_make_iov();
      ucs_status_ptr_t req =
          ucp_am_send_nbx(peer.ep, kAmWrite, &h, sizeof(h), iov, 1 + piece.count, &p);
      if (UCS_PTR_IS_PTR(req)) {
        ++b->ucx_owes;
        continue;
      }
      if (UCS_PTR_IS_ERR(req)) {
        MarkLost(peer, UCS_PTR_STATUS(req));
        End(b, LostStatus(peer, UCS_PTR_STATUS(req)));  // if MarkLost did not
        --b->ucx_owes;
        return FreeIfDone(b);
      }
    }
    --b->ucx_owes;
    FreeIfDone(b);  // only if it ended meanwhile
  }

  static void OnPieceSent(void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* b = static_cast<Batch*>(user_data);
    Impl* impl = b->peer->impl;
    --b->ucx_owes;
    if (status != UCS_OK && !b->finished) impl->End(b, impl->LostStatus(*b->peer, status));
    impl->FreeIfDone(b);
  }

  // kAmAck on a peer's worker: the receiver has the batch (or refused it).
  static ucs_status_t OnAckAm(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* /*param*/) {
    auto* peer = static_cast<Peer*>(arg);
    WireAck ack;
    if (!ReadHeader(header, header_length, &ack) || ack.sender != peer->sender_id)
      return UCS_OK;  // not an answer to this connection
    auto it = peer->awaiting.find(ack.seq);
    if (it == peer->awaiting.end()) return UCS_OK;  // already ended (lost, disconnected)
    Batch* b = it->second;
    Impl* impl = peer->impl;
    if (ack.code == kAckOk) {
      impl->message_bytes_ += b->bytes;
      impl->End(b, OkStatus());
    } else {
      const std::string why(static_cast<const char*>(data), data == nullptr ? 0 : length);
      impl->End(b, InvalidArgument("KV transport peer " + peer->desc.label +
                                   " refused a write: " + why));
    }
    impl->FreeIfDone(b);
    return UCS_OK;
  }

  // When every put of `b` goes to a region mapped here (Peer::direct),
  // copies them with memcpy and returns true: the bytes are then in the
  // peer's memory (one host, coherent caches; the fence orders them before
  // whatever the caller sends next, e.g. RoomDone). Otherwise copies
  // nothing. Why not ucp_put_nbx into the same mapping: measured 1.8x
  // slower than this at 256 KiB puts into cold pages and 3.2x with them in
  // L3, and it needs the flush (docs/perf.md "KV transfer (PD)"). A dead
  // peer's segment stays mapped until
  // ClosePeer, so a copy never faults; the dead peer is noticed as before
  // (bootstrap EOF, UCX keepalive).
  bool CopyDirect(Batch& b) {
    const Peer& peer = *b.peer;
    for (const Put& put : b.puts)
      if (peer.direct.empty() || peer.direct[static_cast<size_t>(put.dst_region)] == nullptr)
        return false;
    for (const Put& put : b.puts) {
      const size_t region = static_cast<size_t>(put.dst_region);
      char* dst = peer.direct[region] + (put.remote_addr - peer.desc.regions[region].base);
      std::memcpy(dst, put.src, put.length);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    direct_bytes_ += b.bytes;
    return true;
  }

  static void OnFlushDone(void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* b = static_cast<Batch*>(user_data);
    Impl* impl = b->peer->impl;
    --b->ucx_owes;
    if (!b->finished)
      impl->End(b, status == UCS_OK ? OkStatus() : impl->LostStatus(*b->peer, status));
    impl->FreeIfDone(b);
  }

  Status LostStatus(const Peer& peer, ucs_status_t status) {
    if (peer.closing && status == UCS_ERR_CANCELED) return Aborted("disconnected");
    std::lock_guard<std::mutex> lock(mu_);
    if (peer.lost) return Unavailable(peer.lost_reason);
    return Unavailable(std::string("peer lost: ") + ucs_status_string(status) +
                       " (KV transport peer " + peer.desc.label + ")");
  }

  // Runs `done` once (later calls are no-ops) and counts the outcome.
  void Finish(Batch* b, const Status& st) {
    if (b->finished) return;
    b->finished = true;
    if (st.ok()) {
      bytes_written_ += b->bytes;
      ++writes_ok_;
    } else {
      ++writes_failed_;
    }
    std::function<void(Status)> done = std::move(b->done);
    if (done) done(st);
  }

  // A batch that was never in flight: ended and freed at once.
  void FinishAndFree(Batch* b, const Status& st) {
    Finish(b, st);
    delete b;
  }

  // Ends an in-flight batch: out of the peer's sets and inflight_, `done`
  // run. Its memory stays while UCX owes it callbacks (Peer::orphans).
  void End(Batch* b, const Status& st) {
    if (b->finished) return;
    Peer& peer = *b->peer;
    peer.batches.erase(b);
    if (b->seq != 0) peer.awaiting.erase(b->seq);
    --inflight_;
    Finish(b, st);
    if (b->ucx_owes > 0) peer.orphans.insert(b);
  }

  // Frees an ended batch once UCX owes it nothing (a callback of UCX's
  // calls this last).
  void FreeIfDone(Batch* b) {
    if (!b->finished || b->ucx_owes > 0) return;
    b->peer->orphans.erase(b);
    delete b;
  }

  // Force-closes the endpoint (UCX cancels what is outstanding) and waits
  // until it is gone; then nothing of the peer runs any more.
  void ClosePeer(const std::shared_ptr<Peer>& peer) {
    if (peer->closed) return;
    peer->closed = true;
    peer->closing = true;
    if (peer->ep != nullptr) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &p);
      if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(peer->worker);
        ucp_request_free(req);
      }
      peer->ep = nullptr;
    }
    if (!peer->batches.empty()) {
      // Left in flight: writes by messages whose ack will not come now,
      // and puts whose flush UCX 1.13's forced close leaves uncompleted
      // when a stalled or dead peer never took them (seen over tcp and,
      // more often, shared memory). End them here, or the progress thread
      // would spin for them forever; the memory of those UCX still owes a
      // callback stays (a late callback frees it, else ReapRetired).
      STRATA_LOG(INFO) << "KV transport ucx: " << peer->batches.size()
                       << " batches in flight after closing peer " << peer->desc.label
                       << "; ended as disconnected";
      const std::vector<Batch*> left(peer->batches.begin(), peer->batches.end());
      for (Batch* b : left) {
        End(b, Aborted("disconnected"));
        FreeIfDone(b);
      }
    }
    for (ucp_rkey_h k : peer->rkeys) ucp_rkey_destroy(k);
    peer->rkeys.clear();
    peer->direct.clear();
    // A peer we wrote to with puts keeps its worker up (progressed, polled)
    // for kRetireGrace: the other side may still hold puts of ours in
    // flight, and UCX 1.13 aborts that process when its put handler's reply
    // finds our worker gone (ucp_request.inl "unexpected error: Endpoint
    // timeout"); ReapRetired destroys it after that. Any other peer's worker
    // goes now: what the other side sends it is answered by our own
    // handlers, whose failures are harmless, and a tcp worker kept after a
    // forced close with eager zero-copy messages in flight to a stopped peer
    // segfaulted inside UCX (uct_tcp_iface_progress) when that peer resumed
    // (2 in ~40 runs of StoppedReceiverDisconnectsPromptly.../tcp; 0 in 80
    // with zero-copy off; disagg.md).
    if (peer->worker != nullptr && !peer->used_puts) {
      DestroyWorker(*peer);
    } else if (peer->worker != nullptr) {
      retired_.push_back({peer, std::chrono::steady_clock::now() + kRetireGrace});
    }
  }

  // The address of key's receiving worker, created on first use.
  // Progress thread only.
  Status ListenerAddress(const std::string& key, std::string* address) {
    auto it = listeners_.find(key);
    if (it == listeners_.end()) {
      auto l = std::make_unique<Listener>();
      l->key = key;
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_SINGLE;
      ucs_status_t st = ucp_worker_create(context_, &wp, &l->worker);
      if (st != UCS_OK)
        return Unavailable(std::string("UCX: ucp_worker_create failed: ") +
                           ucs_status_string(st));
      st = ucp_worker_get_efd(l->worker, &l->efd);
      ucp_address_t* addr = nullptr;
      size_t addr_len = 0;
      if (st == UCS_OK) st = ucp_worker_get_address(l->worker, &addr, &addr_len);
      if (st != UCS_OK) {
        ucp_worker_destroy(l->worker);
        return Unavailable(std::string("UCX: a receiving worker for a peer: ") +
                           ucs_status_string(st));
      }
      l->address.assign(reinterpret_cast<const char*>(addr), addr_len);
      ucp_worker_release_address(l->worker, addr);
      if (Status rx = Receive(l.get()); !rx.ok()) {
        ucp_worker_destroy(l->worker);
        return rx;
      }
      it = listeners_.emplace(key, std::move(l)).first;
      RebuildListening();
    }
    *address = it->second->address;
    return OkStatus();
  }

  // Makes `l`'s worker a receiver: writes by messages and probes.
  Status Receive(Listener* l) {
    l->impl = this;
    for (const auto& [id, cb] :
         {std::pair{kAmWrite, &Impl::OnWriteAm}, std::pair{kAmProbe, &Impl::OnProbeAm}}) {
      ucp_am_handler_param_t h{};
      h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
      h.id = id;
      h.cb = cb;
      h.arg = l;
      h.flags = UCP_AM_FLAG_WHOLE_MSG;
      const ucs_status_t st = ucp_worker_set_am_recv_handler(l->worker, &h);
      if (st != UCS_OK)
        return Unavailable(std::string("UCX: setting an active message handler failed: ") +
                           ucs_status_string(st));
    }
    return OkStatus();
  }

  // Sends `msg` (header and data) to `ep`, which owns it until UCX is done
  // with it. Errors are only logged: the peer it answers is gone, which its
  // own endpoint reports.
  static void SendOwned(ucp_ep_h ep, AmId id, OwnedMessage* msg) {
    ucp_request_param_t p{};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      if (status != UCS_OK)
        STRATA_LOG(DEBUG) << "KV transport ucx: an answer to a peer was not sent: "
                          << ucs_status_string(status);
      delete static_cast<OwnedMessage*>(user_data);
      ucp_request_free(request);
    };
    p.user_data = msg;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, msg->header.data(), msg->header.size(),
                                           msg->data.data(), msg->data.size(), &p);
    if (UCS_PTR_IS_PTR(req)) return;
    if (UCS_PTR_IS_ERR(req))
      STRATA_LOG(DEBUG) << "KV transport ucx: an answer to a peer was not sent: "
                        << ucs_status_string(UCS_PTR_STATUS(req));
    delete msg;
  }

  template <typename T>
  static OwnedMessage* Message(const T& header, std::string data = {}) {
    auto* m = new OwnedMessage;
    m->header.assign(reinterpret_cast<const char*>(&header), sizeof(header));
    m->data = std::move(data);
    return m;
  }

  static ucs_status_t OnProbeAm(void* arg, const void* header, size_t header_length,
                                void* /*data*/, size_t /*length*/,
                                const ucp_am_recv_param_t* param) {
    auto* l = static_cast<Listener*>(arg);
    WireProbe probe;
    if (!ReadHeader(header, header_length, &probe)) return UCS_OK;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;  // cannot answer
    probe.nonce = l->impl->nonce_;
    SendOwned(param->reply_ep, kAmProbeReply, Message(probe));
    return UCS_OK;
  }

  static ucs_status_t OnWriteAm(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* l = static_cast<Listener*>(arg);
    l->impl->ReceivePiece(*l, header, header_length, data, length, param);
    return UCS_OK;
  }

  // One piece of a write by messages: checked against this process's
  // regions (never trusted: a piece outside one is refused, not written),
  // copied, and counted; the batch's last piece is answered with kAmAck.
  // Progress thread only.
  void ReceivePiece(const Listener& l, const void* header, size_t header_length, void* data,
                    size_t length, const ucp_am_recv_param_t* param) {
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    WireWrite h;
    if (!ReadHeader(header, header_length, &h) || h.total == 0) {
      STRATA_LOG(WARN) << "KV transport ucx: dropped a malformed write message (" << header_length
                       << "-byte header)";
      if (rndv) ucp_am_data_release(l.worker, data);
      return;
    }
    std::string why;
    std::vector<WireRun> runs;
    const char* payload = nullptr;
    if (rndv) {
      // Our senders send eagerly; a rendezvous would need our reply.
      ucp_am_data_release(l.worker, data);
      why = "a piece came by rendezvous";
    } else if (!ParseRuns(h, data, length, &runs, &payload)) {
      why = "a piece of " + std::to_string(length) + " bytes does not hold the " +
            std::to_string(h.runs) + " runs of " + std::to_string(h.length) + " bytes it announces";
    } else {
      // Every run is checked before any is copied: a refused piece writes nothing.
      std::vector<char*> dst(runs.size());
      std::shared_ptr<const WriteGuard> guard;
      {
        std::lock_guard<std::mutex> lock(mu_);
        guard = guard_;
        for (size_t i = 0; i < runs.size() && why.empty(); ++i) {
          const WireRun& run = runs[i];
          if (run.region >= regions_.size()) {
            why = "no region " + std::to_string(run.region) + " (" +
                  std::to_string(regions_.size()) + " registered)";
          } else if (const LocalRegion& r = regions_[run.region]; r.memh == nullptr) {
            why = "region " + std::to_string(run.region) + " was freed";
          } else if (run.offset > r.length || run.length > r.length - run.offset) {
            why = "[" + std::to_string(run.offset) + ", +" + std::to_string(run.length) +
                  ") is outside region " + std::to_string(run.region) + " of " +
                  std::to_string(r.length) + " bytes";
          } else {
            dst[i] = r.base + run.offset;
          }
        }
      }
      for (size_t i = 0; i < runs.size() && why.empty() && guard != nullptr; ++i)
        why = (*guard)(l.key, static_cast<RegionId>(runs[i].region), runs[i].offset,
                       runs[i].length);
      // FreeRegion unmaps on this thread, so the regions stay while this runs.
      for (size_t i = 0; i < runs.size() && why.empty(); ++i) {
        std::memcpy(dst[i], payload, runs[i].length);
        payload += runs[i].length;
      }
    }
    IncomingBatches::Outcome done = incoming_.Add(h, why, std::chrono::steady_clock::now());
    if (!done.complete) return;
    if (done.code != kAckOk) STRATA_LOG(WARN) << "KV transport ucx: refused a write: " << done.why;
    // The fence orders the copies before whatever the caller hears next.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return;  // cannot answer
    WireAck ack;
    ack.code = done.code;
    ack.sender = h.sender;
    ack.seq = h.seq;
    SendOwned(param->reply_ep, kAmAck, Message(ack, std::move(done.why)));
  }

  void RebuildListening() {
    listening_.clear();
    for (auto& [key, l] : listeners_) listening_.push_back(l.get());
    for (RetiredListener& r : retired_listeners_) listening_.push_back(r.l.get());
  }

  // Destroys the retired peers' workers whose grace has passed (all of
  // them when `all`). Progress thread (or the destructor) only.
  void ReapRetired(bool all) {
    if (!retired_listeners_.empty() || (all && !listeners_.empty())) {
      const auto now = std::chrono::steady_clock::now();
      bool changed = false;
      for (size_t i = 0; i < retired_listeners_.size();) {
        if (!all && retired_listeners_[i].until > now) {
          ++i;
          continue;
        }
        ucp_worker_destroy(retired_listeners_[i].l->worker);
        retired_listeners_[i] = std::move(retired_listeners_.back());
        retired_listeners_.pop_back();
        changed = true;
      }
      if (all) {
        for (auto& [key, l] : listeners_) ucp_worker_destroy(l->worker);
        listeners_.clear();
        changed = true;
      }
      if (changed) RebuildListening();
    }
    if (retired_.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < retired_.size();) {
      if (!all && retired_[i].until > now) {
        ++i;
        continue;
      }
      std::shared_ptr<Peer> peer = std::move(retired_[i].peer);
      retired_[i] = std::move(retired_.back());
      retired_.pop_back();
      DestroyWorker(*peer);
    }
  }

  // Destroys a closed peer's worker. Nothing of the peer can call back once
  // it is gone: the batches UCX still owed callbacks are freed here (their
  // callbacks, should the destroy run them, free them first).
  void DestroyWorker(Peer& peer) {
    live_.erase(std::remove(live_.begin(), live_.end(), &peer), live_.end());
    ucp_worker_destroy(peer.worker);
    peer.worker = nullptr;
    peer.efd = -1;
    for (Batch* b : peer.orphans) delete b;
    peer.orphans.clear();
  }

  std::string EpInfo(const Peer& peer) {
    if (peer.ep == nullptr) return "";
    return CaptureToString([&](FILE* f) { ucp_ep_print_info(peer.ep, f); });
  }

  const UcxTransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;  // what peers connect to (the descriptor's address)
  int efd_ = -1;
  // Progress thread only: the peers whose worker Loop progresses and polls,
  // and its poll set.
  std::vector<Peer*> live_;
  std::vector<pollfd> pollfds_;
  // Closed peers whose worker is kept until `until` (ClosePeer).
  struct Retired {
    std::shared_ptr<Peer> peer;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Retired> retired_;
  // LocalDescriptorFor's receiving workers by key, those ForgetPeer retired
  // (kept for kRetireGrace), and both as Loop progresses and polls them.
  // Progress thread only.
  struct RetiredListener {
    std::unique_ptr<Listener> l;
    std::chrono::steady_clock::time_point until;
  };
  std::map<std::string, std::unique_ptr<Listener>> listeners_;
  std::vector<RetiredListener> retired_listeners_;
  std::vector<Listener*> listening_;
  std::string worker_address_;
  std::string resources_;
  std::string label_;
  uint64_t nonce_ = 0;  // answered to peers' probes (Connect)
  // The main worker as a receiver of kAmWrite/kAmProbe (LocalDescriptor's).
  Listener main_rx_;
  // Batches by messages being received. Progress thread only.
  IncomingBatches incoming_;
  std::thread thread_;
  // The thread that runs UCP calls and completions: the progress thread,
  // then the destroying thread.
  std::atomic<std::thread::id> owner_{};

  mutable std::mutex mu_;
  std::vector<std::function<void()>> queue_;       // guarded by mu_
  // Set (under mu_) with every command and with stop_; cleared when the
  // progress thread takes the queue: it reads it without mu_ while spinning.
  std::atomic<bool> pending_{false};
  std::vector<std::function<void()>> running_;     // progress thread: the commands being run
  bool stop_ = false;                              // guarded by mu_
  bool sleeping_ = false;  // guarded by mu_: the progress thread is in (or entering) poll()
  std::deque<LocalRegion> regions_;                // guarded by mu_; entries never move
  std::shared_ptr<const WriteGuard> guard_;        // guarded by mu_; called without it
  std::map<PeerId, std::shared_ptr<Peer>> peers_;  // guarded by mu_
  PeerId next_peer_id_ = 1;                        // guarded by mu_

  // Progress thread only (the destroying thread after it joined).
  bool shutting_down_ = false;
  // Batches UCX still owes a flush callback; atomic only for stats().
  std::atomic<int64_t> inflight_{0};

  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> direct_bytes_{0};
  std::atomic<uint64_t> message_bytes_{0};
  std::atomic<uint64_t> writes_ok_{0};
  std::atomic<uint64_t> writes_failed_{0};
};

StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxTransportOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;

StatusOr<RegionId> UcxTransport::RegisterRegion(void* base, size_t length) {
  return impl_->RegisterRegion(base, length);
}
StatusOr<KvTransport::AllocatedRegion> UcxTransport::AllocateRegion(size_t length) {
  return impl_->AllocateRegion(length);
}
void UcxTransport::FreeRegion(RegionId id) { impl_->FreeRegion(id); }
std::string UcxTransport::RegionMemory(RegionId id) const { return impl_->RegionMemory(id); }
void UcxTransport::DisconnectAll() { impl_->DisconnectAll(); }
StatusOr<std::string> UcxTransport::LocalDescriptor() { return impl_->LocalDescriptor(); }
StatusOr<std::string> UcxTransport::LocalDescriptorFor(const std::string& key) {
  return impl_->LocalDescriptorFor(key);
}
void UcxTransport::ForgetPeer(const std::string& key) { impl_->ForgetPeer(key); }
void UcxTransport::SetWriteGuard(WriteGuard guard) { impl_->SetWriteGuard(std::move(guard)); }
StatusOr<PeerId> UcxTransport::Connect(const std::string& descriptor) {
  return impl_->Connect(descriptor);
}
void UcxTransport::Disconnect(PeerId peer) { impl_->Disconnect(peer); }
Status UcxTransport::Write(PeerId peer, std::span<const WriteOp> ops,
                           std::function<void(Status)> done) {
  return impl_->Write(peer, ops, std::move(done));
}
TransportStats UcxTransport::stats() const { return impl_->stats(); }
std::string UcxTransport::resources() const { return impl_->resources(); }
std::string UcxTransport::PeerInfo(PeerId peer) { return impl_->PeerInfo(peer); }

}  // namespace strata::disagg
