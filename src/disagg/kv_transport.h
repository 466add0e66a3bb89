// KvTransport: the data plane of PD disaggregation. The decode server
// registers its KV pool memory for remote writes and publishes a descriptor
// (through the bootstrap handshake, disagg/bootstrap.h); the prefill server
// connects to it from that descriptor and writes computed KV pages straight
// into the decode's pages, in batches, as prefill chunks finish (one-sided
// puts, copies into mapped shared memory, or, over tcp, messages the
// decode's transport copies: UcxTransport). Nothing here knows about requests, rooms or pages: it moves byte
// ranges between registered regions. disagg/page_ops.h turns page ids of a
// KvLayout into WriteOps.
//
// Implementations: UcxTransport (ucx_transport.h; UCX 1.13 from Debian, the
// transports chosen by UCX_TLS as UCX users expect: tcp across hosts, shared
// memory (shm) on one host). A CUDA IPC
// transport (GPU to GPU on one host) is a later implementation of the same
// interface.
//
// Failure model: every Write completes exactly once, with OK or an error
// that names what happened (kUnavailable "peer lost: ..." when the peer's
// process died or its connection broke; kDeadlineExceeded never — deadlines
// belong to the caller, who calls Disconnect to give up). After Disconnect
// returns, no callback of that peer runs and no write of that peer touches
// local memory any more. A peer that died is noticed from the transport's
// own error reports (UCX's peer error handling), within seconds (tcp: its
// closed connection; shared memory: UCX's keepalive, about 1 s).
//
// Thread-safety: every method is thread-safe. Completions run on the
// transport's own progress thread: they must not block and must not call
// back into the transport except Write/Disconnect.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "cache/kv_pool.h"
#include "util/status.h"

namespace strata::disagg {

// A memory region registered with the transport (index in registration
// order, starting at 0). A receiver's regions are what a descriptor
// exports; a sender's regions are the sources of its writes.
using RegionId = int;
// A connected peer (a receiver this sender writes into). Never reused
// within one transport's lifetime.
using PeerId = uint64_t;

// One contiguous write: `length` bytes from local region `src_region` at
// byte `src_offset` to the peer's region `dst_region` at `dst_offset`.
struct WriteOp {
  RegionId src_region = 0;
  uint64_t src_offset = 0;
  RegionId dst_region = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
};

struct TransportStats {
  uint64_t bytes_written = 0;    // completed OK
  uint64_t bytes_copied_directly = 0;  // of those: by this process into mapped peer memory
  uint64_t bytes_by_messages = 0;  // of those: as the transport's own messages (UCX: tcp)
  uint64_t writes_ok = 0;        // Write() batches completed OK
  uint64_t writes_failed = 0;    // completed with an error
  int64_t peers = 0;             // connected now
  int64_t writes_in_flight = 0;  // posted batches the transport still waits on
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  // "ucx" (what --disaggregation-transfer-backend names).
  virtual std::string name() const = 0;

  // Registers [base, base + length) for use in writes: as a source (sender)
  // or as a destination peers may write into (receiver). Called at startup,
  // once per pool group, before LocalDescriptor/Connect. Exactly a region
  // AllocateRegion returned gives that region's id back (registered once).
  // REQUIRES: the memory outlives the transport (or, for an allocated
  // region, its FreeRegion).
  virtual StatusOr<RegionId> RegisterRegion(void* base, size_t length) = 0;

  // Allocates `length` bytes that the transport owns and registers them as
  // the next region, in the memory peers can write fastest. For UCX this is
  // ucp_mem_map with UCP_MEM_MAP_ALLOCATE: on one host, shared memory
  // (sysv or posix) that a sender maps and copies into itself, where heap
  // memory given to RegisterRegion is written through the receiver's worker
  // (active messages) over UCX 1.13's shared-memory transports. The bytes
  // are 64-byte aligned, not zeroed, and valid until FreeRegion(id) or the
  // transport's destruction, whichever comes first. Called at startup like
  // RegisterRegion. Errors: InvalidArgument for length 0, Unavailable with
  // the library's message when it cannot allocate.
  struct AllocatedRegion {
    RegionId id = 0;
    void* base = nullptr;
    size_t length = 0;
  };
  virtual StatusOr<AllocatedRegion> AllocateRegion(size_t length) = 0;

  // Unmaps and frees a region AllocateRegion made. REQUIRES: nothing uses
  // it any more (no Write names it; no LocalDescriptor is exported after:
  // that fails with FailedPrecondition). Unknown ids and regions given to
  // RegisterRegion are ignored.
  virtual void FreeRegion(RegionId id) = 0;

  // What memory a region is, for logs and tests: "sysv shared memory
  // (allocated by ucx)", "heap (registered)", ... Empty for an unknown id.
  virtual std::string RegionMemory(RegionId id) const = 0;

  // Opaque bytes a peer passes to Connect to write into this process's
  // registered regions (for UCX: the worker address and each region's
  // packed remote key, base and length). Stable for the transport's life.
  virtual StatusOr<std::string> LocalDescriptor() = 0;

  // A descriptor for one peer alone (`key`: the caller's name for it, e.g.
  // its bootstrap connection): the same regions, but what that peer sends
  // lands in receive state of its own, so a peer that dies mid-write cannot
  // stop the others' (UCX: a worker per key; disagg.md "Open bug"). The same
  // key gives the same descriptor until ForgetPeer(key). Default: the
  // shared LocalDescriptor.
  virtual StatusOr<std::string> LocalDescriptorFor(const std::string& key) {
    (void)key;
    return LocalDescriptor();
  }
  // The peer of `key` is gone: its receive state is released (after a
  // grace for what it still had in flight). Unknown keys are ignored.
  virtual void ForgetPeer(const std::string& key) { (void)key; }

  // The receiving side's check of what a peer writes, where this process
  // applies the writes itself (UcxTransport: writes by messages, i.e. over
  // tcp; puts and direct copies land without this process, so nothing
  // checks them). `key` is the LocalDescriptorFor key the peer connected
  // through ("" for the shared LocalDescriptor). An empty answer allows the
  // write; otherwise it says why not: nothing of that write lands and its
  // batch ends at the sender with InvalidArgument naming the reason. Runs
  // on the transport's progress thread: must not block or call the
  // transport. Default: none (every write in a region is allowed).
  using WriteGuard = std::function<std::string(const std::string& key, RegionId region,
                                               uint64_t offset, uint64_t length)>;
  virtual void SetWriteGuard(WriteGuard guard) { (void)guard; }

  // Connects to the receiver that produced `descriptor`. Fails with
  // InvalidArgument for a descriptor that does not parse (named as such),
  // Unavailable when the peer cannot be reached.
  virtual StatusOr<PeerId> Connect(const std::string& descriptor) = 0;

  // Drops the peer: fails its writes still in flight (with kAborted,
  // "disconnected"), then releases its endpoint and remote keys. Idempotent;
  // unknown ids are ignored. Blocks until no completion of the peer runs.
  virtual void Disconnect(PeerId peer) = 0;

  // Disconnect of every connected peer: when it returns, no completion
  // runs any more until the next Connect. For an owner that stops using a
  // transport that others keep alive (the pool's memory can outlive the
  // PD role that wrote through it).
  virtual void DisconnectAll() = 0;

  // Posts `ops` as one batch (the transport may merge or split them);
  // `done` runs once, on the progress thread, when every op has landed in
  // the peer's memory (remote completion: after OK the receiver may read
  // the bytes) or with the first error. Never blocks on the network.
  // Errors before posting (unknown peer, a peer already lost, an op outside
  // a region) are returned and `done` is not called; after OK, `done` is
  // called exactly once.
  virtual Status Write(PeerId peer, std::span<const WriteOp> ops,
                       std::function<void(Status)> done) = 0;

  virtual TransportStats stats() const = 0;
};

// A KvPoolAllocator (cache/kv_pool.h) whose blocks are AllocateRegion
// regions of `transport`: a pool made with it is region 0, 1, ... of the
// transport when nothing else was registered first, and RegisterRegion of
// a group's buffer then returns that region. Each block holds `transport`,
// which therefore lives until the pool is gone; freeing a block frees its
// region. Describe(): "<name> transport (<RegionMemory of the first block>)".
std::shared_ptr<KvPoolAllocator> MakeKvPoolAllocator(std::shared_ptr<KvTransport> transport);

struct TransportOptions {
  std::string backend = "ucx";  // --disaggregation-transfer-backend
};

// The transport --disaggregation-transfer-backend names; InvalidArgument
// listing the known names otherwise, Unavailable when the transport's
// library fails to initialise (with its message).
StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(const TransportOptions& options);

// What `strata check` can tell of the transport on this machine before any
// server starts: two transports of `options` in this process (UCX with this
// process's UCX_TLS, as the servers it starts will have it), a receiver's
// 64-byte region, Connect from its descriptor and one Write that must land
// within `timeout`. OK when KV pages can move between two processes of this
// host; otherwise the first step that failed and its message (UCX_TLS naming
// no transport here, or none UCX can set an endpoint up with, such as cma
// alone). Says nothing of other hosts. Blocks for up to about `timeout`.
Status SelfTestKvTransport(const TransportOptions& options, std::chrono::milliseconds timeout);

}  // namespace strata::disagg
