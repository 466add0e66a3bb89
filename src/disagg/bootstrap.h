// Bootstrap: the control plane of PD disaggregation. A prefill server
// listens on --disaggregation-bootstrap-port (SGLang's default 8998); each
// decode server keeps one TCP connection to each prefill it serves rooms
// for, opened on its first room and kept. Over it flow small framed
// messages in both directions; the KV bytes themselves go over the data
// plane (kv_transport.h).
//
//   on connect:  both    -> Hello (instance id, role, KV layout, transport descriptor)
//   per room:    decode  -> RoomReady  (where to write: decode page ids, decode-side cached tokens)
//                prefill -> RoomDone   (after its last write completed: first token, logprobs,
//                usage) either  -> RoomFailed (reason: the room is over on the sender's side)
//   always:      both    -> Heartbeat every heartbeat_interval when idle
//
// Wire format: each frame is a 4-byte little-endian length, then a JSON
// object {"type": "hello"|"room_ready"|"room_done"|"room_failed"|
// "heartbeat", ...} holding every field of the struct below (a Hello also
// carries "protocol": kBootstrapProtocolVersion, and its
// transport_descriptor travels base64-encoded, since UCX addresses are
// binary; logprobs that are not finite travel as "-inf", "inf", "nan").
// A frame over kMaxFrameBytes, a payload that DecodeMessage rejects, a
// first frame that is not a Hello and a second Hello are protocol errors
// that drop the connection. EncodeMessage/DecodeMessage are pure and fuzzed
// (disagg/fuzz/bootstrap_fuzz.cc).
//
// Liveness and replacement (what Endpoint implements):
//  - Both sides send their Hello first, at once on connect. A peer is up
//    when its Hello arrives and is compatible: the other role, the same
//    model, the same KvLayout, the same transport (otherwise the connection
//    is dropped with kFailedPrecondition, on both sides). A connection that
//    brings no Hello within peer_timeout of its TCP connect is dropped.
//  - Both sides send a Heartbeat every heartbeat_interval while nothing
//    else is queued. Any byte received counts as life: a peer from which
//    nothing arrived for peer_timeout is down (stalled, SIGSTOPped,
//    partitioned); so is one that has not read our pending bytes for
//    peer_timeout, and one whose outgoing queue would pass
//    max_queued_bytes ("stalled").
//  - EOF or a socket error is down at once (kill -9 closes the process's
//    sockets in the kernel, so its death is noticed within a round trip).
//  - Connecting side: Connect reuses the live (connecting or up) connection
//    to the same "host:port"; once that went down, Connect opens a new one.
//    When the new connection's Hello carries another instance id than the
//    last one seen at that address, the process was replaced:
//    PeerInfo::replaced_instance_id names the old instance and the endpoint
//    logs "prefill at host:port was replaced: instance A -> B" (the old
//    connection was already down, so its rooms failed with peer_lost).
//  - Listening side: when a Hello arrives whose instance id equals that of
//    a peer that is up (the same process reconnected, e.g. after it timed
//    us out while its FIN never reached us), the old connection is dropped
//    first (OnPeerDown "replaced by a new connection of instance X"). A
//    different instance id from the same host is a different peer (several
//    decode processes may run on one host); a dead old one goes down by
//    itself from its socket or its heartbeats.
//  - OnPeerDown runs exactly once per peer that came up, and once for a
//    Connect whose connection never came up (refused, timed out, protocol
//    error, incompatible; PeerInfo::hello is then empty). An accepted
//    connection that never came up is dropped with a log line and no
//    callback. After OnPeerDown no message of that peer is delivered and
//    Send to it fails; a peer that comes back is a new peer (new PeerRef):
//    nothing needs restarting.
//  - OnPeerDown's status: kFailedPrecondition for an incompatible peer
//    (callers report its rooms as kRejected); kInvalidArgument "protocol
//    error: ..." for a malformed frame; kUnavailable for everything else
//    (closed, refused, timed out, no heartbeat, stalled, replaced); Close()
//    passes the caller's status through. Callers map every code but
//    kFailedPrecondition to kPeerLost.
//  - Dropping a connection on purpose (Close, protocol error,
//    incompatibility, replacement) first writes what is already queued,
//    then shuts the socket down for writing and discards input until the
//    peer closes (at most 1 s), so the last frames are not lost to a TCP
//    reset. Timeouts, stalls, socket errors and the destructor close at once.
//
// Thread-safety: Endpoint owns one I/O thread; every public method is
// thread-safe and never runs a handler callback itself. Callbacks run on
// the I/O thread, one at a time, and must neither block (post work
// elsewhere) nor throw; they may call Send, Connect and Close, but must not
// destroy the Endpoint.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cache/kv_layout.h"
#include "util/status.h"

namespace strata::disagg {

// ---- messages ----------------------------------------------------------

// Bumped on any incompatible change of the messages below; a peer speaking
// another version fails its Hello (both roles must run the same Strata).
// 2: pool groups carry tokens_per_entry (compressed KV entries).
inline constexpr int kBootstrapProtocolVersion = 2;
// Largest frame payload either side accepts (RoomReady of ~1M pages fits).
inline constexpr size_t kMaxFrameBytes = size_t{16} << 20;

struct Hello {
  std::string instance_id;           // random per process start; non-empty
  std::string role;                  // "prefill" or "decode"
  std::string model;                 // served model name, checked equal
  KvLayout layout;                   // checked equal (page size, groups); must Validate()
  int64_t num_pages = 0;             // pages of the sender's KV pool: where its regions' pages sit
  std::string transport;             // "ucx"
  std::string transport_descriptor;  // KvTransport::LocalDescriptor() (decode side); may be empty
};

// Decode -> prefill: the room's pages are reserved. dst_pages[i] is the
// decode page that holds prompt tokens [(first_page + i) * page_size, ...);
// the prefill writes every group's K/V of those pages. Tokens
// [0, first_page * page_size) are decode-side prefix-cache hits.
struct RoomReady {
  uint64_t room = 0;
  int64_t prompt_tokens = 0;       // >= 1
  int64_t first_page = 0;          // >= 0
  std::vector<int32_t> dst_pages;  // each in [0, kMaxKvPages)
};

struct FirstTokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Prefill -> decode, after every write of the room completed: the first
// sampled token (and its logprobs when asked for) and the usage numbers.
struct RoomDone {
  uint64_t room = 0;
  int32_t first_token = 0;  // >= 0
  float logprob = 0;
  std::vector<FirstTokenLogprob> top_logprobs;
  int64_t prompt_tokens = 0;  // >= 1
  int64_t cached_tokens = 0;  // prefill-side prefix-cache hits, <= prompt_tokens
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
// EncodeMessage never fails (a string that is not UTF-8 has its bad bytes
// replaced by U+FFFD, except transport_descriptor, which is base64).
// DecodeMessage checks every field's presence, type and range (a Hello's
// layout must Validate(); unknown extra fields are ignored) and fails with
// InvalidArgument naming the message type and the field (e.g.
// `room_ready field "dst_pages[3]": ...`). It never throws, and any message
// it returns encodes to a payload it decodes to the same message.
std::string EncodeMessage(const Message& message);
StatusOr<Message> DecodeMessage(std::string_view payload);

// ---- endpoint ----------------------------------------------------------

// A connection to one peer process, never reused within one Endpoint's
// lifetime. Valid until OnPeerDown.
using PeerRef = uint64_t;

struct PeerInfo {
  PeerRef ref = 0;
  std::string address;  // "host:port" as connected to / accepted from
  Hello hello;          // the peer's Hello; empty for a Connect that never came up
  // Connecting side, at OnPeerUp: the instance id last seen at `address`
  // when this peer has another one (the process there was replaced); else
  // empty.
  std::string replaced_instance_id;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // The peer's Hello arrived (the connection is usable from now on).
  virtual void OnPeerUp(const PeerInfo& peer) = 0;
  // Every message after Hello except Heartbeat, in the order sent.
  virtual void OnMessage(const PeerInfo& peer, Message message) = 0;
  // The connection is gone; `why` says what happened (see "Liveness" above
  // for the cases and codes). Called once per peer that was up, and once
  // for a Connect whose connection never came up.
  virtual void OnPeerDown(const PeerInfo& peer, const Status& why) = 0;
};

struct EndpointOptions {
  Hello hello;  // what this process says about itself; must DecodeMessage cleanly
  // When set, the hello sent on each connection carries what this returns
  // as its transport_descriptor (the decode: KvTransport::LocalDescriptorFor
  // the connection, so each prefill writes through receive state of its
  // own). Called on the I/O thread as the connection starts; PeerInfo has
  // its ref and address then.
  std::function<std::string(const PeerInfo&)> descriptor_for;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds peer_timeout{
      5000};  // silence after which a peer is down; >= 2 heartbeats
  std::chrono::milliseconds connect_timeout{5000};
  // Bytes queued to one peer (not yet taken by the kernel) beyond which it
  // is a stalled peer and is dropped. One frame is always accepted into an
  // empty queue.
  size_t max_queued_bytes = size_t{64} << 20;
};

class Endpoint {
 public:
  // Starts the I/O thread. `handler` must outlive the endpoint. Fails with
  // InvalidArgument for an invalid Hello or timeouts that cannot work.
  static StatusOr<std::unique_ptr<Endpoint>> Create(EndpointOptions options, Handler* handler);
  // Closes every connection at once (no callback starts after the
  // destructor has started; one running finishes first) and joins the I/O
  // thread. REQUIRES: not called from a handler callback.
  ~Endpoint();

  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Prefill side: accepts peers on host:port (port 0: any; returns the bound
  // port; SO_REUSEADDR, so a restarted server gets its port back at once).
  // Fails with Unavailable naming the address when it cannot bind.
  StatusOr<int> Listen(const std::string& host, int port);

  // Decode side: the live peer for host:port, or a new connection to it
  // (asynchronous: OnPeerUp or OnPeerDown follows, never inside this call).
  // Returns the ref that the callbacks will carry; messages sent before it
  // is up are queued behind the Hello.
  PeerRef Connect(const std::string& host, int port);

  // Queues a message to the peer. OK means queued, not delivered: what is
  // still queued when the peer goes down is dropped (OnPeerDown says so, and
  // the caller fails those rooms). Unavailable when the peer is down or
  // unknown (the caller treats the room as failed with kPeerLost), or when
  // this message makes it a stalled peer (it is then dropped);
  // InvalidArgument for a Hello (the endpoint sends its own) or a message
  // over kMaxFrameBytes.
  Status Send(PeerRef peer, const Message& message);

  // Drops the connection (OnPeerDown follows with `why`, asynchronously).
  // Frames queued before it are still written. Unknown or down peers: no-op.
  void Close(PeerRef peer, const Status& why);

  // Peers up now.
  int64_t num_peers() const;

  struct Impl;

 private:
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "<16 hex digits>" from std::random_device; distinct per call.
std::string NewInstanceId();

}  // namespace strata::disagg
