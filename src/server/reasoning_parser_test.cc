// Reasoning parsers on canned model text, whole, split at every byte and
// byte by byte.
#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <random>

namespace strata {
namespace {

struct Split {
  std::string reasoning, content;
  bool seen = false;
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  return os << "reasoning=[" << s.reasoning << "] content=[" << s.content << "] seen=" << s.seen;
}

Split SplitWith(ReasoningStart start, const std::vector<std::string>& pieces) {
  ReasoningParser p(start);
  Split out;
  auto take = [&](ReasoningParser::Output o) {
    out.reasoning += o.reasoning;
    out.content += o.content;
  };
  for (const std::string& s : pieces) take(p.Add(s));
  take(p.Finish());
  out.seen = p.reasoning_seen();
  return out;
}

void ExpectSplit(ReasoningStart start, const std::string& text, const Split& want) {
  EXPECT_EQ(SplitWith(start, {text}), want) << text;
  for (size_t k = 0; k <= text.size(); ++k)
    ASSERT_EQ(SplitWith(start, {text.substr(0, k), text.substr(k)}), want)
        << "split at " << k << " of " << text;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(SplitWith(start, bytes), want) << text;
}

TEST(Qwen3Reasoning, ThinkThenAnswer) {
  ExpectSplit(ReasoningStart::kMaybe, "<think>\nLet me think: 2 < 3.\n</think>\n\nThe answer is 3.",
              {"\nLet me think: 2 < 3.\n", "The answer is 3.", true});
}

TEST(Qwen3Reasoning, NoThinkIsAllContent) {
  ExpectSplit(ReasoningStart::kMaybe, "Just an answer </think> here.",
              {"", "Just an answer </think> here.", false});
  ExpectSplit(ReasoningStart::kMaybe, "<thi", {"", "<thi", false});
  ExpectSplit(ReasoningStart::kMaybe, "", {"", "", false});
}

TEST(Qwen3Reasoning, UnclosedThinkingIsAllReasoning) {
  ExpectSplit(ReasoningStart::kMaybe, "<think>still thinking </thi",
              {"still thinking </thi", "", true});
}

TEST(Qwen3Reasoning, EmptyThinkBlock) {
  ExpectSplit(ReasoningStart::kMaybe, "<think>\n\n</think>\n\nHi", {"\n\n", "Hi", true});
}

TEST(DeepSeekR1Reasoning, OutputStartsInsideTheReasoning) {
  ExpectSplit(ReasoningStart::kInReasoning, "I should add.</think>\n\n4",
              {"I should add.", "4", true});
  ExpectSplit(ReasoningStart::kInReasoning, "<think>\nI should add.\n</think>4",
              {"\nI should add.\n", "4", true});
  ExpectSplit(ReasoningStart::kInReasoning, "never closed <think> x",
              {"never closed <think> x", "", true});
}

TEST(NoReasoning, EverythingIsContent) {
  ExpectSplit(ReasoningStart::kNoReasoning, "<think>a</think>b", {"", "<think>a</think>b", false});
}

TEST(ReasoningStartFor, FromPromptAndKwargs) {
  EXPECT_EQ(ReasoningStartFor(ReasoningFormat::kQwen3, "<|im_start|>assistant\n", std::nullopt),
            ReasoningStart::kMaybe);
  EXPECT_EQ(ReasoningStartFor(ReasoningFormat::kQwen3,
                              "<|im_start|>assistant\n<think>\n\n</think>\n\n", std::nullopt),
            ReasoningStart::kNoReasoning);
  EXPECT_EQ(
      ReasoningStartFor(ReasoningFormat::kQwen3, "<|im_start|>assistant\n<think>\n", std::nullopt),
      ReasoningStart::kInReasoning);
  EXPECT_EQ(ReasoningStartFor(ReasoningFormat::kQwen3, "<|im_start|>assistant\n", false),
            ReasoningStart::kNoReasoning);
  EXPECT_EQ(ReasoningStartFor(ReasoningFormat::kDeepSeekR1, "<｜Assistant｜>", std::nullopt),
            ReasoningStart::kInReasoning);
  EXPECT_EQ(ReasoningStartFor(ReasoningFormat::kDeepSeekR1, "<｜Assistant｜>", true),
            ReasoningStart::kInReasoning);
  EXPECT_EQ(
      ReasoningStartFor(ReasoningFormat::kDeepSeekR1, "<｜Assistant｜></think>", std::nullopt),
      ReasoningStart::kNoReasoning);
  EXPECT_EQ(ReasoningStartFor(ReasoningFormat::kNone, "<think>", std::nullopt),
            ReasoningStart::kNoReasoning);
}

TEST(ReasoningNames, Names) {
  EXPECT_EQ(ReasoningFormatFromName("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(ReasoningFormatFromName("deepseek-r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(ReasoningFormatFromName("deepseek_r1"), std::nullopt);
}

TEST(ReasoningProperties, RandomTextIsSplitInvariant) {
  const std::vector<std::string> fragments = {"<think>", "</think>", "<thi", "</th", "<", "/",
                                              ">",       " ",        "\n",   "x",    "東"};
  std::mt19937 rng(11);
  for (ReasoningStart start :
       {ReasoningStart::kMaybe, ReasoningStart::kInReasoning, ReasoningStart::kNoReasoning}) {
    for (int n = 0; n < 300; ++n) {
      std::string text;
      const int pieces = 1 + static_cast<int>(rng() % 12);
      for (int k = 0; k < pieces; ++k) text += fragments[rng() % fragments.size()];
      const Split whole = SplitWith(start, {text});
      if (start == ReasoningStart::kNoReasoning || !whole.seen) EXPECT_EQ(whole.content, text);
      for (size_t k = 0; k <= text.size(); ++k)
        ASSERT_EQ(SplitWith(start, {text.substr(0, k), text.substr(k)}), whole)
            << "split at " << k << " of " << text;
    }
  }
}

}  // namespace
}  // namespace strata
