// The UCX transport's own active messages (ucx_transport.h, "Write ...
// messages"): their wire format, and the receiver's count of a batch's
// pieces. Pure values and logic, no UCX: ucx_transport.cc sends and
// receives them with ucp_am_send_nbx and its handlers.
//
// A batch by messages is `total` pieces (kAmWrite: a WireWrite header; its
// data is `runs` WireRun entries, then the runs' bytes one after the other),
// all naming the connection (`sender`, random per Connect) and the batch
// (`seq`). A piece packs consecutive ops of the batch, up to kPieceBytes of
// payload and kMaxRunsPerPiece runs (the sender gathers them with UCX's iov
// datatype, no copy); an op longer than kPieceBytes is split into pieces of
// one run. Once the receiver has seen all of them, in any order, it answers
// with one kAmAck (WireAck; its data: why it refused, if it did). Connect's
// probe is kAmProbe, answered by kAmProbeReply with the receiver's nonce.
//
// The headers are plain structs in this host's byte order: both ends are
// this build (the bootstrap's Hello checks versions) on little-endian
// machines; a header of the wrong size or magic is dropped, never read.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace strata::disagg::ucx_messages {

enum AmId : uint16_t {
  kAmWrite = 1,       // sender -> receiver: WireWrite, then `length` bytes
  kAmAck = 2,         // receiver -> sender: WireAck, then the refusal's text
  kAmProbe = 3,       // Connect -> receiver: WireProbe
  kAmProbeReply = 4,  // receiver -> Connect: WireProbe with the nonce
};
constexpr uint32_t kMagic = 0x33564b53;  // "SKV3" (SKV2: one run per piece, no run table)
// A write is sent in pieces of at most this many bytes: the receiver
// reassembles each one in a buffer of UCX's before copying it.
constexpr uint64_t kPieceBytes = 512 << 10;

constexpr uint32_t kMaxRunsPerPiece = 256;

struct WireWrite {
  uint32_t magic = kMagic;
  uint32_t runs = 0;    // WireRun entries at the start of the data
  uint64_t sender = 0;  // random per connection
  uint64_t seq = 0;     // batch number within the connection
  uint64_t length = 0;  // payload bytes after the entries: the runs' lengths summed
  uint32_t total = 0;   // pieces in the batch
  uint32_t reserved = 0;
};

// `length` bytes for the receiver's region `region` at `offset`.
struct WireRun {
  uint32_t region = 0;
  uint32_t reserved = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// One run of a planned piece: where it goes, and which bytes of the
// batch's op `op` (from `op_offset` on) it carries.
struct PlannedRun {
  WireRun run;
  size_t op = 0;
  uint64_t op_offset = 0;
};
struct PlannedPiece {
  size_t first = 0, count = 0;  // its runs in the plan's `runs`
  uint64_t bytes = 0;
};
struct PiecePlan {
  std::vector<PlannedRun> runs;
  std::vector<PlannedPiece> pieces;
};

// The pieces of a batch whose ops write ops[i] (region, offset, length),
// in order; zero-length ops are left out.
inline PiecePlan PlanPieces(const std::vector<WireRun>& ops) {
  PiecePlan plan;
  auto open_piece = [&] { plan.pieces.push_back({plan.runs.size(), 0, 0}); };
  for (size_t i = 0; i < ops.size(); ++i) {
    const WireRun& op = ops[i];
    for (uint64_t off = 0; off < op.length;) {
      const uint64_t len = std::min<uint64_t>(kPieceBytes, op.length - off);
      if (plan.pieces.empty() || plan.pieces.back().bytes + len > kPieceBytes ||
          plan.pieces.back().count == kMaxRunsPerPiece)
        open_piece();
      PlannedPiece& piece = plan.pieces.back();
      plan.runs.push_back({{op.region, 0, op.offset + off, len}, i, off});
      ++piece.count;
      piece.bytes += len;
      off += len;
    }
  }
  return plan;
}

// Reads the run entries of a received piece whose data is `data` (`length`
// bytes; no alignment assumed) into *runs, and points *payload at the
// first byte after them. False when the data does not hold `h.runs`
// entries followed by exactly `h.length` bytes that their lengths add up to.
inline bool ParseRuns(const WireWrite& h, const void* data, size_t length,
                      std::vector<WireRun>* runs, const char** payload) {
  if (h.runs == 0 || h.runs > kMaxRunsPerPiece || data == nullptr) return false;
  const uint64_t table = uint64_t{h.runs} * sizeof(WireRun);
  if (length < table || length - table != h.length) return false;
  runs->resize(h.runs);
  std::memcpy(runs->data(), data, table);
  uint64_t sum = 0;
  for (const WireRun& r : *runs) {
    if (r.length > h.length - sum) return false;
    sum += r.length;
  }
  if (sum != h.length) return false;
  *payload = static_cast<const char*>(data) + table;
  return true;
}

// kAckOk when every piece landed; kAckRefused when one was not written
// (the ack's data says why).
enum AckCode : uint32_t { kAckOk = 0, kAckRefused = 1 };
struct WireAck {
  uint32_t magic = kMagic;
  uint32_t code = kAckOk;
  uint64_t sender = 0;
  uint64_t seq = 0;
};

struct WireProbe {
  uint32_t magic = kMagic;
  uint32_t reserved = 0;
  uint64_t token = 0;  // Connect's, echoed
  uint64_t nonce = 0;  // the reply's: the receiver's descriptor nonce
};

// Reads a header of type T: false (and *out unspecified) for the wrong
// size or magic.
template <typename T>
bool ReadHeader(const void* header, size_t length, T* out) {
  if (header == nullptr || length != sizeof(T)) return false;
  std::memcpy(out, header, sizeof(T));
  return out->magic == kMagic;
}


// The receiver's batches in progress, by (sender, seq). Not thread-safe
// (the transport's progress thread owns it).
class IncomingBatches {
 public:
  using Clock = std::chrono::steady_clock;
  // Batches started longer ago than this whose pieces stopped coming (their
  // sender died mid-batch) are dropped when a batch completes and more than
  // kPruneAbove are open.
  static constexpr std::chrono::seconds kStale{60};
  static constexpr size_t kPruneAbove = 64;

  struct Outcome {
    bool complete = false;  // this was the batch's last piece: answer it
    uint32_t code = kAckOk;
    std::string why;  // the batch's first refusal
  };

  // Counts one piece of `h`'s batch; `refusal` non-empty when the piece was
  // not written (the first refusal of a batch is what its ack says).
  // REQUIRES: h.total > 0.
  Outcome Add(const WireWrite& h, const std::string& refusal, Clock::time_point now) {
    auto [it, fresh] = open_.try_emplace({h.sender, h.seq});
    Open& b = it->second;
    if (fresh) {
      b.total = h.total;
      b.started = now;
    }
    if (!refusal.empty() && b.code == kAckOk) {
      b.code = kAckRefused;
      b.why = refusal;
    }
    Outcome out;
    if (++b.got < b.total) return out;
    out.complete = true;
    out.code = b.code;
    out.why = std::move(b.why);
    open_.erase(it);
    if (open_.size() > kPruneAbove) Prune(now);
    return out;
  }

  size_t open() const { return open_.size(); }

 private:
  struct Open {
    uint32_t got = 0;
    uint32_t total = 0;
    uint32_t code = kAckOk;
    std::string why;
    Clock::time_point started;
  };

  void Prune(Clock::time_point now) {
    for (auto i = open_.begin(); i != open_.end();) {
      if (now - i->second.started > kStale)
        i = open_.erase(i);
      else
        ++i;
    }
  }

  std::map<std::pair<uint64_t, uint64_t>, Open> open_;
};

}  // namespace strata::disagg::ucx_messages
