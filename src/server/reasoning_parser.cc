#include "server/reasoning_parser.h"

#include <algorithm>
#include <utility>

namespace strata {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view TrimRight(std::string_view s) {
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest tail of `s` that is a proper prefix of `marker`.
size_t PartialMarkerTail(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> ReasoningFormatFromName(std::string_view name) {
  if (name == "qwen3") return ReasoningFormat::kQwen3;
  if (name == "deepseek-r1") return ReasoningFormat::kDeepSeekR1;
  return std::nullopt;
}

const char* ReasoningFormatName(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kQwen3:
      return "qwen3";
    case ReasoningFormat::kDeepSeekR1:
      return "deepseek-r1";
    case ReasoningFormat::kNone:
      break;
  }
  return "none";
}

ReasoningStart ReasoningStartFor(ReasoningFormat format, std::string_view prompt,
                                 std::optional<bool> enable_thinking) {
  if (format == ReasoningFormat::kNone || enable_thinking == false)
    return ReasoningStart::kNoReasoning;
  const std::string_view tail = TrimRight(prompt);
  if (tail.ends_with(kClose)) return ReasoningStart::kNoReasoning;
  if (tail.ends_with(kOpen)) return ReasoningStart::kInReasoning;
  return format == ReasoningFormat::kDeepSeekR1 ? ReasoningStart::kInReasoning
                                                : ReasoningStart::kMaybe;
}

ReasoningParser::ReasoningParser(ReasoningStart start)
    : state_(start == ReasoningStart::kMaybe         ? State::kMaybe
             : start == ReasoningStart::kInReasoning ? State::kOpening
                                                     : State::kContent),
      seen_(start == ReasoningStart::kInReasoning) {}

ReasoningParser::Output ReasoningParser::Add(std::string_view piece) {
  buf_ += piece;
  Run(false);
  return std::exchange(out_, {});
}

ReasoningParser::Output ReasoningParser::Finish() {
  Run(true);
  return std::exchange(out_, {});
}

void ReasoningParser::Run(bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kMaybe:
      case State::kOpening: {
        // A leading <think> (after whitespace) opens the reasoning; a
        // partial one waits. kOpening is inside the reasoning already: the
        // tag is merely dropped.
        size_t i = 0;
        while (i < buf_.size() && IsSpace(buf_[i])) ++i;
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (!at_end && rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return;
        if (rest.starts_with(kOpen)) {
          buf_.erase(0, i + kOpen.size());
          seen_ = true;
          state_ = State::kReasoning;
        } else {
          state_ = state_ == State::kMaybe ? State::kContent : State::kReasoning;
        }
        continue;
      }
      case State::kReasoning: {
        const size_t p = buf_.find(kClose);
        if (p == std::string::npos) {
          const size_t hold = at_end ? 0 : PartialMarkerTail(buf_, kClose);
          out_.reasoning.append(buf_, 0, buf_.size() - hold);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        out_.reasoning.append(buf_, 0, p);
        buf_.erase(0, p + kClose.size());
        state_ = State::kAfterClose;
        continue;
      }
      case State::kAfterClose: {
        size_t i = 0;
        while (i < buf_.size() && IsSpace(buf_[i])) ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out_.content += buf_;
        buf_.clear();
        return;
    }
  }
}

}  // namespace strata
