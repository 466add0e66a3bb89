#include "server/tool_call_parser.h"

#include <nlohmann/json.hpp>
#include <random>

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && IsSpace(s[i])) ++i;
  return i;
}

std::string_view Trim(std::string_view s) {
  size_t b = SkipSpace(s, 0);
  size_t e = s.size();
  while (e > b && IsSpace(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Length of the longest tail of `s` that is a proper prefix of `marker`.
size_t PartialMarkerTail(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// `s` is a proper, non-empty prefix of `marker`.
bool IsPrefixOf(std::string_view s, std::string_view marker) {
  return !s.empty() && s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

constexpr int kMaxDepth = 128;

Json ParseJson(std::string_view text) {
  return Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

// The arguments of a call: an object, or a string holding one (some models
// write the arguments JSON-encoded). Compact text; nullopt otherwise.
std::optional<std::string> ArgumentsText(const Json& args) {
  if (args.is_object()) return args.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (args.is_string()) {
    Json inner = ParseJson(args.get_ref<const std::string&>());
    if (inner.is_object()) return inner.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return std::nullopt;
}

// {"name": "f", "arguments"|"parameters": {...}} → name and arguments.
bool ReadCallObject(const Json& call, std::string* name, std::string* arguments) {
  if (!call.is_object()) return false;
  auto n = call.find("name");
  if (n == call.end() || !n->is_string() || n->get_ref<const std::string&>().empty()) return false;
  auto a = call.find("arguments");
  if (a == call.end()) a = call.find("parameters");
  if (a == call.end()) return false;
  std::optional<std::string> args = ArgumentsText(*a);
  if (!args) return false;
  *name = n->get<std::string>();
  *arguments = std::move(*args);
  return true;
}

// ---------------------------------------------------------------------------
// hermes / qwen25: each call wrapped in <tool_call>…</tool_call>.

class HermesParser final : public ToolCallParser {
 public:
  explicit HermesParser(IdSource ids) : ToolCallParser(std::move(ids)) {}

 private:
  static constexpr std::string_view kOpen = "<tool_call>";
  static constexpr std::string_view kClose = "</tool_call>";

  bool Step(bool at_end) override {
    if (!in_call_) {
      const size_t p = buf_.find(kOpen);
      if (p == std::string::npos) {
        EmitContentUpTo(kOpen, at_end);
        return false;
      }
      EmitContent(std::string_view(buf_).substr(0, p));
      Consume(p + kOpen.size());
      in_call_ = true;
      return true;
    }
    const size_t q = FindMarker(kClose);
    if (q == std::string::npos && !at_end) return false;
    // Unclosed at the end: still a call if its JSON is whole (the model
    // stopped right after it).
    const std::string_view body =
        std::string_view(buf_).substr(0, q == std::string::npos ? buf_.size() : q);
    std::string name, args;
    if (ReadCallObject(ParseJson(body), &name, &args)) {
      EmitCall(name, args);
    } else {
      EmitContent(std::string(kOpen) + std::string(body) +
                  (q == std::string::npos ? "" : std::string(kClose)));
    }
    Consume(q == std::string::npos ? buf_.size() : q + kClose.size());
    in_call_ = false;
    return true;
  }

  bool in_call_ = false;
};

// ---------------------------------------------------------------------------
// llama3: a JSON object {"name", "parameters"} at the start of the output
// (or after a call, separated by ';'), or anywhere after <|python_tag|>.
// The tag is a special token, so with skip_special_tokens it is gone and
// the bare object is what arrives.

class Llama3Parser final : public ToolCallParser {
 public:
  explicit Llama3Parser(IdSource ids) : ToolCallParser(std::move(ids)) {}

 private:
  static constexpr std::string_view kTag = "<|python_tag|>";
  enum class State { kStart, kContent, kJson };

  bool Step(bool at_end) override {
    switch (state_) {
      case State::kStart: {
        // Where a bare object may begin: skip whitespace (and, between
        // calls, the ';' separators).
        size_t i = 0;
        while (i < buf_.size() && (IsSpace(buf_[i]) || (made_call_ && buf_[i] == ';'))) ++i;
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.empty() || (IsPrefixOf(rest, kTag) && !at_end)) {
          if (!at_end) return false;
          if (!made_call_) EmitContent(buf_);
          Consume(buf_.size());
          return false;
        }
        if (!made_call_) EmitContent(std::string_view(buf_).substr(0, i));
        if (rest.starts_with(kTag)) {
          Consume(i + kTag.size());
          tagged_ = true;
          state_ = State::kJson;
        } else if (rest[0] == '{') {
          Consume(i);
          tagged_ = false;
          state_ = State::kJson;
        } else {
          // Not a call: the separators become content again.
          if (made_call_) EmitContent(std::string_view(buf_).substr(0, i));
          Consume(i);
          state_ = State::kContent;
        }
        return true;
      }
      case State::kContent: {
        const size_t p = buf_.find(kTag);
        if (p == std::string::npos) {
          EmitContentUpTo(kTag, at_end);
          return false;
        }
        EmitContent(std::string_view(buf_).substr(0, p));
        Consume(p + kTag.size());
        tagged_ = true;
        state_ = State::kJson;
        return true;
      }
      case State::kJson: {
        const size_t end = ScanJson(0);
        if (end == kJsonNeedMore && !at_end) return false;
        std::string name, args;
        if (end != kJsonNeedMore && end != kJsonInvalid &&
            ReadCallObject(ParseJson(std::string_view(buf_).substr(0, end)), &name, &args)) {
          EmitCall(name, args);
          made_call_ = true;
          Consume(end);
          state_ = State::kStart;
          return true;
        }
        // Not a call: the tag and the text after it are content.
        if (tagged_) EmitContent(kTag);
        if (end != kJsonNeedMore && end != kJsonInvalid) {
          EmitContent(std::string_view(buf_).substr(0, end));
          Consume(end);
        } else if (!tagged_) {
          // An object that never closed, or nested past the bound: all content.
          EmitContent(buf_);
          Consume(buf_.size());
        }
        state_ = State::kContent;
        return true;
      }
    }
    return false;
  }

  State state_ = State::kStart;
  bool tagged_ = false;
  bool made_call_ = false;
};

// ---------------------------------------------------------------------------
// mistral: [TOOL_CALLS] then a JSON array of calls (tokenizers before v11)
// or name[ARGS]{...} (v11+, with [CALL_ID]id between in v13). A bare array
// at the very start is accepted too: [TOOL_CALLS] is a special token, gone
// with skip_special_tokens.

class MistralParser final : public ToolCallParser {
 public:
  explicit MistralParser(IdSource ids) : ToolCallParser(std::move(ids)) {}

 private:
  static constexpr std::string_view kMarker = "[TOOL_CALLS]";
  static constexpr std::string_view kArgs = "[ARGS]";
  static constexpr std::string_view kCallId = "[CALL_ID]";
  enum class State { kStart, kContent, kAfterMarker };

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  }

  // The array form, from buf_'s start: true when it was decided (calls or
  // content); false when more text is needed.
  bool TakeArray(bool at_end, bool marked) {
    const size_t end = ScanJson(0);
    if (end == kJsonNeedMore && !at_end) return false;
    if (end != kJsonNeedMore && end != kJsonInvalid) {
      const Json calls = ParseJson(std::string_view(buf_).substr(0, end));
      std::vector<std::pair<std::string, std::string>> parsed;
      bool ok = calls.is_array() && !calls.empty();
      for (size_t i = 0; ok && i < calls.size(); ++i) {
        std::string name, args;
        ok = ReadCallObject(calls[i], &name, &args);
        parsed.emplace_back(std::move(name), std::move(args));
      }
      if (ok) {
        for (auto& [name, args] : parsed) EmitCall(name, args);
        Consume(end);
        state_ = State::kContent;
        return true;
      }
    }
    if (marked) EmitContent(kMarker);
    if (end != kJsonNeedMore && end != kJsonInvalid) {
      EmitContent(std::string_view(buf_).substr(0, end));
      Consume(end);
    } else if (!marked) {
      EmitContent(buf_);
      Consume(buf_.size());
    }
    state_ = State::kContent;
    return true;
  }

  // name[ARGS]{...} from buf_'s start: true when decided.
  bool TakeNamed(bool at_end) {
    const size_t a = buf_.find(kArgs);
    std::string_view head =
        std::string_view(buf_).substr(0, a == std::string::npos ? buf_.size() : a);
    // Without [ARGS] yet, the tail may be its beginning; what precedes must
    // still look like a name (and an optional [CALL_ID]id).
    if (a == std::string::npos) head.remove_suffix(PartialMarkerTail(head, kArgs));
    std::string_view name = head;
    if (size_t c = head.find(kCallId); c != std::string::npos)
      name = head.substr(0, c);
    else
      name.remove_suffix(PartialMarkerTail(name, kCallId));
    name = Trim(name);
    bool name_ok = true;
    for (char ch : name) name_ok &= IsNameChar(ch);
    if (name_ok && a != std::string::npos && !name.empty()) {
      const size_t end = ScanJson(a + kArgs.size());
      if (end == kJsonNeedMore && !at_end) return false;
      if (end != kJsonNeedMore && end != kJsonInvalid) {
        const Json args =
            ParseJson(std::string_view(buf_).substr(a + kArgs.size(), end - a - kArgs.size()));
        if (std::optional<std::string> text = ArgumentsText(args)) {
          EmitCall(std::string(name), *text);
          Consume(end);
          state_ = State::kContent;
          return true;
        }
      }
    } else if (name_ok && a == std::string::npos && !at_end) {
      return false;  // the name (or [ARGS]) is still coming
    }
    EmitContent(kMarker);  // not a call: the marker and what follows are content
    state_ = State::kContent;
    return true;
  }

  bool Step(bool at_end) override {
    switch (state_) {
      case State::kStart: {
        const size_t i = SkipSpace(buf_, 0);
        const std::string_view rest = std::string_view(buf_).substr(i);
        if (!at_end && (rest.empty() || IsPrefixOf(rest, kMarker))) return false;
        if (!rest.empty() && rest[0] == '[' && !rest.starts_with(kMarker)) {
          EmitContent(std::string_view(buf_).substr(0, i));
          Consume(i);
          return TakeArray(at_end, /*marked=*/false);
        }
        state_ = State::kContent;
        return true;
      }
      case State::kContent: {
        const size_t p = buf_.find(kMarker);
        if (p == std::string::npos) {
          EmitContentUpTo(kMarker, at_end);
          return false;
        }
        EmitContent(std::string_view(buf_).substr(0, p));
        Consume(p + kMarker.size());
        state_ = State::kAfterMarker;
        return true;
      }
      case State::kAfterMarker: {
        const size_t i = SkipSpace(buf_, 0);
        if (i == buf_.size()) {
          if (!at_end) return false;
          EmitContent(kMarker);
          EmitContent(buf_);
          Consume(buf_.size());
          state_ = State::kContent;
          return false;
        }
        if (buf_[i] == '[' && !std::string_view(buf_).substr(i).starts_with(kArgs)) {
          // "[TOOL_CALLS] [" : the array form (a "[" could also begin a
          // stray marker; the array's JSON decides).
          return TakeArray(at_end, /*marked=*/true);
        }
        return TakeNamed(at_end);
      }
    }
    return false;
  }

  State state_ = State::kStart;
};

// ---------------------------------------------------------------------------
// deepseekv3: a section of calls between <｜tool▁calls▁begin｜> and
// <｜tool▁calls▁end｜>, each between <｜tool▁call▁begin｜> and
// <｜tool▁call▁end｜>: "function<｜tool▁sep｜>name\n```json\n{...}\n```" (V3)
// or "name<｜tool▁sep｜>{...}" (V3.1).

class DeepSeekV3Parser final : public ToolCallParser {
 public:
  explicit DeepSeekV3Parser(IdSource ids) : ToolCallParser(std::move(ids)) {}

 private:
  static constexpr std::string_view kBegin = "<｜tool▁calls▁begin｜>";
  static constexpr std::string_view kEnd = "<｜tool▁calls▁end｜>";
  static constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
  static constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
  static constexpr std::string_view kSep = "<｜tool▁sep｜>";

  static bool ReadCall(std::string_view body, std::string* name, std::string* arguments) {
    const size_t sep = body.find(kSep);
    if (sep == std::string_view::npos) return false;
    std::string_view head = Trim(body.substr(0, sep));
    std::string_view rest = body.substr(sep + kSep.size());
    std::string_view args = rest;
    if (head == "function") {
      // V3: the name up to the newline, then the arguments in a ```json fence.
      const size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) return false;
      head = Trim(rest.substr(0, nl));
      args = Trim(rest.substr(nl + 1));
      if (args.starts_with("```")) {
        const size_t open_end = args.find('\n');
        if (open_end == std::string_view::npos || !args.ends_with("```")) return false;
        args = args.substr(open_end + 1, args.size() - 3 - (open_end + 1));
      }
    }
    if (head.empty()) return false;
    std::optional<std::string> text = ArgumentsText(ParseJson(Trim(args)));
    if (!text) return false;
    *name = std::string(head);
    *arguments = std::move(*text);
    return true;
  }

  // Malformed markup in the section: what was not a call becomes content
  // (with the section's opening marker when no call of it was taken).
  void Malformed(std::string_view text) {
    if (section_calls_ == 0) EmitContent(kBegin);
    EmitContent(text);
    section_calls_ = 1;  // the marker is out; later text is plain content
    in_section_ = false;
  }

  bool Step(bool at_end) override {
    if (!in_section_) {
      const size_t p = buf_.find(kBegin);
      if (p == std::string::npos) {
        EmitContentUpTo(kBegin, at_end);
        return false;
      }
      EmitContent(std::string_view(buf_).substr(0, p));
      Consume(p + kBegin.size());
      in_section_ = true;
      section_calls_ = 0;
      return true;
    }
    const size_t i = SkipSpace(buf_, 0);
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest.starts_with(kEnd)) {
      if (section_calls_ == 0)
        EmitContent(std::string(kBegin) + std::string(buf_.substr(0, i + kEnd.size())));
      Consume(i + kEnd.size());
      in_section_ = false;
      return true;
    }
    if (rest.starts_with(kCallBegin)) {
      const size_t q = FindMarker(kCallEnd, i + kCallBegin.size());
      if (q == std::string::npos && !at_end) return false;
      if (q != std::string::npos) {
        std::string name, args;
        const std::string_view body =
            std::string_view(buf_).substr(i + kCallBegin.size(), q - i - kCallBegin.size());
        if (ReadCall(body, &name, &args)) {
          EmitCall(name, args);
          ++section_calls_;
          Consume(q + kCallEnd.size());
          return true;
        }
        Malformed(std::string_view(buf_).substr(0, q + kCallEnd.size()));
        Consume(q + kCallEnd.size());
        return true;
      }
      Malformed(buf_);
      Consume(buf_.size());
      return false;
    }
    if (!at_end && (rest.empty() || IsPrefixOf(rest, kEnd) || IsPrefixOf(rest, kCallBegin)))
      return false;
    if (rest.empty() && section_calls_ > 0) {  // the model stopped after its calls
      Consume(buf_.size());
      in_section_ = false;
      return false;
    }
    // Anything else inside the section: not the markup of a call.
    if (section_calls_ == 0) EmitContent(kBegin);
    in_section_ = false;
    return true;
  }

  bool in_section_ = false;
  int section_calls_ = 0;
};

}  // namespace

std::optional<ToolCallFormat> ToolCallFormatFromName(std::string_view name) {
  if (name == "llama3") return ToolCallFormat::kLlama3;
  if (name == "hermes" || name == "qwen25") return ToolCallFormat::kHermes;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "deepseekv3") return ToolCallFormat::kDeepSeekV3;
  return std::nullopt;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseekv3";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

ToolCallFormat DetectToolCallFormat(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<｜tool▁calls▁begin｜>")) return ToolCallFormat::kDeepSeekV3;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if (has("<tool_call>")) return ToolCallFormat::kHermes;
  if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("\"parameters\"")))
    return ToolCallFormat::kLlama3;
  return ToolCallFormat::kNone;
}

std::string NewToolCallId(ToolCallFormat format) {
  static constexpr std::string_view kAlnum =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlnum.size() - 1);
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlnum[pick(rng)];
  return id;
}

void AppendToolParseOutput(ToolParseOutput& to, ToolParseOutput from) {
  to.content += from.content;
  for (ToolCallEvent& e : from.events) to.events.push_back(std::move(e));
}

std::unique_ptr<ToolCallParser> ToolCallParser::Create(ToolCallFormat format, IdSource ids) {
  if (!ids) ids = [format] { return NewToolCallId(format); };
  switch (format) {
    case ToolCallFormat::kHermes:
      return std::make_unique<HermesParser>(std::move(ids));
    case ToolCallFormat::kLlama3:
      return std::make_unique<Llama3Parser>(std::move(ids));
    case ToolCallFormat::kMistral:
      return std::make_unique<MistralParser>(std::move(ids));
    case ToolCallFormat::kDeepSeekV3:
      return std::make_unique<DeepSeekV3Parser>(std::move(ids));
    case ToolCallFormat::kNone:
      break;
  }
  return nullptr;
}

ToolParseOutput ToolCallParser::Add(std::string_view piece) {
  buf_ += piece;
  while (Step(false)) {
  }
  return std::exchange(out_, {});
}

ToolParseOutput ToolCallParser::Finish() {
  while (Step(true)) {
  }
  if (!buf_.empty()) EmitContent(buf_), Consume(buf_.size());
  // Trailing whitespace: kept when the output is plain text, dropped after
  // calls (it only followed their markup).
  if (calls_.empty()) out_.content += pending_ws_;
  pending_ws_.clear();
  return std::exchange(out_, {});
}

void ToolCallParser::EmitContent(std::string_view text) {
  if (after_call_) {  // whitespace right after a call's markup separates it from what follows
    const size_t i = SkipSpace(text, 0);
    text.remove_prefix(i);
    if (!text.empty()) after_call_ = false;
  }
  if (text.empty()) return;
  size_t e = text.size();
  while (e > 0 && IsSpace(text[e - 1])) --e;
  if (e == 0) {
    pending_ws_ += text;
    return;
  }
  out_.content += pending_ws_;
  out_.content += text.substr(0, e);
  pending_ws_ = std::string(text.substr(e));
}

void ToolCallParser::Consume(size_t n) {
  buf_.erase(0, n);
  scan_ = JsonScan{};
  find_ = MarkerSearch{};
}

size_t ToolCallParser::FindMarker(std::string_view marker, size_t from) {
  size_t start = from;
  if (find_.marker == marker.data() && find_.from == from &&
      find_.searched_to > from + marker.size())
    start = find_.searched_to - marker.size() + 1;  // the bytes before cannot start a match
  const size_t p = buf_.find(marker, start);
  find_ = MarkerSearch{marker.data(), from, p == std::string::npos ? buf_.size() : from};
  return p;
}

size_t ToolCallParser::ScanJson(size_t start) {
  JsonScan& sc = scan_;
  if (sc.start != start) sc = JsonScan{start, start};
  if (sc.result != kJsonNeedMore) return sc.result;
  const std::string_view s = buf_;
  size_t& i = sc.pos;
  if (sc.depth == 0) {  // not opened yet
    i = SkipSpace(s, i);
    if (i == s.size()) return kJsonNeedMore;
    if (s[i] != '{' && s[i] != '[') return sc.result = kJsonInvalid;
  }
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (sc.in_string) {
      if (sc.escaped)
        sc.escaped = false;
      else if (c == '\\')
        sc.escaped = true;
      else if (c == '"')
        sc.in_string = false;
      continue;
    }
    if (c == '"') {
      sc.in_string = true;
    } else if (c == '{' || c == '[') {
      if (++sc.depth > kMaxDepth) return sc.result = kJsonInvalid;
    } else if (c == '}' || c == ']') {
      if (--sc.depth == 0) return sc.result = i + 1;
    }
  }
  return kJsonNeedMore;
}

void ToolCallParser::EmitContentUpTo(std::string_view marker, bool at_end) {
  const size_t hold = at_end ? 0 : PartialMarkerTail(buf_, marker);
  EmitContent(std::string_view(buf_).substr(0, buf_.size() - hold));
  Consume(buf_.size() - hold);
}

void ToolCallParser::EmitCall(const std::string& name, const std::string& arguments) {
  pending_ws_.clear();  // it separated the content from this call's markup
  after_call_ = true;
  const int index = static_cast<int>(calls_.size());
  ToolCall call{ids_(), name, arguments};
  out_.events.push_back({ToolCallEvent::Kind::kStart, index, call.id, call.name, ""});
  out_.events.push_back({ToolCallEvent::Kind::kArguments, index, "", "", call.arguments});
  out_.events.push_back({ToolCallEvent::Kind::kEnd, index, "", "", ""});
  calls_.push_back(std::move(call));
}

}  // namespace strata
