#include "server/stop_matcher.h"

#include <random>

#include <gtest/gtest.h>

namespace strata {
namespace {

struct Fed {
  std::string emitted;            // everything sent to the client
  std::vector<std::string> sent;  // per Add() call, then Flush()
  std::optional<size_t> stop;
};

Fed Feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  Fed r;
  for (const std::string& p : pieces) {
    StopMatcher::Result res = m.Add(p);
    r.emitted += res.text;
    r.sent.push_back(res.text);
    if (res.stop_index) {
      EXPECT_FALSE(r.stop) << "a second stop after the stream finished";
      r.stop = res.stop_index;
    }
  }
  std::string tail = m.Flush();
  r.emitted += tail;
  r.sent.push_back(tail);
  return r;
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  Fed r = Feed(m, {"Hello", " wor", "ld"});
  EXPECT_EQ(r.emitted, "Hello world");
  EXPECT_EQ(r.sent, (std::vector<std::string>{"Hello", " wor", "ld", ""}));
  EXPECT_FALSE(r.stop);
}

TEST(StopMatcher, StopInsideOnePieceCutsItAndWhatFollows) {
  StopMatcher m({"END"});
  Fed r = Feed(m, {"abc", "xENDyz", "more"});
  EXPECT_EQ(r.emitted, "abcx");
  ASSERT_TRUE(r.stop);
  EXPECT_EQ(*r.stop, 0u);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
  EXPECT_EQ(r.sent[2], "") << "nothing after the stop";
}

TEST(StopMatcher, StopSplitOverManyTokensIsHeldBackThenDropped) {
  StopMatcher m({"</answer>"});
  Fed r = Feed(m, {"42", "<", "/", "ans", "wer", ">", "tail"});
  EXPECT_EQ(r.emitted, "42");
  EXPECT_EQ(r.sent[0], "42");
  EXPECT_EQ(r.sent[1], "") << "'<' could start the stop string";
  EXPECT_EQ(r.sent[4], "");
  ASSERT_TRUE(r.stop);
}

TEST(StopMatcher, HeldTextIsReleasedWhenItStopsLookingLikeAStop) {
  StopMatcher m({"</answer>"});
  Fed r = Feed(m, {"a<", "/an", "d", "b"});
  EXPECT_EQ(r.sent[0], "a");
  EXPECT_EQ(r.sent[1], "");
  EXPECT_EQ(r.sent[2], "</and");
  EXPECT_EQ(r.sent[3], "b");
  EXPECT_EQ(r.emitted, "a</andb");
  EXPECT_FALSE(r.stop);
}

TEST(StopMatcher, FlushReturnsAHeldPrefixAtEndOfStream) {
  StopMatcher m({"STOP"});
  Fed r = Feed(m, {"go ", "ST"});
  EXPECT_EQ(r.sent[1], "");
  EXPECT_EQ(r.sent.back(), "ST");
  EXPECT_EQ(r.emitted, "go ST");
  EXPECT_FALSE(r.stop);
}

TEST(StopMatcher, StopAtTheVeryStartEmitsNothing) {
  StopMatcher m({"\n\n"});
  Fed r = Feed(m, {"\n", "\nHello"});
  EXPECT_EQ(r.emitted, "");
  ASSERT_TRUE(r.stop);
}

TEST(StopMatcher, FirstCompletedStopWinsInsideOnePiece) {
  // Byte by byte, "bc" completes before "abcd" does.
  StopMatcher m({"abcd", "bc"});
  Fed r = Feed(m, {"xabcd"});
  EXPECT_EQ(r.emitted, "xa");
  EXPECT_EQ(*r.stop, 1u);
}

TEST(StopMatcher, SameEndTiesGoToTheEarlierStart) {
  StopMatcher m({"bc", "abc"});
  Fed r = Feed(m, {"xabc"});
  EXPECT_EQ(r.emitted, "x");
  EXPECT_EQ(*r.stop, 1u);
}

TEST(StopMatcher, EarliestCompletingStopWinsAmongSeveral) {
  StopMatcher m({"world", "lo w"});
  Fed r = Feed(m, {"Hello world"});
  EXPECT_EQ(r.emitted, "Hel");
  ASSERT_TRUE(r.stop);
  EXPECT_EQ(*r.stop, 1u);
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopMatcher, SameStartTiesGoToTheEarlierListedStop) {
  StopMatcher m({"ab", "abc"});
  Fed r = Feed(m, {"xabc"});
  EXPECT_EQ(r.emitted, "x");
  EXPECT_EQ(*r.stop, 0u);
}

TEST(StopMatcher, OverlappingStopsMatchAsSoonAsOneCompletes) {
  // "abcd" is held while it could still be "abcde"; "bcd" completes first.
  StopMatcher m({"abcde", "bcd"});
  Fed r = Feed(m, {"xab", "c", "d", "e"});
  EXPECT_EQ(r.sent[0], "x");
  EXPECT_EQ(r.emitted, "xa");
  ASSERT_TRUE(r.stop);
  EXPECT_EQ(*r.stop, 1u);
}

TEST(StopMatcher, SelfOverlappingStopFoundAfterAFalseStart) {
  StopMatcher m({"aab"});
  Fed r = Feed(m, {"a", "a", "a", "b", "z"});
  EXPECT_EQ(r.emitted, "a");
  ASSERT_TRUE(r.stop);
}

TEST(StopMatcher, HoldsBackOnlyTheLongestPossibleStart) {
  StopMatcher m({"xyz", "yq"});
  StopMatcher::Result res = m.Add("abxy");
  EXPECT_EQ(res.text, "ab") << "'xy' could become 'xyz'";
  res = m.Add("q");
  EXPECT_EQ(res.text, "x");
  EXPECT_EQ(*res.stop_index, 1u);
}

TEST(StopMatcher, MultiByteUtf8StopSplitAcrossPieces) {
  // "。" is E3 80 82; "停止" is 6 bytes. Pieces are whole characters.
  StopMatcher m({"停止。"});
  Fed r = Feed(m, {"好的", "停", "止", "。", "后"});
  EXPECT_EQ(r.emitted, "好的");
  EXPECT_EQ(r.sent[1], "");
  EXPECT_EQ(r.sent[2], "");
  ASSERT_TRUE(r.stop);
}

TEST(StopMatcher, MultiByteHoldBackNeverSplitsACharacter) {
  // The stop starts with the same lead byte as the text's last character but
  // a different character: nothing may be held inside "é".
  StopMatcher m({"ê!"});
  StopMatcher::Result res = m.Add("café");
  EXPECT_EQ(res.text, "café");
  res = m.Add("ê");
  EXPECT_EQ(res.text, "");
  res = m.Add("?");
  EXPECT_EQ(res.text, "ê?");
}

TEST(StopMatcher, IncludeStopStringKeepsTheStopButNotWhatFollows) {
  StopMatcher m({"</s>"}, /*include_stop_str=*/true);
  Fed r = Feed(m, {"done<", "/s>after"});
  EXPECT_EQ(r.emitted, "done</s>");
  ASSERT_TRUE(r.stop);
}

TEST(StopMatcher, EmptyPiecesAreHarmless) {
  StopMatcher m({"ab"});
  Fed r = Feed(m, {"", "a", "", "b", ""});
  EXPECT_EQ(r.emitted, "");
  ASSERT_TRUE(r.stop);
}

TEST(StopMatcher, AfterAStopNothingMoreComesOut) {
  StopMatcher m({"x"});
  EXPECT_EQ(m.Add("1x2").text, "1");
  EXPECT_EQ(m.Add("3").text, "");
  EXPECT_FALSE(m.Add("x").stop_index);
  EXPECT_EQ(m.Flush(), "");
}

// Property: for random texts cut at random places, the emitted text is what
// a character-by-character scan gives: the text before the first stop string
// to complete (earliest start among those completing together), or all of it.
TEST(StopMatcher, RandomSplitsAgreeWithAWholeTextSearch) {
  std::mt19937 rng(1234);
  const std::vector<std::string> chars = {"a", "b", "\xC3\xA9"};
  for (int trial = 0; trial < 3000; ++trial) {
    auto random_string = [&](int max_len) {
      std::string s;
      int len = 1 + rng() % max_len;
      for (int i = 0; i < len; ++i) s += chars[rng() % chars.size()];
      return s;
    };
    std::vector<std::string> stops;
    int num_stops = rng() % 4;
    for (int i = 0; i < num_stops; ++i) stops.push_back(random_string(4));
    std::string text = random_string(24);

    // Reference: scan growing prefixes character by character; the first
    // prefix that contains a stop decides (earliest start among them).
    std::string expected = text;
    std::optional<size_t> expected_stop;
    for (size_t end = 1; end <= text.size() && !expected_stop; ++end) {
      if (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) continue;
      std::string prefix = text.substr(0, end);
      size_t best = std::string::npos;
      for (size_t i = 0; i < stops.size(); ++i) {
        size_t pos = prefix.find(stops[i]);
        if (pos != std::string::npos && pos < best) {
          best = pos;
          expected_stop = i;
        }
      }
      if (expected_stop) expected = text.substr(0, best);
    }

    // Cut into pieces at character boundaries only.
    std::vector<std::string> pieces;
    std::string cur;
    for (size_t i = 0; i < text.size();) {
      size_t len = (static_cast<unsigned char>(text[i]) == 0xC3) ? 2 : 1;
      cur += text.substr(i, len);
      i += len;
      if (rng() % 3 == 0) {
        pieces.push_back(cur);
        cur.clear();
      }
    }
    pieces.push_back(cur);

    StopMatcher m(stops);
    Fed r = Feed(m, pieces);
    ASSERT_EQ(r.emitted, expected) << "trial " << trial << " text " << text;
    ASSERT_EQ(r.stop.has_value(), expected_stop.has_value()) << "trial " << trial;
    if (expected_stop) {
      // Same matched string (the index may differ between duplicate stops).
      ASSERT_EQ(stops[*r.stop], stops[*expected_stop]) << "trial " << trial << " text " << text;
    }
  }
}

}  // namespace
}  // namespace strata
