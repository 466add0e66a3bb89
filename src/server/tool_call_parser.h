// Tool calls out of model text: the `--tool-call-parser` of `strata serve`.
// Each model family writes its calls in its own syntax; a parser turns that
// syntax, as the detokenized output streams in, into content text that is
// safe to send and tool-call events (start: id + name; arguments; end).
//
//   hermes (alias qwen25)  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   (Qwen 2.5/3, Hermes) llama3                 [<|python_tag|>]{"name": "f", "parameters":
//   {...}}[; {...}]    (Llama 3.1-3.3 JSON) mistral                [TOOL_CALLS] [{"name": "f",
//   "arguments": {...}}, ...]          (tokenizer < v11)
//                          [TOOL_CALLS]f[ARGS]{...}  ([CALL_ID]id before [ARGS] too)     (v11+)
//   deepseekv3             <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f
//                          ```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//                          (and V3.1's
//                          <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>)
//
// What is held back, and why: text that could be the start of a call's
// markup (a partial marker at the end of what came so far, or an open call
// whose markup has not closed) is held until it either becomes a call or
// cannot be one; whitespace right before and right after a call's markup
// is dropped (it only separated the markup from the text), so trailing
// whitespace of content is held until the next non-whitespace text decides. A call is sent whole,
// when its markup closes and its JSON parses: a stream therefore never carries a call that the same
// text, parsed at once, would not have produced, and the event sequence is the same however the
// text was cut into pieces. At the end, markup that never became a call (malformed JSON, no name,
// never closed) is returned as plain content, unchanged.
//
// Arguments are the parsed JSON object, serialized compactly (key order
// kept), so `function.arguments` is always a JSON string that parses.
//
// Thread-safety: a ToolCallParser belongs to one choice of one response and
// is used by one thread at a time; the free functions are pure.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

enum class ToolCallFormat { kNone, kLlama3, kHermes, kMistral, kDeepSeekV3 };

// The names `--tool-call-parser` takes besides "auto" (SGLang's and vLLM's
// names): llama3, hermes, qwen25 (= hermes), mistral, deepseekv3. nullopt
// for any other name (including "auto").
std::optional<ToolCallFormat> ToolCallFormatFromName(std::string_view name);
// "llama3", "hermes", "mistral", "deepseekv3"; "none" for kNone.
const char* ToolCallFormatName(ToolCallFormat format);
// For messages: every value `--tool-call-parser` accepts.
inline constexpr std::string_view kToolCallParserNames =
    "auto, llama3, hermes, qwen25, mistral, deepseekv3";

// `--tool-call-parser auto`: the format a chat template writes tool calls
// in, from the markers in its text (<｜tool▁calls▁begin｜> deepseekv3,
// [TOOL_CALLS] mistral, <tool_call> hermes, <|python_tag|> or Llama 3's
// header tokens with "parameters" llama3); kNone when none appears.
ToolCallFormat DetectToolCallFormat(std::string_view chat_template_source);

struct ToolCallEvent {
  enum class Kind { kStart, kArguments, kEnd };
  Kind kind = Kind::kStart;
  int index = 0;          // the call's position in this choice's output, from 0
  std::string id;         // kStart
  std::string name;       // kStart
  std::string arguments;  // kArguments: the next fragment of the JSON text
};

// A finished call, as message.tool_calls carries it.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object's text
  bool operator==(const ToolCall&) const = default;
};

// What one piece of text produced.
struct ToolParseOutput {
  std::string content;  // safe to send as content now
  std::vector<ToolCallEvent>
      events;  // in order; every kStart is followed by its kArguments and kEnd
};

// Appends `from` to `to` (content and events).
void AppendToolParseOutput(ToolParseOutput& to, ToolParseOutput from);

// A fresh call id: "call_" + 24 random alphanumerics (mistral: 9
// alphanumerics, which Mistral's chat templates require of ids sent back).
std::string NewToolCallId(ToolCallFormat format);

class ToolCallParser {
 public:
  using IdSource = std::function<std::string()>;
  // REQUIRES: format != kNone. `ids` makes call ids (tests pass a counter);
  // default NewToolCallId(format).
  static std::unique_ptr<ToolCallParser> Create(ToolCallFormat format, IdSource ids = {});
  virtual ~ToolCallParser() = default;

  // The next piece of output text (any split, even inside a UTF-8
  // character or a marker).
  ToolParseOutput Add(std::string_view piece);
  // End of the output: whatever is still held back, as content (or the last
  // call, for formats whose calls need no closing marker). Call once.
  ToolParseOutput Finish();

  // Calls produced so far, in order.
  const std::vector<ToolCall>& calls() const { return calls_; }

 protected:
  explicit ToolCallParser(IdSource ids) : ids_(std::move(ids)) {}

  // Consumes what it can from the front of buf_; returns true when it made
  // progress and should be called again. at_end: no more text will come,
  // so nothing may wait.
  virtual bool Step(bool at_end) = 0;

  // Content text: trailing whitespace is held until later text decides
  // whether it separates content (kept) or precedes a call (dropped).
  void EmitContent(std::string_view text);
  // A call made of `name` and the JSON text of its arguments (an object).
  void EmitCall(const std::string& name, const std::string& arguments);
  // Emits all of buf_ but the longest tail that could start `marker`
  // (everything at the end).
  void EmitContentUpTo(std::string_view marker, bool at_end);

  // Drops the first n bytes of buf_ (decided).
  void Consume(size_t n);
  // Where the JSON object or array that starts at buf_[start] (after
  // whitespace) ends: one past its closing bracket; kJsonNeedMore while it
  // has not closed; kJsonInvalid when none starts there or it nests deeper
  // than 128 (model output: the bound keeps the parse of what it found from
  // recursing without limit). Resumes where the last call stopped while
  // buf_ only grew, so a long call costs time linear in its length.
  size_t ScanJson(size_t start);
  // buf_.find(marker, from), resuming past the bytes an earlier search for
  // the same marker and start already ruled out (linear in a long call).
  size_t FindMarker(std::string_view marker, size_t from = 0);
  static constexpr size_t kJsonNeedMore = static_cast<size_t>(-1);
  static constexpr size_t kJsonInvalid = static_cast<size_t>(-2);

  std::string buf_;  // text not yet decided; only Consume() shortens it

 private:
  struct JsonScan {
    size_t start = static_cast<size_t>(-1);  // where the scanned value starts in buf_
    size_t pos = 0;                          // next byte to scan
    int depth = 0;
    bool in_string = false, escaped = false;
    size_t result = kJsonNeedMore;  // once decided
  };
  JsonScan scan_;
  struct MarkerSearch {
    const char* marker = nullptr;  // the marker's constant, by address
    size_t from = 0;
    size_t searched_to = 0;  // buf_ had no match starting before searched_to - size + 1
  };
  MarkerSearch find_;
  IdSource ids_;
  std::string pending_ws_;   // trailing whitespace of the content, held
  bool after_call_ = false;  // no content since the last call: leading whitespace is dropped
  ToolParseOutput out_;
  std::vector<ToolCall> calls_;
};

}  // namespace strata
