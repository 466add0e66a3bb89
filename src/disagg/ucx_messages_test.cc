// The transport's message format and the receiver's piece count
// (ucx_messages.h), without UCX: ucx_transport_test covers them on the wire.
#include "disagg/ucx_messages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace strata::disagg::ucx_messages {
namespace {

using Clock = IncomingBatches::Clock;

WireWrite Piece(uint64_t sender, uint64_t seq, uint32_t total) {
  WireWrite h;
  h.sender = sender;
  h.seq = seq;
  h.total = total;
  return h;
}

TEST(UcxMessagesTest, HeadersOfTheWrongSizeOrMagicAreNotRead) {
  WireWrite h = Piece(1, 2, 3);
  WireWrite out;
  EXPECT_TRUE(ReadHeader(&h, sizeof(h), &out));
  EXPECT_EQ(out.seq, 2u);
  EXPECT_FALSE(ReadHeader(&h, sizeof(h) - 1, &out));
  EXPECT_FALSE(ReadHeader(nullptr, sizeof(h), &out));
  WireAck ack;
  EXPECT_FALSE(ReadHeader(&ack, sizeof(ack), &out)) << "another message's header";
  h.magic ^= 1;
  EXPECT_FALSE(ReadHeader(&h, sizeof(h), &out));
}

// Consecutive ops share a piece up to kPieceBytes and kMaxRunsPerPiece; an
// op longer than a piece is split into pieces of one run; every byte of
// every op is planned once, in order.
TEST(UcxMessagesTest, PlanPiecesPacksSmallOpsAndSplitsLargeOnes) {
  std::vector<WireRun> ops;
  for (uint32_t i = 0; i < 300; ++i) ops.push_back({i % 3, 0, i * 8192ull, 4096});  // 4 KiB runs
  ops.push_back({1, 0, 1 << 30, 3 * kPieceBytes + 5});                              // a big op
  ops.push_back({2, 0, 77, 0});                                                       // empty: left out
  ops.push_back({0, 0, 5, 10});
  const PiecePlan plan = PlanPieces(ops);
  ASSERT_FALSE(plan.pieces.empty());
  // 300 x 4 KiB: 128 runs fill 512 KiB, so pieces of 128, 128, then 44 + the big op's first part...
  EXPECT_EQ(plan.pieces[0].count, 128u);
  EXPECT_EQ(plan.pieces[0].bytes, kPieceBytes);
  std::vector<uint64_t> covered(ops.size(), 0);
  size_t next = 0;
  for (const PlannedPiece& p : plan.pieces) {
    EXPECT_EQ(p.first, next) << "pieces take the runs in order";
    EXPECT_GE(p.count, 1u);
    EXPECT_LE(p.count, kMaxRunsPerPiece);
    EXPECT_LE(p.bytes, kPieceBytes);
    uint64_t bytes = 0;
    for (size_t j = p.first; j < p.first + p.count; ++j) {
      const PlannedRun& r = plan.runs[j];
      EXPECT_EQ(r.op_offset, covered[r.op]) << "op " << r.op << " planned out of order";
      EXPECT_EQ(r.run.offset, ops[r.op].offset + r.op_offset);
      EXPECT_EQ(r.run.region, ops[r.op].region);
      covered[r.op] += r.run.length;
      bytes += r.run.length;
    }
    EXPECT_EQ(bytes, p.bytes);
    next = p.first + p.count;
  }
  EXPECT_EQ(next, plan.runs.size());
  for (size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(covered[i], ops[i].length) << "op " << i;
  // Many tiny ops: pieces close at kMaxRunsPerPiece runs.
  const PiecePlan tiny = PlanPieces(std::vector<WireRun>(600, WireRun{0, 0, 0, 16}));
  ASSERT_EQ(tiny.pieces.size(), 3u);
  EXPECT_EQ(tiny.pieces[0].count, kMaxRunsPerPiece);
  EXPECT_TRUE(PlanPieces({}).pieces.empty());
}

// A piece's data must be its run table and exactly the bytes it announces.
TEST(UcxMessagesTest, ParseRunsReadsTheTableAndRefusesWhatDoesNotAddUp) {
  std::vector<WireRun> table = {{0, 0, 100, 3}, {1, 0, 200, 5}};
  std::string data(reinterpret_cast<const char*>(table.data()), table.size() * sizeof(WireRun));
  data = std::string(1, 'x') + data + "abcdefgh";  // one byte ahead: parse unaligned
  WireWrite h;
  h.runs = 2;
  h.length = 8;
  std::vector<WireRun> runs;
  const char* payload = nullptr;
  ASSERT_TRUE(ParseRuns(h, data.data() + 1, data.size() - 1, &runs, &payload));
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].offset, 200u);
  EXPECT_EQ(std::string(payload, 8), "abcdefgh");
  EXPECT_FALSE(ParseRuns(h, data.data() + 1, data.size() - 2, &runs, &payload)) << "short";
  h.length = 9;
  EXPECT_FALSE(ParseRuns(h, data.data() + 1, data.size() - 1, &runs, &payload)) << "announced";
  h.length = 8;
  h.runs = 0;
  EXPECT_FALSE(ParseRuns(h, data.data() + 1, data.size() - 1, &runs, &payload));
  h.runs = kMaxRunsPerPiece + 1;
  EXPECT_FALSE(ParseRuns(h, data.data() + 1, data.size() - 1, &runs, &payload));
  // Lengths that do not add up to the payload (3 + 6 != 8 with one byte more).
  table[1].length = 6;
  std::string bad(reinterpret_cast<const char*>(table.data()), table.size() * sizeof(WireRun));
  bad += "abcdefgh";
  h.runs = 2;
  EXPECT_FALSE(ParseRuns(h, bad.data(), bad.size(), &runs, &payload));
}

// A batch is complete at its last piece, in whatever order batches
// interleave; batches of different senders with the same seq stay apart
// (two prefills both count from 1).
TEST(UcxMessagesTest, ABatchCompletesAtItsLastPieceAndSendersStayApart) {
  IncomingBatches in;
  const auto now = Clock::now();
  std::vector<WireWrite> pieces;
  for (uint64_t sender : {7ull, 8ull})
    for (uint64_t seq : {1ull, 2ull})
      for (uint32_t i = 0; i < 3; ++i) pieces.push_back(Piece(sender, seq, 3));
  std::shuffle(pieces.begin(), pieces.end(), std::mt19937(3));
  std::map<std::pair<uint64_t, uint64_t>, int> seen, completed_at;
  for (const WireWrite& p : pieces) {
    const int n = ++seen[{p.sender, p.seq}];
    const IncomingBatches::Outcome o = in.Add(p, "", now);
    EXPECT_EQ(o.complete, n == 3) << p.sender << "/" << p.seq << " piece " << n;
    if (o.complete) {
      EXPECT_EQ(o.code, kAckOk);
      ++completed_at[{p.sender, p.seq}];
    }
  }
  EXPECT_EQ(completed_at.size(), 4u);
  EXPECT_EQ(in.open(), 0u);
}

TEST(UcxMessagesTest, TheFirstRefusalIsWhatTheAckSays) {
  IncomingBatches in;
  const auto now = Clock::now();
  EXPECT_FALSE(in.Add(Piece(1, 1, 3), "", now).complete);
  EXPECT_FALSE(in.Add(Piece(1, 1, 3), "region 0 was freed", now).complete);
  const IncomingBatches::Outcome o = in.Add(Piece(1, 1, 3), "no region 9", now);
  ASSERT_TRUE(o.complete);
  EXPECT_EQ(o.code, kAckRefused);
  EXPECT_EQ(o.why, "region 0 was freed");
  // The next batch starts clean.
  const IncomingBatches::Outcome next = in.Add(Piece(1, 2, 1), "", now);
  EXPECT_TRUE(next.complete);
  EXPECT_EQ(next.code, kAckOk);
}

// A sender that died mid-batch leaves a batch that never completes: it is
// dropped once stale, when enough are open, and fresh ones are kept.
TEST(UcxMessagesTest, BatchesLeftByADeadSenderAreDroppedOnceStale) {
  IncomingBatches in;
  const auto t0 = Clock::now();
  for (uint64_t seq = 1; seq <= IncomingBatches::kPruneAbove; ++seq)
    in.Add(Piece(99, seq, 2), "", t0);  // one piece of two: never complete
  const auto later = t0 + IncomingBatches::kStale + std::chrono::seconds(1);
  in.Add(Piece(5, 1, 2), "", later);  // fresh and open
  EXPECT_EQ(in.open(), IncomingBatches::kPruneAbove + 1);
  in.Add(Piece(6, 1, 2), "", later);  // a second fresh one: over the bound
  EXPECT_TRUE(in.Add(Piece(7, 1, 1), "", later).complete);  // a completion prunes
  EXPECT_EQ(in.open(), 2u) << "the stale batches are gone, the fresh ones stay";
  EXPECT_TRUE(in.Add(Piece(5, 1, 2), "", later).complete);
}

}  // namespace
}  // namespace strata::disagg::ucx_messages
