// UcxTransport: KvTransport over UCX's UCP API (Debian libucx-dev, 1.13).
//
// One UCP context (RMA + AM + WAKEUP features) and one worker per transport. The
// transports are UCX's choice: UCX_TLS as UCX users expect, or
// UcxTransportOptions::tls: tcp across hosts; on one host shared memory
// (shm, sm, posix, sysv; UCX's default "all" picks it too for a peer on
// this host). UCX only picks transports that can report a dead peer; UCX
// 1.13's posix/sysv can (from its keepalive) only with MM_ERROR_HANDLING,
// which this transport turns on for a context that offers them unless
// UCX_{POSIX,SYSV,MM}_ERROR_HANDLING is set. UCX 1.13 selects no cma lane
// for puts, so UCX_TLS=cma alone fails at Connect, saying which values
// work (docs/architecture/disagg.md "Data plane").
//
//   RegisterRegion  ucp_mem_map; the packed rkey goes into the descriptor.
//   AllocateRegion  ucp_mem_map with UCP_MEM_MAP_ALLOCATE: memory UCX
//                   allocated, which over shared memory a sender maps and
//                   writes with its own memcpy (UCX 1.13's mm transports
//                   put only into memory they allocated).
//   LocalDescriptor worker address + per region (base, length, rkey), plus
//                   the transport's nonce, framed and checksummed
//                   (ucx_descriptor.h).
//   Connect         ucp_ep_create from the peer's worker address with
//                   UCP_ERR_HANDLING_MODE_PEER; unpacks the rkeys; then
//                   sends a probe (an active message) that the peer answers
//                   with its nonce, which must be the descriptor's. So
//                   Connect returns only once the peer is reachable and
//                   answers, and a different process that reuses the
//                   address of a dead one (same host:port) is refused, not
//                   written into.
//   Write           three ways, chosen per peer at Connect:
//                   - direct copy: the peer's regions are mapped here (its
//                     memory came from AllocateRegion and UCX reaches it
//                     over shared memory: ucp_rkey_ptr): a memcpy per op on
//                     the progress thread, and `done` right after it
//                     (UcxTransportOptions::direct_copy);
//                   - puts: one ucp_put_nbx per op, then ucp_ep_flush_nbx:
//                     `done` from the flush's completion, i.e. after the
//                     bytes are in the peer's memory (remote completion);
//                   - messages (UcxTransportOptions::writes; tcp): the ops
//                     packed into pieces of at most 512 KiB and 256 runs
//                     (a run table, then the bytes, gathered by UCX's iov
//                     datatype; ucx_messages.h) sent as eager active
//                     messages of this transport (UCP_FEATURE_AM); an op
//                     longer than a piece is split; the receiver checks
//                     each piece against its own regions and its
//                     KvTransport::WriteGuard, copies it, and
//                     answers the batch's last one with an ack: `done` from
//                     the ack (remote completion again; a refused piece, e.g.
//                     into a region freed since the descriptor, ends the
//                     batch with InvalidArgument "refused a write: ..."). Not
//                     UCX's puts there: UCX 1.13 has no native put over tcp,
//                     and the handler of its emulated ones aborts the
//                     receiving process when the sender died mid-write (its
//                     completion reply fails: "ucp_request.inl Fatal:
//                     unexpected error"), so a prefill killed mid-transfer
//                     would take the decode down; UCX's emulated reads have
//                     the same handler, hence the probe is a message too.
//                     Over tcp the messages were also ~2x faster than those
//                     puts (docs/perf.md "KV transfer (PD)").
//   Disconnect      ucp_ep_close_nbx(UCP_EP_CLOSE_FLAG_FORCE): UCX cancels
//                   the peer's outstanding operations; their batches end
//                   with kAborted "disconnected".
//
// Threading: a progress thread owns the worker; it is the only thread that
// calls UCP (the worker runs UCS_THREAD_MODE_SINGLE). Other threads hand it
// commands through a queue and wake it with ucp_worker_signal; when idle it
// sleeps in poll() on the worker's event fd (ucp_worker_arm). Chosen over
// UCS_THREAD_MODE_MULTI because the contract says completions run on "the
// transport's own thread" and Disconnect must know when the last callback
// of a peer ran: with one owner thread both are true by construction, and
// UCX's multi-thread mode would only add a lock around every call. The
// receiver's progress thread matters too: writes by messages are copied by
// it, and for registered (not UCX-allocated) memory UCX 1.13 has no native
// RMA over posix or sysv either and emulates puts with active messages that
// the receiving worker must progress (a stopped receiver stalls them). Only
// direct copies into UCX-allocated shared memory need nothing of the
// receiver.
//
// Failure model: endpoints always use UCP_ERR_HANDLING_MODE_PEER (never
// NONE, where UCX makes no promise about a failed peer's operations). The
// error callback of a peer's endpoint marks the peer lost: its batches in
// flight end with kUnavailable "peer lost: <UCX status>", later Writes
// return that error. UCX calls it when the connection broke (tcp: a killed
// process's sockets close at once) or, for shared memory, which has no
// connection, when UCX's keepalive finds the peer's process gone (its pid
// no longer runs the same process), within one keepalive interval, which
// this transport lowers to UcxTransportOptions::keepalive_interval (1 s)
// unless UCX_KEEPALIVE_INTERVAL is set. A stalled peer (SIGSTOP) raises
// nothing on either: the caller's deadline gives up with Disconnect. The
// caller calls Disconnect to release the endpoint in every case.
//
// Thread-safety: every method is thread-safe; see KvTransport for what
// completions may call. Destroying the transport ends every batch still in
// flight with kAborted (on the destroying thread) and needs no other call
// in progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "disagg/kv_transport.h"
#include "disagg/ucx_descriptor.h"
#include "util/status.h"

namespace strata::disagg {

struct UcxTransportOptions {
  // UCX_TLS of this transport's context ("tcp", "shm", "tcp,cma", ...).
  // Empty: the UCX_TLS environment variable, else UCX's default (all).
  std::string tls;
  // How long Connect waits for the peer to answer the probe.
  std::chrono::milliseconds connect_timeout{5000};
  // UCX_KEEPALIVE_INTERVAL for this context unless that variable is set
  // (UCX's default, 20 s, would notice a dead shared-memory peer late: UCX
  // has no other way to see one die).
  std::chrono::milliseconds keepalive_interval{1000};
  // UCX_{POSIX,SYSV}_FIFO_SIZE (a power of 2) for a context with shared
  // memory, unless set in the environment. UCX's 64 made the receiver's
  // wake-ups the bound: 0.1-0.15 GB/s at 256 KiB puts here, 0.6-0.8 GB/s
  // with 4096 (docs/perf.md "KV transfer (PD)"). Costs memory: UCX gives
  // every FIFO entry a receive buffer, so a worker holds ~38 MB of shared
  // memory with 4096 (~13 MB with 1024, ~4 MB with UCX's 64; measured).
  int shm_fifo_size = 4096;
  // A batch whose every destination region is mapped into this process
  // (ucp_rkey_ptr works: the peer's region is shared memory UCX allocated,
  // KvTransport::AllocateRegion) is copied with memcpy on the progress
  // thread instead of ucp_put_nbx + flush. Off: always UCX's puts (for
  // comparison; docs/perf.md "KV transfer (PD)").
  bool direct_copy = true;
  // How the other writes travel. kAuto: as this transport's own active
  // messages when UCX puts to the peer on no lane natively (tcp, in UCX
  // 1.13), else ucp_put_nbx. UCX's emulated puts are not used because their
  // handler aborts the receiving process when the sender dies mid-write
  // (see Write below). kPuts / kMessages force one (tests, benchmarks).
  enum class Writes { kAuto, kPuts, kMessages };
  Writes writes = Writes::kAuto;
};

class UcxTransport final : public KvTransport {
 public:
  // Fails with Unavailable (with UCX's message) when UCX cannot initialise,
  // e.g. when no transport UCX_TLS names exists on this host.
  static StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxTransportOptions& options = {});
  ~UcxTransport() override;

  std::string name() const override { return "ucx"; }
  StatusOr<RegionId> RegisterRegion(void* base, size_t length) override;
  // ucp_mem_map(UCP_MEM_MAP_ALLOCATE): UCX picks the memory by its
  // UCX_ALLOC_PRIO (default: sysv, posix shared memory, then huge pages,
  // mmap, heap) among the memory domains of this context's UCX_TLS; over
  // tcp alone that is private memory, written as before.
  StatusOr<AllocatedRegion> AllocateRegion(size_t length) override;
  void FreeRegion(RegionId id) override;
  // From /proc/self/maps: "sysv shared memory", "posix shared memory",
  // "private memory", then " (allocated by ucx)" or " (registered)".
  std::string RegionMemory(RegionId id) const override;
  // The descriptor covers the regions registered so far.
  StatusOr<std::string> LocalDescriptor() override;
  // A receiving worker per key (created on first use; its address in the
  // descriptor), progressed like the others; ForgetPeer retires it for
  // 2 s, then destroys it. Must not be called from a completion.
  StatusOr<std::string> LocalDescriptorFor(const std::string& key) override;
  void ForgetPeer(const std::string& key) override;
  void SetWriteGuard(WriteGuard guard) override;
  // Also fails with FailedPrecondition when called from a completion.
  StatusOr<PeerId> Connect(const std::string& descriptor) override;
  // Called from a completion (on the progress thread) it cannot wait: the
  // peer is closed right after that completion returns, and its remaining
  // batches end with kAborted then.
  void Disconnect(PeerId peer) override;
  void DisconnectAll() override;
  // Returns an error and never calls `done` for: an unknown or disconnected
  // peer (NotFound), a peer already lost (Unavailable "peer lost: ..."), an
  // op outside its region (InvalidArgument naming the op). Returns OK and
  // calls `done` exactly once otherwise.
  Status Write(PeerId peer, std::span<const WriteOp> ops,
               std::function<void(Status)> done) override;
  TransportStats stats() const override;

  // The transports and devices UCX offers this context, e.g.
  // "tcp/lo tcp/eth0 posix/memory cma/memory" (logged at creation).
  std::string resources() const;
  // What UCX chose for a connected peer's endpoint (ucp_ep_print_info), for
  // logs and tests; empty for an unknown peer.
  std::string PeerInfo(PeerId peer);

  class Impl;

 private:
  explicit UcxTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::disagg
