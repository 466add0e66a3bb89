// PdRole: one half of a PD pair inside `strata serve
// --disaggregation-mode prefill|decode`. It owns the bootstrap endpoint
// (bootstrap.h) and the KV transport (kv_transport.h), and makes the
// engine's handoffs (engine/kv_handoff.h) for requests that carry the
// router's bootstrap fields:
//
//   prefill: listens on --disaggregation-bootstrap-port; decodes connect.
//     A request's KvExport waits (not admitted) until its decode's
//     RoomReady says which pages to write, then writes each chunk's pages
//     with one-sided puts as they complete, and after the last write
//     completed sends RoomDone with the first token. The room fails with
//     bootstrap_timeout when no RoomReady came within the bootstrap
//     timeout of the request's arrival; with the decode's reason when the
//     decode ends it; peer_lost when the decode's connection goes (or a
//     write fails).
//   decode: connects to the request's bootstrap_host:bootstrap_port. A
//     request's KvImport sends RoomReady when the engine reserved its
//     pages, and is done when RoomDone arrives. transfer_timeout when it
//     does not come within the transfer timeout of RoomReady; peer_lost when
//     the prefill's connection goes. An abort (client gone, deadline,
//     kv_full) sends RoomFailed to the prefill and — when pages were
//     reserved — reports failed only once the prefill acknowledged with its
//     own RoomFailed (its writes for the room drained) or its connection is
//     gone, so a freed page is never written.
//
// Either side answers a RoomFailed it receives for a room it does not know
// (yet) by remembering it for the bootstrap timeout: a request that arrives
// later for that room fails at once with the peer's reason.
//
// Metrics (strata_ prefix, on the server's registry): kv_transfer_bytes_total,
// kv_transfer_pages_total, kv_transfer_seconds (RoomReady -> RoomDone, per
// room), kv_transfers_in_flight, kv_transfer_failures_total{reason},
// disagg_bootstrap_queue_depth (prefill rooms waiting for their decode),
// disagg_peers.
//
// Thread-safety: every method is thread-safe; handoffs follow their own
// contract (engine thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "cache/kv_pool.h"
#include "disagg/kv_transport.h"
#include "engine/kv_handoff.h"
#include "metrics/metrics.h"
#include "util/status.h"

namespace strata::disagg {

struct PdOptions {
  std::string mode;                        // "prefill" or "decode"
  std::string bootstrap_host = "0.0.0.0";  // prefill: where the bootstrap endpoint listens
  int bootstrap_port = 8998;               // prefill: --disaggregation-bootstrap-port (0: any)
  std::string transfer_backend = "ucx";
  std::string model;  // served model name, checked equal at Hello
  std::chrono::milliseconds bootstrap_timeout{30000};
  std::chrono::milliseconds transfer_timeout{120000};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds peer_timeout{5000};
};

// Which handoff a request's bootstrap fields ask for.
struct RoomAddress {
  std::string host;  // the prefill's bootstrap host
  int port = 0;
  uint64_t room = 0;
};

// The KV transport of a role (--disaggregation-transfer-backend), made
// before the engine so that a decode's KV pool can live in memory the
// transport allocated (MakeKvPoolAllocator, kv_transport.h: on one host a
// prefill then writes the pages with its own memcpy) and passed to Create.
StatusOr<std::shared_ptr<KvTransport>> CreateRoleTransport(const PdOptions& options);

// Whether a role of `mode` should have its KV pool allocated by its
// transport: the decode (the pool peers write into). A prefill's pool is
// only read by its own writes; measured no faster in transport memory
// (docs/perf.md "KV transfer (PD)").
bool RoleWantsTransportPool(const std::string& mode);

class PdRole {
 public:
  // Registers the pool's memory with `transport` (a pool allocated by it is
  // already registered: its regions are reused), starts the bootstrap
  // endpoint (the prefill listens: Unavailable naming the port when it
  // cannot bind) and the metrics, and logs where the pool's memory is.
  // `pool` and `registry` outlive the role. The role shares `transport`;
  // when the role is destroyed it disconnects every peer (no completion of
  // it runs after) and drops its reference (the pool's memory may hold the
  // transport longer).
  static StatusOr<std::unique_ptr<PdRole>> Create(const PdOptions& options, const KvPool& pool,
                                                  std::shared_ptr<KvTransport> transport,
                                                  metrics::Registry& registry);
  virtual ~PdRole() = default;

  virtual const std::string& mode() const = 0;
  // The bound bootstrap port (prefill), 0 for decode.
  virtual int bootstrap_port() const = 0;
  virtual const std::string& instance_id() const = 0;

  // The handoff for one engine request (prefill: a KvExport; decode: a
  // KvImport; the other is null). `arrival` starts the bootstrap deadline.
  // InvalidArgument when the room is already in use on this server.
  struct Handoff {
    std::shared_ptr<KvExport> kv_export;
    std::shared_ptr<KvImport> kv_import;
  };
  virtual StatusOr<Handoff> NewHandoff(const RoomAddress& address, const std::string& request_id,
                                       std::chrono::steady_clock::time_point arrival) = 0;
};

}  // namespace strata::disagg
