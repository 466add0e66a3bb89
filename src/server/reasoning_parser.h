// Reasoning out of model text: the `--reasoning-parser` of `strata serve`.
// Reasoning models think inside <think>…</think> before they answer; the
// parser splits the streamed output into reasoning (message.reasoning_content,
// delta.reasoning_content) and content.
//
//   qwen3        the output opens <think> itself ("<think>\n…</think>\n\nanswer");
//                output that does not start with <think> is all content
//   deepseek-r1  the output starts inside the reasoning (the template opened
//                <think>, or the model writes it first: a leading <think> is
//                dropped); everything up to </think> is reasoning, and all
//                of it when </think> never comes
//
// Either starts inside the reasoning when the rendered prompt already ends
// with <think> (Qwen3-Thinking-2507's template), and expects no reasoning
// when it ends with </think> (Qwen3's template for enable_thinking=false
// closes an empty block) or when chat_template_kwargs.enable_thinking is
// false: then everything is content (ReasoningStart).
//
// What is held back: a tail that could be the start of <think> (at the very
// beginning) or of </think> (inside the reasoning). Whitespace right after
// </think> is dropped (it separates the answer from the reasoning). The
// split is the same however the text was cut into pieces.
//
// Thread-safety: a ReasoningParser belongs to one choice, one thread at a
// time; the free functions are pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace strata {

enum class ReasoningFormat { kNone, kQwen3, kDeepSeekR1 };

// "qwen3", "deepseek-r1"; nullopt otherwise.
std::optional<ReasoningFormat> ReasoningFormatFromName(std::string_view name);
const char* ReasoningFormatName(ReasoningFormat format);
inline constexpr std::string_view kReasoningParserNames = "qwen3, deepseek-r1";

// Where the output of a prompt starts.
enum class ReasoningStart {
  kMaybe,        // qwen3: reasoning if the output opens <think>
  kInReasoning,  // the output starts inside the reasoning
  kNoReasoning,  // everything is content
};
// From the format, the rendered prompt and the request's enable_thinking
// (nullopt when not sent).
ReasoningStart ReasoningStartFor(ReasoningFormat format, std::string_view prompt,
                                 std::optional<bool> enable_thinking);

class ReasoningParser {
 public:
  explicit ReasoningParser(ReasoningStart start);

  struct Output {
    std::string reasoning;
    std::string content;
  };
  Output Add(std::string_view piece);
  // End of the output: whatever is held back. Call once.
  Output Finish();

  // The output had a reasoning part (message.reasoning_content is sent,
  // possibly empty); known for sure after Finish().
  bool reasoning_seen() const { return seen_; }

 private:
  enum class State { kMaybe, kOpening, kReasoning, kAfterClose, kContent };
  void Run(bool at_end);

  State state_;
  bool seen_ = false;
  std::string buf_;
  Output out_;
};

}  // namespace strata
