// Bootstrap: the control plane of PD disaggregation. A prefill server
// listens on --disaggregation-bootstrap-port (SGLang's default 8998); each
// decode server keeps one TCP connection to each prefill it serves rooms
// for, opened on its first room and kept. Over it flow small framed
// messages in both directions; the KV bytes themselves go over the data
// plane (kv_transport.h).
//
//   on connect:  both  -> Hello (instance id, role, KV layout, transport descriptor)
//   per room:    decode -> RoomReady  (where to write: decode page ids, decode-side cached tokens)
//                prefill -> RoomDone  (after its last write completed: first token, logprobs, usage)
//                prefill -> RoomFailed (reason) | decode -> RoomAbort (reason)
//   always:      both  -> Heartbeat every heartbeat_interval
//
// Liveness: a peer is down when its connection closes or errors (a process
// killed with kill -9 is noticed at once: the kernel closes its sockets),
// when nothing arrived from it for peer_timeout (a stalled, SIGSTOPped or
// partitioned peer), or when a new connection from the same address brings
// a different instance id (the process was replaced: the old connection is
// dropped first). OnPeerDown runs once per peer with the reason; after it no
// message of that peer is delivered. A peer that comes back is a new peer
// (new PeerRef): nothing needs restarting.
//
// Wire format: each frame is a 4-byte little-endian length then a JSON
// object {"type": "...", ...}; frames over 16 MiB or that do not parse are a
// protocol error that drops the connection (named in OnPeerDown's status).
// EncodeMessage/DecodeMessage are pure and fuzzed.
//
// Thread-safety: Endpoint owns one I/O thread; every public method is
// thread-safe. Handler callbacks run on that thread, one at a time, and must
// not block (post work elsewhere); they may call Send.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cache/kv_layout.h"
#include "util/status.h"

namespace strata::disagg {

// ---- messages ----------------------------------------------------------

struct Hello {
  std::string instance_id;       // random per process start
  std::string role;              // "prefill" or "decode"
  std::string model;             // served model name, checked equal
  KvLayout layout;               // checked equal (page size, groups)
  std::string transport;         // "ucx"
  std::string transport_descriptor;  // KvTransport::LocalDescriptor() (decode side); may be empty
};

// Decode -> prefill: the room's pages are reserved. dst_pages[i] is the
// decode page that holds prompt tokens [(first_page + i) * page_size, ...);
// the prefill writes every group's K/V of those pages. Tokens
// [0, first_page * page_size) are decode-side prefix-cache hits.
struct RoomReady {
  uint64_t room = 0;
  int64_t prompt_tokens = 0;
  int64_t first_page = 0;
  std::vector<int32_t> dst_pages;
};

struct FirstTokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Prefill -> decode, after every write of the room completed: the first
// sampled token (and its logprobs when asked for) and the usage numbers.
struct RoomDone {
  uint64_t room = 0;
  int32_t first_token = 0;
  float logprob = 0;
  std::vector<FirstTokenLogprob> top_logprobs;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prefill-side prefix-cache hits
  bool finished = false;      // the first token already ended it (EOS / stop / max_tokens 1)
  std::string finish_reason;  // FinishReasonName when finished
};

// Why a room ended early; also the `reason` label of
// strata_kv_transfer_failures_total.
enum class FailureReason { kBootstrapTimeout, kTransferTimeout, kPeerLost, kAborted, kRejected };
const char* FailureReasonName(FailureReason reason);  // "bootstrap_timeout", ...
bool ParseFailureReason(std::string_view name, FailureReason* out);

// Either direction: the room is over on the sender's side (its pages are
// freed or being freed); the receiver ends it too.
struct RoomFailed {
  uint64_t room = 0;
  FailureReason reason = FailureReason::kAborted;
  std::string message;  // human-readable: what and why
};

struct Heartbeat {
  uint64_t seq = 0;
};

using Message = std::variant<Hello, RoomReady, RoomDone, RoomFailed, Heartbeat>;

// One frame's JSON payload (without the length prefix) and back.
// DecodeMessage fails with InvalidArgument naming the bad field.
std::string EncodeMessage(const Message& message);
StatusOr<Message> DecodeMessage(std::string_view payload);

// ---- endpoint ----------------------------------------------------------

// A live connection to one peer process. Valid until OnPeerDown.
using PeerRef = uint64_t;

struct PeerInfo {
  PeerRef ref = 0;
  std::string address;  // "host:port" as connected / accepted from
  Hello hello;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // The peer's Hello arrived (the connection is usable from now on).
  virtual void OnPeerUp(const PeerInfo& peer) = 0;
  // Every message after Hello except Heartbeat.
  virtual void OnMessage(const PeerInfo& peer, Message message) = 0;
  // The connection is gone (reason: "connection closed", "no heartbeat for
  // 5000 ms", "replaced by instance X", "protocol error: ..."). Called once
  // per peer that was up, and also for a Connect whose connection never
  // came up (PeerInfo::hello empty).
  virtual void OnPeerDown(const PeerInfo& peer, const Status& why) = 0;
};

struct EndpointOptions {
  Hello hello;  // what this process says about itself
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds peer_timeout{5000};   // silence after which a peer is down
  std::chrono::milliseconds connect_timeout{5000};
};

class Endpoint {
 public:
  // Starts the I/O thread. `handler` must outlive the endpoint.
  static StatusOr<std::unique_ptr<Endpoint>> Create(EndpointOptions options, Handler* handler);
  // Closes every connection (no OnPeerDown after the destructor starts) and
  // joins the I/O thread.
  ~Endpoint();

  // Prefill side: accepts peers on host:port (port 0: any; returns the bound
  // port). Fails with Unavailable naming the address when it cannot bind.
  StatusOr<int> Listen(const std::string& host, int port);

  // Decode side: the live peer for host:port, or a new connection to it
  // (asynchronous: OnPeerUp or OnPeerDown follows). Returns the ref that the
  // callbacks will carry; messages sent before it is up are queued.
  PeerRef Connect(const std::string& host, int port);

  // Queues a message to the peer. Unavailable when the peer is down or
  // unknown (the caller treats the room as failed with kPeerLost).
  Status Send(PeerRef peer, const Message& message);

  // Drops the connection (OnPeerDown follows with `why`).
  void Close(PeerRef peer, const Status& why);

  int64_t num_peers() const;
};

// "<16 hex digits>" from a random source; distinct per call.
std::string NewInstanceId();

}  // namespace strata::disagg
