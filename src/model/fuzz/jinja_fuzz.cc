// Fuzz target: a chat template's source through ChatTemplate::Parse (lexer,
// parser, nesting limits) and, if it parses, Render with a small fixed
// context: system/user/assistant messages with a tool call and a tool result,
// one tool, bos/eos tokens, chat_template_kwargs, a pinned clock.
// Limits are lowered (256 KiB of output, 20,000 steps) so the fuzzer spends
// its time on many inputs, not on one long loop; the engine enforces the
// same checks at its real limits (RenderLimits).
// Checks: parse and render errors are InvalidArgument with a message; the
// output is within the limit.
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/fuzz/model_fuzz.h"
#include "model/jinja/chat_template.h"

namespace strata::fuzz {
namespace {

const ChatTemplateInputs& Inputs() {
  static const ChatTemplateInputs inputs = [] {
    using J = nlohmann::ordered_json;
    ChatTemplateInputs in;
    in.messages = J::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is the weather in Paris? \u00e9\u65e5"},
      {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks!"}]}
    ])");
    in.tools = J::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Current weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
    in.extra = J{{"enable_thinking", false}};
    in.bos_token = "<s>";
    in.eos_token = "</s>";
    std::tm now{};
    now.tm_year = 126;
    now.tm_mon = 11;
    now.tm_mday = 1;
    in.now = now;
    in.limits.max_output_bytes = 256 << 10;
    in.limits.max_steps = 20'000;
    return in;
  }();
  return inputs;
}

}  // namespace

int JinjaOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) {
    FUZZ_CHECK(tmpl.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(!tmpl.status().message().empty());
    return 0;
  }
  auto out = (*tmpl)->Render(Inputs());
  if (!out.ok()) {
    FUZZ_CHECK(out.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(!out.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(out->size() <= Inputs().limits.max_output_bytes);
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(JinjaOneInput)
