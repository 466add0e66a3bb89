#include "disagg/pd_role.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "disagg/bootstrap.h"
#include "disagg/kv_transport.h"
#include "disagg/page_grants.h"
#include "disagg/page_ops.h"
#include "engine/request.h"
#include "util/logging.h"

namespace strata::disagg {
namespace {

using Clock = std::chrono::steady_clock;

// How often rooms without an engine request are checked for expiry.
constexpr std::chrono::milliseconds kReapInterval{100};

Status RoomError(FailureReason reason, const std::string& message) {
  return Unavailable(std::string(FailureReasonName(reason)) + ": " + message);
}

// "kv_full: ..." from the scheduler is the decode refusing the room.
FailureReason ReasonForAbort(const Status& why) {
  FailureReason r;
  const std::string& m = why.message();
  const size_t colon = m.find(':');
  if (colon != std::string::npos && ParseFailureReason(m.substr(0, colon), &r)) return r;
  if (m.rfind("kv_full", 0) == 0) return FailureReason::kRejected;
  return FailureReason::kAborted;
}

bool SameLayout(const KvLayout& a, const KvLayout& b) {
  if (a.page_size != b.page_size || a.groups.size() != b.groups.size()) return false;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    const PoolGroupSpec &x = a.groups[g], &y = b.groups[g];
    if (x.name != y.name || x.num_layers != y.num_layers || x.num_kv_heads != y.num_kv_heads ||
        x.head_dim != y.head_dim || x.dtype != y.dtype || x.has_v != y.has_v)
      return false;
  }
  return true;
}

// Everything both roles share: the endpoint, the transport over the pool's
// memory, metrics, the lock, and the reaper thread.
class RoleBase : public PdRole, public Handler {
 public:
  RoleBase(const PdOptions& options, const KvPool& pool, std::shared_ptr<KvTransport> transport,
           metrics::Registry& registry)
      : options_(options),
        pool_(pool),
        registry_(registry),
        instance_(NewInstanceId()),
        transport_(std::move(transport)) {}

  ~RoleBase() override { Shutdown(); }

  // Stops the reaper, then the endpoint (no handler call after), then the
  // transport (its last completions see shutting_down_ and do nothing).
  // Subclasses call it first in their destructors: their state outlives it.
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(reap_mu_);
      stop_ = true;
    }
    reap_cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutting_down_ = true;
    }
    endpoint_.reset();
    // The pool's memory may keep the transport alive after the role: no
    // completion of ours may run once we are gone.
    if (transport_) {
      transport_->DisconnectAll();
      if (grants_) transport_->SetWriteGuard(nullptr);
    }
    transport_.reset();
  }

  const std::string& mode() const override { return options_.mode; }
  const std::string& instance_id() const override { return instance_; }

  Status Init() {
    if (!transport_) return InvalidArgument("PD role: no KV transport given");
    const KvPoolMemory mem = pool_.memory();
    const KvLayout& layout = pool_.layout();
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      const PoolGroupSpec& spec = layout.groups[g];
      const size_t bytes = static_cast<size_t>(spec.num_layers) * (spec.has_v ? 2 : 1) *
                           static_cast<size_t>(pool_.num_pages()) *
                           layout.BytesPerPagePerTensor(static_cast<int>(g));
      auto id = transport_->RegisterRegion(mem.group_base[g], bytes);
      if (!id.ok())
        return id.status().Annotate("registering KV pool group " + spec.name + " for PD transfer");
      if (*id != static_cast<RegionId>(g))
        return Internal("transport region ids are not in registration order");
      STRATA_LOG(INFO) << "PD: KV pool group " << spec.name << " (" << bytes
                       << " bytes) in " << transport_->RegionMemory(*id);
    }
    ASSIGN_OR_RETURN(
        auto* bytes,
        registry_.AddCounter("strata_kv_transfer_bytes_total",
                             "KV bytes written to decode servers (prefill) by PD transfer.", {}));
    bytes_ = &bytes->Get();
    ASSIGN_OR_RETURN(
        auto* pages,
        registry_.AddCounter("strata_kv_transfer_pages_total",
                             "KV pages written to decode servers (prefill) by PD transfer.", {}));
    pages_ = &pages->Get();
    ASSIGN_OR_RETURN(auto* secs,
                     registry_.AddHistogram(
                         "strata_kv_transfer_seconds",
                         "Per request: from the decode's page registration to the KV and first "
                         "token delivered (RoomReady to RoomDone).",
                         {}, {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}));
    seconds_ = &secs->Get();
    ASSIGN_OR_RETURN(auto* infl, registry_.AddGauge("strata_kv_transfers_in_flight",
                                                    "Rooms whose KV transfer is under way.", {}));
    in_flight_ = &infl->Get();
    ASSIGN_OR_RETURN(failures_,
                     registry_.AddCounter("strata_kv_transfer_failures_total",
                                          "PD rooms that failed, by reason.", {"reason"}));
    for (auto r : {FailureReason::kBootstrapTimeout, FailureReason::kTransferTimeout,
                   FailureReason::kPeerLost, FailureReason::kAborted, FailureReason::kRejected})
      failures_->Get({FailureReasonName(r)});
    ASSIGN_OR_RETURN(
        auto* depth,
        registry_.AddGauge("strata_bootstrap_queued_requests",
                           "Prefill requests waiting for their decode's page registration.", {}));
    queue_depth_ = &depth->Get();
    ASSIGN_OR_RETURN(auto* peers,
                     registry_.AddGauge("strata_disagg_peers", "Connected PD peers.", {}));
    peers_ = &peers->Get();

    Hello hello;
    hello.instance_id = instance_;
    hello.role = options_.mode;
    hello.model = options_.model;
    hello.layout = layout;
    hello.num_pages = pool_.num_pages();
    hello.transport = transport_->name();
    EndpointOptions eo;
    if (options_.mode == "decode") {
      ASSIGN_OR_RETURN(hello.transport_descriptor, transport_->LocalDescriptor());
      // Each prefill connection writes through a receiving worker of its
      // own (ForgetPeer at OnPeerDown): a prefill killed mid-write cannot
      // stop the others' (disagg.md "Open bug"). The shared descriptor
      // stays the fallback.
      eo.descriptor_for = [this, shared = hello.transport_descriptor](const PeerInfo& p) {
        StatusOr<std::string> d = transport_->LocalDescriptorFor(PeerKey(p));
        if (d.ok()) {
          STRATA_LOG(INFO) << "PD: prefill " << p.address
                           << " gets a transport descriptor of its own";
          return *d;
        }
        STRATA_LOG(WARN) << "PD: no transport descriptor of its own for prefill " << p.address
                         << " (" << d.status().message() << "); it shares the decode's";
        return shared;
      };
      // Writes the decode's transport applies itself (over tcp) land only
      // in pages an open room of the writing connection holds: a prefill
      // that resumes after the decode gave its room up cannot write into
      // pages another request has now (disagg.md "Known limit").
      grants_ = std::make_shared<PageGrants>(pool_.layout(), pool_.num_pages());
      transport_->SetWriteGuard([g = grants_](const std::string& key, RegionId region,
                                              uint64_t offset, uint64_t length) {
        return g->Check(key, region, offset, length);
      });
    }
    eo.hello = hello;
    eo.heartbeat_interval = options_.heartbeat_interval;
    eo.peer_timeout = options_.peer_timeout;
    ASSIGN_OR_RETURN(endpoint_, Endpoint::Create(eo, this));
    reaper_ = std::thread([this] { ReapLoop(); });
    return OkStatus();
  }

 protected:
  void CountFailure(FailureReason r) { failures_->Get({FailureReasonName(r)}).Inc(); }

  // The transport's key (LocalDescriptorFor, ForgetPeer) of a bootstrap connection.
  static std::string PeerKey(const PeerInfo& p) { return PeerKey(p.ref); }
  static std::string PeerKey(PeerRef ref) { return "bootstrap#" + std::to_string(ref); }

  // Called every kReapInterval on the reaper thread.
  virtual void Reap(Clock::time_point now) = 0;

  void ReapLoop() {
    std::unique_lock<std::mutex> lock(reap_mu_);
    while (!stop_) {
      reap_cv_.wait_for(lock, kReapInterval);
      if (stop_) break;
      lock.unlock();
      Reap(Clock::now());
      peers_->Set(static_cast<double>(endpoint_->num_peers()));
      lock.lock();
    }
  }

  const PdOptions options_;
  const KvPool& pool_;
  metrics::Registry& registry_;
  const std::string instance_;
  std::shared_ptr<KvTransport> transport_;
  std::unique_ptr<Endpoint> endpoint_;
  // Decode: the pages each prefill connection may write now (its rooms'
  // between RoomReady and RoomDone or the request's end).
  std::shared_ptr<PageGrants> grants_;
  metrics::Counter* bytes_ = nullptr;
  metrics::Counter* pages_ = nullptr;
  metrics::Histogram* seconds_ = nullptr;
  metrics::Gauge* in_flight_ = nullptr;
  metrics::Family<metrics::Counter>* failures_ = nullptr;
  metrics::Gauge* queue_depth_ = nullptr;
  metrics::Gauge* peers_ = nullptr;

  std::mutex mu_;               // the rooms and peers of the subclass
  bool shutting_down_ = false;  // under mu_: endpoint_ and transport_ may be gone

 private:
  std::mutex reap_mu_;
  std::condition_variable reap_cv_;
  bool stop_ = false;
  std::thread reaper_;
};

// ---- prefill -------------------------------------------------------------

class PrefillRole final : public RoleBase {
 public:
  using RoleBase::RoleBase;

  ~PrefillRole() override {
    StopConnector();
    Shutdown();
  }

  Status Listen() {
    ASSIGN_OR_RETURN(port_, endpoint_->Listen(options_.bootstrap_host, options_.bootstrap_port));
    return OkStatus();
  }
  int bootstrap_port() const override { return port_; }

  struct Room {
    uint64_t id = 0;
    std::string request_id;
    bool has_request = false;
    Clock::time_point arrival;
    // From the decode's RoomReady.
    bool ready = false;
    PeerRef peer = 0;
    PeerId tpeer = 0;
    int64_t num_dst_pages_total = 0;  // the decode's pool size
    int64_t first_page = 0;
    std::vector<int32_t> dst_pages;
    int64_t prompt_tokens = 0;
    Clock::time_point ready_at;
    // Writes.
    int outstanding = 0;
    bool completed = false;
    FirstToken first;
    bool done_sent = false;
    // Failure: the error the engine sees; whether the decode must be told
    // (once no write of the room is in flight).
    bool failed = false;
    Status error;
    FailureReason reason = FailureReason::kAborted;
    bool tell_decode = false;
    bool released = false;  // the engine request ended
    bool polled = false;    // the engine saw it (it was admitted to the queue)
  };

  class Export final : public KvExport {
   public:
    Export(PrefillRole* role, std::shared_ptr<Room> room) : role_(role), room_(std::move(room)) {}
    ~Export() override { role_->Release(room_); }
    bool Ready() override {
      std::lock_guard<std::mutex> lock(role_->mu_);
      return role_->ReadyLocked(*room_);
    }
    void PagesComputed(int64_t first_page, std::span<const int32_t> pages) override {
      role_->WritePages(room_, first_page, pages);
    }
    void Complete(int64_t first_page, std::span<const int32_t> pages,
                  const FirstToken& first) override {
      role_->CompleteRoom(room_, first_page, pages, first);
    }
    HandoffState Poll(Status* error) override { return role_->PollRoom(room_, error); }
    void Abort(const Status& why) override {
      std::lock_guard<std::mutex> lock(role_->mu_);
      role_->FailLocked(*room_, FailureReason::kAborted, why.message(), /*tell_decode=*/true);
    }

   private:
    PrefillRole* role_;
    std::shared_ptr<Room> room_;
  };

  StatusOr<Handoff> NewHandoff(const RoomAddress& address, const std::string& request_id,
                               Clock::time_point arrival) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Room>& r = rooms_[address.room];
    if (!r) {
      r = std::make_shared<Room>();
      r->id = address.room;
    } else if (r->has_request) {
      return InvalidArgument("bootstrap_room " + std::to_string(address.room) +
                             " is already in use on this prefill server");
    }
    r->has_request = true;
    r->request_id = request_id;
    r->arrival = arrival;
    Handoff h;
    h.kv_export = std::make_shared<Export>(this, r);
    return h;
  }

  // Handler (endpoint I/O thread).
  void OnPeerUp(const PeerInfo& peer) override {
    std::string problem;
    const Hello& h = peer.hello;
    if (h.role != "decode")
      problem = "the peer at " + peer.address + " is a " + h.role + " server, not a decode server";
    else if (h.model != options_.model)
      problem = "the decode serves model '" + h.model + "', this prefill '" + options_.model + "'";
    else if (!SameLayout(h.layout, pool_.layout()))
      problem = "KV layouts differ: decode " + h.layout.Describe() + " (page size " +
                std::to_string(h.layout.page_size) + "), prefill " + pool_.layout().Describe() +
                " (page size " + std::to_string(pool_.layout().page_size) +
                "); start both with the same model, --page-size and --kv-cache-dtype";
    else if (h.transport != transport_->name())
      problem = "the decode uses transfer backend " + h.transport + ", this prefill " +
                transport_->name();
    if (!problem.empty())
      STRATA_LOG(WARN) << "PD: decode " << peer.address << " (instance " << h.instance_id
                       << ") refused: " << problem;
    std::lock_guard<std::mutex> lock(mu_);
    peers_by_ref_[peer.ref] = PeerState{0, problem, h.num_pages};
    // The transport's Connect waits for the peer (up to its timeout): off
    // this I/O thread, which carries every peer's heartbeats.
    if (problem.empty()) {
      connects_.push_back(
          PendingConnect{peer.ref, peer.address, h.instance_id, h.transport_descriptor});
      connect_cv_.notify_one();
    }
  }

  void StartConnector() {
    connector_ = std::thread([this] { ConnectLoop(); });
  }

  void StopConnector() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      connect_stop_ = true;
    }
    connect_cv_.notify_all();
    if (connector_.joinable()) connector_.join();
  }

  void OnMessage(const PeerInfo& peer, Message message) override {
    if (auto* ready = std::get_if<RoomReady>(&message)) return OnRoomReady(peer, *ready);
    if (auto* failed = std::get_if<RoomFailed>(&message)) return OnRoomFailed(peer, *failed);
    STRATA_LOG(WARN) << "PD: unexpected message from decode " << peer.address << "; ignored";
  }

  void OnPeerDown(const PeerInfo& peer, const Status& why) override {
    PeerId tpeer = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_by_ref_.find(peer.ref);
      if (it != peers_by_ref_.end()) {
        tpeer = it->second.tpeer;
        peers_by_ref_.erase(it);
      }
      for (auto& [id, r] : rooms_)
        if (r->ready && r->peer == peer.ref && !r->done_sent)
          FailLocked(*r, FailureReason::kPeerLost,
                     "the decode at " + peer.address + " went away (" + why.message() + ")",
                     /*tell_decode=*/false);
    }
    if (!peer.hello.instance_id.empty())
      STRATA_LOG(WARN) << "PD: decode " << peer.address << " down: " << why.message();
    if (tpeer) transport_->Disconnect(tpeer);  // outside mu_: its callbacks take it
  }

 private:
  struct PeerState {
    PeerId tpeer = 0;     // 0 while the transport connects
    std::string problem;  // non-empty: every room of this peer is rejected
    int64_t num_pages = 0;
  };
  struct PendingConnect {
    PeerRef ref = 0;
    std::string address, instance, descriptor;
  };

  // A room may be admitted once its decode registered and the transport
  // to that decode is connected.
  bool ReadyLocked(Room& r) {
    if (!r.ready || r.failed) return false;
    if (r.tpeer) return true;
    auto it = peers_by_ref_.find(r.peer);
    if (it == peers_by_ref_.end() || !it->second.tpeer) return false;
    r.tpeer = it->second.tpeer;
    return true;
  }

  void ConnectLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      connect_cv_.wait(lock, [&] { return connect_stop_ || !connects_.empty(); });
      if (connect_stop_) return;
      PendingConnect pc = std::move(connects_.front());
      connects_.pop_front();
      lock.unlock();
      auto c = transport_->Connect(pc.descriptor);
      lock.lock();
      auto it = peers_by_ref_.find(pc.ref);
      if (it == peers_by_ref_.end() || connect_stop_) {  // went down meanwhile
        if (c.ok()) {
          lock.unlock();
          transport_->Disconnect(*c);
          lock.lock();
        }
        continue;
      }
      if (c.ok()) {
        it->second.tpeer = *c;
        STRATA_LOG(INFO) << "PD: decode " << pc.address << " connected (instance " << pc.instance
                         << ")";
        continue;
      }
      const std::string why = "cannot connect the KV transport to the decode at " + pc.address +
                              ": " + c.status().ToString();
      STRATA_LOG(WARN) << "PD: " << why;
      it->second.problem = why;
      for (auto& [id, r] : rooms_)
        if (r->ready && r->peer == pc.ref) FailLocked(*r, FailureReason::kPeerLost, why, true);
      lock.unlock();
      endpoint_->Close(pc.ref, Unavailable(why));
      lock.lock();
    }
  }

  void OnRoomReady(const PeerInfo& peer, const RoomReady& m) {
    std::lock_guard<std::mutex> lock(mu_);
    auto pit = peers_by_ref_.find(peer.ref);
    const std::string problem =
        pit == peers_by_ref_.end() ? "the decode's connection is not set up" : pit->second.problem;
    std::shared_ptr<Room>& r = rooms_[m.room];
    if (!r) {
      r = std::make_shared<Room>();
      r->id = m.room;
      r->arrival = Clock::now();  // the router's request to us may still be on its way
    }
    if (r->failed) {  // we already ended it (e.g. shed by admission): say so
      Send(peer.ref, RoomFailed{m.room, r->reason, r->error.message()});
      return;
    }
    if (r->ready) {
      Send(peer.ref, RoomFailed{m.room, FailureReason::kRejected, "room registered twice"});
      return;
    }
    r->peer = peer.ref;
    if (!problem.empty()) {
      FailLocked(*r, FailureReason::kRejected, problem, /*tell_decode=*/true);
      return;
    }
    r->ready = true;
    r->num_dst_pages_total = pit->second.num_pages;
    r->first_page = m.first_page;
    r->dst_pages = m.dst_pages;
    r->prompt_tokens = m.prompt_tokens;
    r->ready_at = Clock::now();
  }

  void OnRoomFailed(const PeerInfo& peer, const RoomFailed& m) {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Room>& r = rooms_[m.room];
    if (!r) {
      r = std::make_shared<Room>();
      r->id = m.room;
      r->arrival = Clock::now();
    }
    r->peer = peer.ref;
    if (r->done_sent) return;  // crossed with our RoomDone: the decode sees that
    // The decode ended the room: the engine ends its request; the decode is
    // answered once no write of the room is in flight (FailLocked).
    if (!r->failed) {
      r->failed = true;
      r->reason = m.reason;
      r->error = RoomError(m.reason, "the decode ended the request: " + m.message);
      CountFailure(m.reason);
    }
    r->tell_decode = true;
    MaybeTellDecodeLocked(*r);
  }

  void Send(PeerRef peer, const Message& m) {
    if (shutting_down_) return;
    Status st = endpoint_->Send(peer, m);
    if (!st.ok()) STRATA_LOG(DEBUG) << "PD: send to decode failed: " << st.ToString();
  }

  void FailLocked(Room& r, FailureReason reason, const std::string& message, bool tell_decode) {
    if (r.done_sent) return;
    if (!r.failed) {
      r.failed = true;
      r.reason = reason;
      r.error = RoomError(reason, message);
      CountFailure(reason);
    }
    if (tell_decode && r.peer) r.tell_decode = true;
    MaybeTellDecodeLocked(r);
  }

  // The decode frees its pages when it hears of a failure: only once
  // nothing of ours writes into them any more.
  void MaybeTellDecodeLocked(Room& r) {
    if (!r.tell_decode || r.outstanding > 0 || !r.peer) return;
    r.tell_decode = false;
    Send(r.peer, RoomFailed{r.id, r.reason, r.error.message()});
  }

  void WritePages(const std::shared_ptr<Room>& rp, int64_t first_page,
                  std::span<const int32_t> pages) {
    std::vector<int32_t> src, dst;
    PeerId tpeer;
    int64_t dst_total;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Room& r = *rp;
      if (r.failed || !r.ready) return;
      for (size_t i = 0; i < pages.size(); ++i) {
        const int64_t k = first_page + static_cast<int64_t>(i);
        if (k < r.first_page) continue;  // a decode-side prefix hit
        const int64_t j = k - r.first_page;
        if (j >= static_cast<int64_t>(r.dst_pages.size())) {
          FailLocked(r, FailureReason::kRejected,
                     "the decode registered " + std::to_string(r.dst_pages.size()) +
                         " pages from page " + std::to_string(r.first_page) +
                         ", the prompt has more: the servers tokenized differently",
                     true);
          return;
        }
        src.push_back(pages[i]);
        dst.push_back(r.dst_pages[static_cast<size_t>(j)]);
      }
      if (src.empty()) return;
      r.outstanding++;
      tpeer = r.tpeer;
      dst_total = r.num_dst_pages_total;
    }
    auto ops = PageWriteOps(pool_.layout(), PoolRegions{pool_.num_pages(), 0},
                            PoolRegions{dst_total, 0}, src, dst);
    Status st = ops.status();
    const uint64_t bytes = [&] {
      uint64_t b = 0;
      if (ops.ok())
        for (const WriteOp& op : *ops) b += op.length;
      return b;
    }();
    const size_t npages = src.size();
    if (st.ok()) {
      st = transport_->Write(tpeer, *ops, [this, rp, bytes, npages](Status done) {
        std::lock_guard<std::mutex> lock(mu_);
        rp->outstanding--;
        if (shutting_down_) return;
        if (done.ok()) {
          bytes_->Inc(static_cast<double>(bytes));
          pages_->Inc(static_cast<double>(npages));
        } else {
          FailLocked(*rp, FailureReason::kPeerLost,
                     "KV write to the decode failed: " + done.ToString(), true);
        }
        MaybeSendDoneLocked(*rp);
        MaybeTellDecodeLocked(*rp);
      });
    }
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      rp->outstanding--;
      FailLocked(*rp, FailureReason::kPeerLost, "KV write to the decode failed: " + st.ToString(),
                 true);
    }
  }

  void CompleteRoom(const std::shared_ptr<Room>& rp, int64_t first_page,
                    std::span<const int32_t> pages, const FirstToken& first) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Room& r = *rp;
      if (r.failed) return;
      if (first.prompt_tokens != r.prompt_tokens) {
        FailLocked(r, FailureReason::kRejected,
                   "the decode tokenized the prompt into " + std::to_string(r.prompt_tokens) +
                       " tokens, this prefill into " + std::to_string(first.prompt_tokens) +
                       ": both servers must serve the same model and tokenizer",
                   true);
        return;
      }
      r.outstanding++;  // held while the last pages are posted
    }
    WritePages(rp, first_page, pages);
    std::lock_guard<std::mutex> lock(mu_);
    rp->outstanding--;
    rp->completed = true;
    rp->first = first;
    MaybeSendDoneLocked(*rp);
    MaybeTellDecodeLocked(*rp);
  }

  void MaybeSendDoneLocked(Room& r) {
    if (!r.completed || r.failed || r.done_sent || r.outstanding > 0) return;
    RoomDone d;
    d.room = r.id;
    d.first_token = r.first.token;
    d.logprob = r.first.logprob;
    for (const TokenLogprob& t : r.first.top_logprobs)
      d.top_logprobs.push_back({t.token_id, t.logprob});
    d.prompt_tokens = r.first.prompt_tokens;
    d.cached_tokens = r.first.cached_tokens;
    d.finished = r.first.finish != FinishReason::kNone;
    if (d.finished) d.finish_reason = FinishReasonName(r.first.finish);
    if (shutting_down_) return;
    Status st = endpoint_->Send(r.peer, d);
    if (!st.ok()) {
      FailLocked(r, FailureReason::kPeerLost,
                 "cannot send the first token to the decode: " + st.message(), false);
      return;
    }
    r.done_sent = true;
    seconds_->Observe(std::chrono::duration<double>(Clock::now() - r.ready_at).count());
  }

  HandoffState PollRoom(const std::shared_ptr<Room>& rp, Status* error) {
    std::lock_guard<std::mutex> lock(mu_);
    Room& r = *rp;
    r.polled = true;
    const auto now = Clock::now();
    if (!r.failed && !r.ready && now > r.arrival + options_.bootstrap_timeout)
      FailLocked(r, FailureReason::kBootstrapTimeout,
                 "no decode registered this request's pages within " +
                     std::to_string(options_.bootstrap_timeout.count()) +
                     " ms (--disaggregation-bootstrap-timeout-ms)",
                 false);
    if (!r.failed && r.ready && !r.done_sent && now > r.ready_at + options_.transfer_timeout)
      FailLocked(r, FailureReason::kTransferTimeout,
                 "the KV transfer did not complete within " +
                     std::to_string(options_.transfer_timeout.count()) +
                     " ms (--disaggregation-transfer-timeout-ms)",
                 true);
    if (r.failed) {
      *error = r.error;
      return HandoffState::kFailed;
    }
    return r.done_sent ? HandoffState::kDone : HandoffState::kPending;
  }

  // The export is gone (its request ended): the room is forgotten unless a
  // write is still in flight (its callback holds the room) — then it stays
  // until the bootstrap timeout, answering late messages.
  void Release(const std::shared_ptr<Room>& rp) {
    std::lock_guard<std::mutex> lock(mu_);
    // Never polled: the server refused it before the engine queued it
    // (admission limits, a bad request), which the decode hears as rejected.
    if (!rp->failed && !rp->done_sent)
      FailLocked(*rp, rp->polled ? FailureReason::kAborted : FailureReason::kRejected,
                 rp->polled ? "the prefill request ended"
                            : "the prefill refused the request (admission limits)",
                 true);
    rp->has_request = false;
    rp->released = true;
    rp->arrival = Clock::now();
  }

  void Reap(Clock::time_point now) override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t waiting = 0, moving = 0;
    for (auto it = rooms_.begin(); it != rooms_.end();) {
      Room& r = *it->second;
      if (r.has_request) {
        if (!r.ready && !r.failed) waiting++;
        if (r.ready && !r.failed && !r.done_sent) moving++;
        ++it;
        continue;
      }
      // No engine request (yet, or any more): a RoomReady whose request
      // never came, a tombstone of a failure, or a finished room.
      if (now < r.arrival + options_.bootstrap_timeout || r.outstanding > 0) {
        ++it;
        continue;
      }
      if (!r.released && r.ready && !r.failed)
        FailLocked(r, FailureReason::kBootstrapTimeout,
                   "the router's request for this room never reached the prefill", true);
      it = rooms_.erase(it);
    }
    queue_depth_->Set(static_cast<double>(waiting));
    in_flight_->Set(static_cast<double>(moving));
  }

  int port_ = 0;
  std::thread connector_;
  std::condition_variable connect_cv_;
  std::deque<PendingConnect> connects_;
  bool connect_stop_ = false;
  std::unordered_map<uint64_t, std::shared_ptr<Room>> rooms_;
  std::unordered_map<PeerRef, PeerState> peers_by_ref_;
};

// ---- decode --------------------------------------------------------------

class DecodeRole final : public RoleBase {
 public:
  using RoleBase::RoleBase;

  ~DecodeRole() override { Shutdown(); }

  int bootstrap_port() const override { return 0; }

  struct Room {
    uint64_t id = 0;
    std::string request_id;
    std::string address;  // the prefill's bootstrap host:port
    PeerRef peer = 0;
    bool reserved = false;
    Clock::time_point reserved_at;
    bool done = false;
    FirstToken first;
    bool failed = false;  // over on our side (error set)
    Status error;
    bool aborting = false;  // we told the prefill; waiting for its answer
    Clock::time_point abort_at;
    bool settled = false;  // the prefill answered or is gone: nothing writes
    std::vector<int32_t> granted;  // pages the prefill may write (PageGrants), until revoked
  };

  class Import final : public KvImport {
   public:
    Import(DecodeRole* role, std::shared_ptr<Room> room) : role_(role), room_(std::move(room)) {}
    ~Import() override { role_->Release(room_); }
    void Reserved(int64_t first_page, std::span<const int32_t> pages,
                  int64_t prompt_tokens) override {
      role_->SendReady(room_, first_page, pages, prompt_tokens);
    }
    HandoffState Poll(FirstToken* first, Status* error) override {
      return role_->PollRoom(room_, first, error);
    }
    void Abort(const Status& why) override { role_->AbortRoom(room_, why); }

   private:
    DecodeRole* role_;
    std::shared_ptr<Room> room_;
  };

  StatusOr<Handoff> NewHandoff(const RoomAddress& address, const std::string& request_id,
                               Clock::time_point arrival) override {
    const std::string where = address.host + ":" + std::to_string(address.port);
    const PeerRef peer =
        endpoint_->Connect(address.host, address.port);  // at once: overlaps the queue wait
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Room>& r = rooms_[Key(where, address.room)];
    if (r && !r->request_id.empty())
      return InvalidArgument("bootstrap_room " + std::to_string(address.room) +
                             " is already in use on this decode server");
    if (!r) {
      r = std::make_shared<Room>();
      r->id = address.room;
    }
    r->request_id = request_id;
    r->address = where;
    r->peer = peer;
    (void)arrival;
    Handoff h;
    h.kv_import = std::make_shared<Import>(this, r);
    return h;
  }

  void OnPeerUp(const PeerInfo& peer) override {
    const Hello& h = peer.hello;
    std::string problem;
    if (h.role != "prefill")
      problem =
          "the server at " + peer.address + " is a " + h.role + " server, not a prefill server";
    else if (h.model != options_.model)
      problem = "the prefill serves model '" + h.model + "', this decode '" + options_.model + "'";
    else if (!SameLayout(h.layout, pool_.layout()))
      problem = "KV layouts differ: prefill " + h.layout.Describe() + " (page size " +
                std::to_string(h.layout.page_size) + "), decode " + pool_.layout().Describe() +
                " (page size " + std::to_string(pool_.layout().page_size) + ")";
    if (!problem.empty()) {
      STRATA_LOG(WARN) << "PD: prefill " << peer.address << " refused: " << problem;
      endpoint_->Close(peer.ref, FailedPrecondition(problem));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::string& last = instance_by_address_[peer.address];
    if (!last.empty() && last != h.instance_id)
      STRATA_LOG(WARN) << "PD: prefill at " << peer.address << " was replaced: instance " << last
                       << " -> " << h.instance_id;
    else
      STRATA_LOG(INFO) << "PD: prefill " << peer.address << " connected (instance " << h.instance_id
                       << ")";
    last = h.instance_id;
  }

  void OnMessage(const PeerInfo& peer, Message message) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto* done = std::get_if<RoomDone>(&message)) {
      auto it = rooms_.find(Key(peer.address, done->room));
      if (it == rooms_.end()) return;
      Room& r = *it->second;
      r.settled = true;  // the prefill's writes for the room are complete
      RevokeLocked(r);
      if (r.failed || r.done) return;
      r.done = true;
      r.first.token = done->first_token;
      r.first.logprob = done->logprob;
      for (const FirstTokenLogprob& t : done->top_logprobs)
        r.first.top_logprobs.push_back({t.token, t.logprob});
      r.first.prompt_tokens = done->prompt_tokens;
      r.first.cached_tokens = done->cached_tokens;
      r.first.finish = !done->finished                 ? FinishReason::kNone
                       : done->finish_reason == "stop" ? FinishReason::kStop
                                                       : FinishReason::kLength;
      if (r.reserved)
        seconds_->Observe(std::chrono::duration<double>(Clock::now() - r.reserved_at).count());
      return;
    }
    if (auto* failed = std::get_if<RoomFailed>(&message)) {
      std::shared_ptr<Room>& rp = rooms_[Key(peer.address, failed->room)];
      if (!rp) {  // before the router's request reached us: remembered
        rp = std::make_shared<Room>();
        rp->id = failed->room;
        rp->address = peer.address;
        rp->abort_at = Clock::now();
      }
      Room& r = *rp;
      r.settled = true;  // the prefill sends RoomFailed only with no write in flight
      if (r.done) return;
      if (!r.failed) {
        r.failed = true;
        r.error = RoomError(failed->reason, "the prefill ended the request: " + failed->message);
        CountFailure(failed->reason);
      }
      return;
    }
    STRATA_LOG(WARN) << "PD: unexpected message from prefill " << peer.address << "; ignored";
  }

  void OnPeerDown(const PeerInfo& peer, const Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, rp] : rooms_) {
      Room& r = *rp;
      if (r.peer != peer.ref || r.done) continue;
      r.settled = true;  // a closed peer writes nothing more
      if (!r.failed) {
        // FailedPrecondition: the endpoint found the two servers incompatible.
        const bool incompatible = why.code() == StatusCode::kFailedPrecondition;
        const FailureReason reason =
            incompatible ? FailureReason::kRejected : FailureReason::kPeerLost;
        r.failed = true;
        r.error = RoomError(reason, incompatible ? "the prefill at " + peer.address +
                                                       " cannot serve this decode: " + why.message()
                                                 : "the prefill at " + peer.address +
                                                       " is unreachable or went away (" +
                                                       why.message() + ")");
        CountFailure(reason);
      }
    }
    if (!peer.hello.instance_id.empty())
      STRATA_LOG(WARN) << "PD: prefill " << peer.address << " down: " << why.message();
    transport_->ForgetPeer(PeerKey(peer));
  }

 private:
  static std::string Key(const std::string& address, uint64_t room) {
    return address + "#" + std::to_string(room);
  }

  void SendReady(const std::shared_ptr<Room>& rp, int64_t first_page,
                 std::span<const int32_t> pages, int64_t prompt_tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    Room& r = *rp;
    r.reserved = true;
    r.reserved_at = Clock::now();
    if (r.failed) return;  // the prefill already refused: nothing will write
    RevokeLocked(r);  // a room reserved again grants its new pages only
    r.granted.assign(pages.begin(), pages.end());
    grants_->Grant(PeerKey(r.peer), r.granted);
    RoomReady m;
    m.room = r.id;
    m.prompt_tokens = prompt_tokens;
    m.first_page = first_page;
    m.dst_pages.assign(pages.begin(), pages.end());
    Status st = shutting_down_ ? Unavailable("shutting down") : endpoint_->Send(r.peer, m);
    if (!st.ok()) {
      r.failed = true;
      r.settled = true;
      r.error = RoomError(FailureReason::kPeerLost,
                          "cannot reach the prefill at " + r.address + ": " + st.message());
      CountFailure(FailureReason::kPeerLost);
    }
  }

  // Over on our side: tell the prefill, and (pages reserved) wait for its
  // answer before the pages may go.
  void StartAbortLocked(Room& r, FailureReason reason, const Status& error,
                        const std::string& message) {
    if (r.done || r.failed) return;
    r.failed = true;
    r.error = error;
    CountFailure(reason);
    if (!r.reserved) r.settled = true;  // no page of ours was ever named
    r.aborting = true;
    r.abort_at = Clock::now();
    if (!shutting_down_) (void)endpoint_->Send(r.peer, RoomFailed{r.id, reason, message});
  }

  void AbortRoom(const std::shared_ptr<Room>& rp, const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    const FailureReason reason = ReasonForAbort(why);
    StartAbortLocked(*rp, reason, why, why.message());
  }

  HandoffState PollRoom(const std::shared_ptr<Room>& rp, FirstToken* first, Status* error) {
    std::unique_lock<std::mutex> lock(mu_);
    Room& r = *rp;
    const auto now = Clock::now();
    if (r.done) {
      *first = r.first;
      return HandoffState::kDone;
    }
    if (!r.failed && r.reserved && now > r.reserved_at + options_.transfer_timeout) {
      const std::string msg = "the prefill at " + r.address + " did not deliver the KV within " +
                              std::to_string(options_.transfer_timeout.count()) +
                              " ms (--disaggregation-transfer-timeout-ms)";
      StartAbortLocked(r, FailureReason::kTransferTimeout,
                       RoomError(FailureReason::kTransferTimeout, msg), msg);
    }
    if (!r.failed) return HandoffState::kPending;
    if (!r.settled) {
      // A prefill that does not answer our abort within the heartbeat
      // timeout is treated as lost: its connection is dropped, after which
      // it can write nothing (OnPeerDown settles the room).
      if (now > r.abort_at + options_.peer_timeout && !shutting_down_) {
        const PeerRef peer = r.peer;
        lock.unlock();
        endpoint_->Close(peer, Unavailable("the prefill did not acknowledge an ended room within " +
                                           std::to_string(options_.peer_timeout.count()) + " ms"));
      }
      return HandoffState::kPending;
    }
    *error = r.error;
    return HandoffState::kFailed;
  }

  // The room's pages are no longer the prefill's to write. REQUIRES: mu_.
  void RevokeLocked(Room& r) {
    if (r.granted.empty()) return;
    grants_->Revoke(PeerKey(r.peer), r.granted);
    r.granted.clear();
  }

  void Release(const std::shared_ptr<Room>& rp) {
    std::lock_guard<std::mutex> lock(mu_);
    Room& r = *rp;
    RevokeLocked(r);  // its pages go back to the pool
    if (!r.done && !r.failed)
      StartAbortLocked(r, FailureReason::kAborted, Aborted("aborted"), "the decode request ended");
    r.request_id.clear();
    r.abort_at = Clock::now();
    rooms_.erase(Key(r.address, r.id));
  }

  void Reap(Clock::time_point now) override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t moving = 0;
    for (auto it = rooms_.begin(); it != rooms_.end();) {
      Room& r = *it->second;
      if (!r.request_id.empty()) {
        if (r.reserved && !r.done && !r.failed) moving++;
        ++it;
        continue;
      }
      // A remembered RoomFailed whose request never came.
      if (now > r.abort_at + options_.bootstrap_timeout)
        it = rooms_.erase(it);
      else
        ++it;
    }
    in_flight_->Set(static_cast<double>(moving));
  }

  std::unordered_map<std::string, std::shared_ptr<Room>> rooms_;
  std::unordered_map<std::string, std::string> instance_by_address_;
};

}  // namespace

StatusOr<std::shared_ptr<KvTransport>> CreateRoleTransport(const PdOptions& options) {
  TransportOptions to;
  to.backend = options.transfer_backend;
  ASSIGN_OR_RETURN(std::unique_ptr<KvTransport> t, CreateKvTransport(to));
  return std::shared_ptr<KvTransport>(std::move(t));
}

bool RoleWantsTransportPool(const std::string& mode) { return mode == "decode"; }

StatusOr<std::unique_ptr<PdRole>> PdRole::Create(const PdOptions& options, const KvPool& pool,
                                                 std::shared_ptr<KvTransport> transport,
                                                 metrics::Registry& registry) {
  if (options.mode == "prefill") {
    auto role = std::make_unique<PrefillRole>(options, pool, std::move(transport), registry);
    role->StartConnector();
    RETURN_IF_ERROR(role->Init());
    RETURN_IF_ERROR(role->Listen());
    return std::unique_ptr<PdRole>(std::move(role));
  }
  if (options.mode == "decode") {
    auto role = std::make_unique<DecodeRole>(options, pool, std::move(transport), registry);
    RETURN_IF_ERROR(role->Init());
    return std::unique_ptr<PdRole>(std::move(role));
  }
  return InvalidArgument("--disaggregation-mode must be prefill or decode for a PD role, got '" +
                         options.mode + "'");
}

}  // namespace strata::disagg
