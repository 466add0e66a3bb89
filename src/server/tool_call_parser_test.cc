// Tool-call parsers on canned model text: each case is parsed whole, split
// in two at every byte position, and byte by byte; every way must give the
// same content and calls (the event stream reassembled).
#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

namespace strata {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
  bool operator==(const Parsed&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Parsed& p) {
  os << "content=" << nlohmann::json(p.content).dump() << " calls=[";
  for (const ToolCall& c : p.calls) os << "{" << c.id << " " << c.name << " " << c.arguments << "}";
  return os << "]";
}

// Runs the parser over `pieces` and rebuilds calls from the events, checking
// the event grammar (start, arguments..., end; indexes 0, 1, ...).
Parsed ParseWith(ToolCallFormat format, const std::vector<std::string>& pieces) {
  int next_id = 0;
  auto parser = ToolCallParser::Create(format, [&] { return "id" + std::to_string(next_id++); });
  ToolParseOutput all;
  for (const std::string& p : pieces) AppendToolParseOutput(all, parser->Add(p));
  AppendToolParseOutput(all, parser->Finish());
  Parsed out;
  out.content = all.content;
  bool open = false;
  for (const ToolCallEvent& e : all.events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::kStart:
        EXPECT_FALSE(open) << "a call started inside another";
        EXPECT_EQ(e.index, static_cast<int>(out.calls.size()));
        out.calls.push_back({e.id, e.name, ""});
        open = true;
        break;
      case ToolCallEvent::Kind::kArguments:
        EXPECT_TRUE(open);
        EXPECT_EQ(e.index, static_cast<int>(out.calls.size()) - 1);
        if (!out.calls.empty()) out.calls.back().arguments += e.arguments;
        break;
      case ToolCallEvent::Kind::kEnd:
        EXPECT_TRUE(open);
        open = false;
        break;
    }
  }
  EXPECT_FALSE(open) << "a call never ended";
  EXPECT_EQ(out.calls.size(), parser->calls().size());
  for (size_t i = 0; i < out.calls.size() && i < parser->calls().size(); ++i)
    EXPECT_EQ(out.calls[i], parser->calls()[i]);
  for (const ToolCall& c : out.calls)
    EXPECT_TRUE(nlohmann::json::parse(c.arguments, nullptr, false).is_object()) << c.arguments;
  return out;
}

void ExpectParses(ToolCallFormat format, const std::string& text, const Parsed& want) {
  EXPECT_EQ(ParseWith(format, {text}), want) << "whole: " << text;
  for (size_t k = 0; k <= text.size(); ++k) {
    const Parsed got = ParseWith(format, {text.substr(0, k), text.substr(k)});
    ASSERT_EQ(got, want) << "split at byte " << k << " of " << text;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(ParseWith(format, bytes), want) << "byte by byte: " << text;
}

Parsed Content(const std::string& text) { return {text, {}}; }

// --- hermes / qwen25 -------------------------------------------------------

TEST(HermesToolCalls, OneCallAfterText) {
  ExpectParses(ToolCallFormat::kHermes,
               "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
               "{\"city\": \"Paris\", "
               "\"unit\": \"c\"}}\n</tool_call>",
               {"Let me check.", {{"id0", "get_weather", R"({"city":"Paris","unit":"c"})"}}});
}

TEST(HermesToolCalls, SeveralCalls) {
  ExpectParses(
      ToolCallFormat::kHermes,
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"}\"}]}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n",
      {"", {{"id0", "a", R"({"x":[1,{"y":"}"}]})"}, {"id1", "b", "{}"}}});
}

TEST(HermesToolCalls, TextAfterACallIsContent) {
  ExpectParses(ToolCallFormat::kHermes,
               "<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": \"東京\"}}</tool_call>\nDone.",
               {"Done.", {{"id0", "a", R"({"q":"東京"})"}}});
}

TEST(HermesToolCalls, PlainTextIsUntouched) {
  ExpectParses(ToolCallFormat::kHermes, "a < b and <tool> x </tool_call> y\n\n",
               Content("a < b and <tool> x </tool_call> y\n\n"));
  ExpectParses(ToolCallFormat::kHermes, "", Content(""));
  ExpectParses(ToolCallFormat::kHermes, "  \n", Content("  \n"));
}

TEST(HermesToolCalls, MalformedCallsStayContent) {
  const std::string bad_json =
      "Sure <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> ok";
  ExpectParses(ToolCallFormat::kHermes, bad_json, Content(bad_json));
  const std::string no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
  ExpectParses(ToolCallFormat::kHermes, no_name, Content(no_name));
  const std::string truncated = "x <tool_call>\n{\"name\": \"f\", \"argu";
  ExpectParses(ToolCallFormat::kHermes, truncated, Content(truncated));
  const std::string partial_marker = "x <tool_ca";
  ExpectParses(ToolCallFormat::kHermes, partial_marker, Content(partial_marker));
}

TEST(HermesToolCalls, UnclosedButCompleteCallAtTheEnd) {
  ExpectParses(ToolCallFormat::kHermes,
               "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n",
               {"", {{"id0", "f", R"({"a":1})"}}});
}

TEST(HermesToolCalls, ArgumentsSentAsAJsonString) {
  ExpectParses(ToolCallFormat::kHermes,
               "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
               {"", {{"id0", "f", R"({"a":1})"}}});
}

TEST(HermesToolCalls, GoodCallAfterABadOne) {
  ExpectParses(
      ToolCallFormat::kHermes,
      "<tool_call>{oops}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
      {"<tool_call>{oops}</tool_call>", {{"id0", "g", "{}"}}});
}

// --- llama3 ----------------------------------------------------------------

TEST(Llama3ToolCalls, BareJsonCall) {
  ExpectParses(ToolCallFormat::kLlama3,
               "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
               {"", {{"id0", "get_weather", R"({"city":"Paris"})"}}});
}

TEST(Llama3ToolCalls, PythonTagAndSeveralCalls) {
  ExpectParses(
      ToolCallFormat::kLlama3,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"{;}\"}}; {\"name\": \"b\", "
      "\"arguments\": {}}",
      {"", {{"id0", "a", R"({"s":"{;}"})"}, {"id1", "b", "{}"}}});
}

TEST(Llama3ToolCalls, TextBeforeATaggedCall) {
  ExpectParses(ToolCallFormat::kLlama3,
               "Sure.\n<|python_tag|>{\"name\": \"a\", \"parameters\": {\"n\": 1}}",
               {"Sure.", {{"id0", "a", R"({"n":1})"}}});
}

TEST(Llama3ToolCalls, JsonThatIsNotACallIsContent) {
  ExpectParses(ToolCallFormat::kLlama3, "{\"answer\": 42} is it",
               Content("{\"answer\": 42} is it"));
  ExpectParses(ToolCallFormat::kLlama3, "Hello {\"name\": \"a\", \"parameters\": {}}",
               Content("Hello {\"name\": \"a\", \"parameters\": {}}"));
  ExpectParses(ToolCallFormat::kLlama3, "<|python_tag|>print(\"hi\")",
               Content("<|python_tag|>print(\"hi\")"));
  ExpectParses(ToolCallFormat::kLlama3, "{\"name\": \"a\", \"parameters\": {",
               Content("{\"name\": \"a\", \"parameters\": {"));
  ExpectParses(ToolCallFormat::kLlama3, "<|python_tag|>{\"name\": 1}",
               Content("<|python_tag|>{\"name\": 1}"));
}

TEST(Llama3ToolCalls, TextAfterACall) {
  ExpectParses(ToolCallFormat::kLlama3, "{\"name\": \"a\", \"parameters\": {}}; and then",
               {"; and then", {{"id0", "a", "{}"}}});
}

TEST(Llama3ToolCalls, DeepNestingIsContentNotRecursion) {
  const std::string deep = std::string(5000, '[');
  const std::string text = "{\"name\": \"a\", \"parameters\": " + deep;
  EXPECT_EQ(ParseWith(ToolCallFormat::kLlama3, {text}), Content(text));
}

// --- mistral ---------------------------------------------------------------

TEST(MistralToolCalls, ArrayForm) {
  ExpectParses(
      ToolCallFormat::kMistral,
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": "
      "\"get_time\", \"arguments\": {}}]",
      {"", {{"id0", "get_weather", R"({"city":"Paris"})"}, {"id1", "get_time", "{}"}}});
}

TEST(MistralToolCalls, BareArrayWithoutTheSpecialToken) {
  ExpectParses(ToolCallFormat::kMistral, "[{\"name\": \"f\", \"arguments\": {\"a\": [1]}}]",
               {"", {{"id0", "f", R"({"a":[1]})"}}});
}

TEST(MistralToolCalls, V11NamedForm) {
  ExpectParses(
      ToolCallFormat::kMistral,
      "Checking. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
      {"Checking.", {{"id0", "get_weather", R"({"city":"Paris"})"}, {"id1", "get_time", "{}"}}});
}

TEST(MistralToolCalls, V13CallId) {
  ExpectParses(ToolCallFormat::kMistral, "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"x\": 1}",
               {"", {{"id0", "f", R"({"x":1})"}}});
}

TEST(MistralToolCalls, MalformedStaysContent) {
  for (const std::string text : {
           std::string("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": }]"),
           std::string("[TOOL_CALLS]not a name[ARGS]{}"),
           std::string("[TOOL_CALLS][ARGS]{}"),
           std::string("[TOOL_CALLS]f[ARGS]{\"x\": "),
           std::string("[TOOL_CALLS]"),
           std::string("[1, 2, 3] are numbers"),
           std::string("[TOOL_CA"),
       }) {
    ExpectParses(ToolCallFormat::kMistral, text, Content(text));
  }
}

// --- deepseekv3 ------------------------------------------------------------

TEST(DeepSeekV3ToolCalls, V3Calls) {
  ExpectParses(
      ToolCallFormat::kDeepSeekV3,
      "Let me "
      "look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": "
      "\"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
      "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {"Let me look.", {{"id0", "get_weather", R"({"city":"Tokyo"})"}, {"id1", "get_time", "{}"}}});
}

TEST(DeepSeekV3ToolCalls, V31Calls) {
  ExpectParses(
      ToolCallFormat::kDeepSeekV3,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"東京\"}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {"", {{"id0", "get_weather", R"({"city":"東京"})"}}});
}

TEST(DeepSeekV3ToolCalls, EndsWithoutTheSectionEnd) {
  ExpectParses(ToolCallFormat::kDeepSeekV3,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>\n",
               {"", {{"id0", "f", "{}"}}});
}

TEST(DeepSeekV3ToolCalls, MalformedStaysContent) {
  for (const std::string text : {
           std::string("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```"
                       "json\n{\"a\": }\n```"
                       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
           std::string("x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\""),
           std::string("<｜tool▁calls▁begin｜>hello"),
           std::string("<｜tool▁calls▁begin｜>"),
           std::string("<｜tool▁call"),
       }) {
    ExpectParses(ToolCallFormat::kDeepSeekV3, text, Content(text));
  }
}

// --- names, ids, auto -----------------------------------------------------

TEST(ToolCallParserNames, SglangAndVllmNames) {
  EXPECT_EQ(ToolCallFormatFromName("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatFromName("qwen25"), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatFromName("llama3"), ToolCallFormat::kLlama3);
  EXPECT_EQ(ToolCallFormatFromName("mistral"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatFromName("deepseekv3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(ToolCallFormatFromName("auto"), std::nullopt);
  EXPECT_EQ(ToolCallFormatFromName("Hermes"), std::nullopt);
}

TEST(ToolCallParserNames, AutoPicksByTheChatTemplate) {
  // Fragments of the real templates.
  EXPECT_EQ(
      DetectToolCallFormat("{{- '<|im_start|>assistant\\n<tool_call>\\n{\"name\": <function-name>, "
                           "\"arguments\": <args-json-object>}\\n</tool_call>' }}"),
      ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat(
                "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}} {{- "
                "'{\"name\": \"' + tool_call.name + '\", ' }} {{- '\"parameters\": ' }}"),
            ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("{{- \"<|python_tag|>\" + tool_call.name }}"),
            ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("{{- \"[TOOL_CALLS] [\" }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(
      DetectToolCallFormat("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}"),
      ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(DetectToolCallFormat("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kNone);
}

TEST(ToolCallParserNames, Ids) {
  const std::string id = NewToolCallId(ToolCallFormat::kHermes);
  EXPECT_TRUE(id.starts_with("call_"));
  EXPECT_EQ(id.size(), 29u);
  EXPECT_NE(id, NewToolCallId(ToolCallFormat::kHermes));
  const std::string mistral = NewToolCallId(ToolCallFormat::kMistral);
  EXPECT_EQ(mistral.size(), 9u);
  for (char c : mistral) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << mistral;
}

// --- properties on random text ---------------------------------------------

// Random text built from the markup's fragments: whatever it is, every split
// gives the same result, and text that made no call comes back unchanged.
TEST(ToolCallParserProperties, RandomMarkupIsSplitInvariantAndKeptWhenNotACall) {
  const std::vector<std::string> fragments = {
      "<tool_call>", "</tool_call>", "<tool_", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]",
      "[CALL_ID]", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
      "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "function", "```json\n", "```", "{", "}", "[",
      "]", ";", " ", "\n", "x", "\"", "\"name\": \"f\"", ", ",
      "\"arguments\": ", "\"parameters\": ", "{}", "f", "東",
      // whole calls, so that calls mix with the debris
      "{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "{\"name\": \"g\", \"parameters\": {}}",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", "[TOOL_CALLS]f[ARGS]{}",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"};
  std::mt19937 rng(7);
  int with_calls = 0;
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3,
                                ToolCallFormat::kMistral, ToolCallFormat::kDeepSeekV3}) {
    for (int n = 0; n < 300; ++n) {
      std::string text;
      const int pieces = 1 + static_cast<int>(rng() % 14);
      for (int k = 0; k < pieces; ++k) text += fragments[rng() % fragments.size()];
      const Parsed whole = ParseWith(format, {text});
      if (whole.calls.empty()) EXPECT_EQ(whole.content, text) << ToolCallFormatName(format);
      with_calls += !whole.calls.empty();
      for (size_t k = 0; k <= text.size(); ++k)
        ASSERT_EQ(ParseWith(format, {text.substr(0, k), text.substr(k)}), whole)
            << ToolCallFormatName(format) << " split at " << k << " of " << text;
      std::vector<std::string> bytes;
      for (char c : text) bytes.emplace_back(1, c);
      ASSERT_EQ(ParseWith(format, bytes), whole) << ToolCallFormatName(format) << ": " << text;
    }
  }
  EXPECT_GT(with_calls, 100) << "the random texts should make calls too";
}

// A call's markup is held until it closes: a 1 MB call fed 4 bytes at a
// time must cost time linear in its size (rescanning the held text on every
// piece took minutes), for every format. The bound only tells seconds from
// minutes.
TEST(ToolCallParserProperties, ALongCallCostsLinearTime) {
  const std::string big(1 << 20, 'x');
  const std::string args = "{\"s\": \"" + big + "\"}";
  const std::vector<std::pair<ToolCallFormat, std::string>> cases = {
      {ToolCallFormat::kHermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": " + args + "}</tool_call>"},
      {ToolCallFormat::kLlama3, "{\"name\": \"f\", \"parameters\": " + args + "}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]f[ARGS]" + args},
      {ToolCallFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": " + args + "}]"},
      {ToolCallFormat::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>" +
                                        args + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
  };
  for (const auto& [format, text] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    auto parser = ToolCallParser::Create(format, [] { return std::string("id"); });
    ToolParseOutput all;
    for (size_t k = 0; k < text.size(); k += 4)
      AppendToolParseOutput(all, parser->Add(text.substr(k, 4)));
    AppendToolParseOutput(all, parser->Finish());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 10.0) << ToolCallFormatName(format);
    EXPECT_EQ(all.content, "") << ToolCallFormatName(format);
    ASSERT_EQ(parser->calls().size(), 1u) << ToolCallFormatName(format);
    EXPECT_EQ(parser->calls()[0].arguments, "{\"s\":\"" + big + "\"}");
  }
}

}  // namespace
}  // namespace strata
