// The transport's message format and the receiver's piece count
// (ucx_messages.h), without UCX: ucx_transport_test covers them on the wire.
#include "disagg/ucx_messages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
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

TEST(UcxMessagesTest, PiecesOfAWrite) {
  EXPECT_EQ(PiecesOf(0), 0u);
  EXPECT_EQ(PiecesOf(1), 1u);
  EXPECT_EQ(PiecesOf(kPieceBytes), 1u);
  EXPECT_EQ(PiecesOf(kPieceBytes + 1), 2u);
  EXPECT_EQ(PiecesOf(64ull << 20), (64ull << 20) / kPieceBytes);
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
