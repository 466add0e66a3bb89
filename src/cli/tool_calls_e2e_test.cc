// End-to-end tests of --tool-call-parser and --reasoning-parser through the
// real binary: a bad parser name is exit 78; `auto` picks hermes for a
// Qwen-style template (logged); chat requests with tools and tool_choice
// auto/none succeed with well-formed responses, streamed and not, and
// required/named force a well-formed call (constrained decoding) whose
// arguments match the tool's schema, or are a 400 without a parser. The
// tiny random model left alone writes gibberish, never a tool call, and no test-only output path
// exists, so what the parsers do to real calls is tested on canned text
// (server/tool_call_parser_test.cc); here the wiring: plain text passes the
// tool-call parser unchanged, and deepseek-r1 (output starts inside the
// reasoning) moves the whole unclosed output into reasoning_content.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/serve_test_process.h"
#include "server/http_test_client.h"

namespace {

using namespace strata::http_test;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;

// Qwen 2.5's tool-calling template, shortened: tools in a system turn, the
// assistant's calls as <tool_call> JSON, tool results as <tool_response>.
constexpr const char* kHermesTemplate = R"TPL({%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '<|im_start|>assistant' }}{% if message.content %}{{- '\n' + message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}
{{- '\n<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' + (tool_call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})TPL";

// The qwen3 fixture with the hermes template above (chat_template.jinja wins
// over tokenizer_config.json): a directory of links in the test's temp dir.
std::string HermesModel() {
  static const std::string dir = [] {
    const fs::path d =
        fs::path(::testing::TempDir()) / ("hermes_model_" + std::to_string(getpid()));
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(Fixture("qwen3"))) {
      if (e.path().filename() == "chat_template.jinja") continue;
      const fs::path link = d / e.path().filename();
      if (!fs::exists(link)) fs::create_symlink(e.path(), link);
    }
    std::ofstream(d / "chat_template.jinja") << kHermesTemplate;
    return d.string();
  }();
  return dir;
}

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

json ChatBody(const std::string& tool_choice, bool stream) {
  json body = {{"model", "m"},
               {"messages", json::parse(R"([{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                   {"role": "user", "content": "And in Rome?"}])")},
               {"tools", kTools},
               {"max_tokens", 24},
               {"temperature", 0},
               {"stream", stream}};
  if (!tool_choice.empty()) body["tool_choice"] = tool_choice;
  return body;
}

// A well-formed chat message: content a string (or null with tool calls),
// every tool call with an id, type function, a name and JSON object arguments.
void ExpectWellFormedMessage(const json& choice) {
  const json& m = choice["message"];
  EXPECT_EQ(m["role"], "assistant");
  const bool calls = m.contains("tool_calls");
  EXPECT_TRUE(m["content"].is_string() || (calls && m["content"].is_null())) << m.dump();
  if (calls) {
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    for (const json& c : m["tool_calls"]) {
      EXPECT_TRUE(c["id"].get<std::string>().starts_with("call_"));
      EXPECT_EQ(c["type"], "function");
      EXPECT_TRUE(json::parse(c["function"]["arguments"].get<std::string>()).is_object());
    }
  } else {
    EXPECT_THAT(std::string(choice["finish_reason"]), ::testing::AnyOf("stop", "length"));
  }
}

// A streamed chat response's content and tool calls, reassembled from its
// events (and every event checked to be JSON, ending in [DONE]).
struct Streamed {
  std::string content, reasoning, finish_reason;
  json tool_calls = json::array();
};
Streamed Reassemble(const std::string& sse) {
  Streamed s;
  size_t pos = 0;
  std::string last;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    last = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (last == "[DONE]") break;
    const json ev = json::parse(last);
    for (const json& ch : ev["choices"]) {
      const json& d = ch["delta"];
      if (d.contains("content") && d["content"].is_string())
        s.content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) s.reasoning += d["reasoning_content"].get<std::string>();
      for (const json& tc : d.value("tool_calls", json::array())) {
        const size_t i = tc["index"];
        if (i == s.tool_calls.size())
          s.tool_calls.push_back(
              {{"id", tc["id"]}, {"name", tc["function"]["name"]}, {"arguments", ""}});
        s.tool_calls[i]["arguments"] = s.tool_calls[i]["arguments"].get<std::string>() +
                                       tc["function"]["arguments"].get<std::string>();
      }
      if (!ch["finish_reason"].is_null()) s.finish_reason = ch["finish_reason"];
    }
  }
  EXPECT_EQ(last, "[DONE]");
  return s;
}

TEST(ToolCallsE2E, BadParserNamesExit78) {
  Server s({"--model-path", Fixture("qwen3"), "--tool-call-parser", "hermes2"});
  EXPECT_EQ(s.WaitExit(std::chrono::seconds(10)), 78);
  EXPECT_THAT(s.Log(),
              HasSubstr("--tool-call-parser: 'hermes2' is not one of auto, llama3, hermes, qwen25, "
                        "mistral, deepseekv3"));
  Server r({"--model-path", Fixture("qwen3"), "--reasoning-parser", "r1"});
  EXPECT_EQ(r.WaitExit(std::chrono::seconds(10)), 78);
  EXPECT_THAT(r.Log(), HasSubstr("--reasoning-parser: 'r1' is not one of qwen3, deepseek-r1"));
}

TEST(ToolCallsE2E, AutoPicksHermesForAQwenTemplateAndNoneForPlainChatMl) {
  Server s(
      {"--model-path", HermesModel(), "--served-model-name", "m", "--tool-call-parser", "auto"});
  ASSERT_GT(s.port(), 0) << s.Log();
  EXPECT_THAT(
      s.Log(),
      HasSubstr("tool-call parser: hermes (--tool-call-parser auto, chosen by the chat template)"));
  Server p(
      {"--model-path", Fixture("qwen3"), "--served-model-name", "m", "--tool-call-parser", "auto"});
  ASSERT_GT(p.port(), 0) << p.Log();
  EXPECT_THAT(p.Log(), HasSubstr("tool-call parser: none (--tool-call-parser auto"));
}

TEST(ToolCallsE2E, ToolRequestsAreWellFormedStreamedAndNot) {
  Server plain({"--model-path", HermesModel(), "--served-model-name", "m"});
  Server s(
      {"--model-path", HermesModel(), "--served-model-name", "m", "--tool-call-parser", "auto"});
  ASSERT_GT(plain.port(), 0) << plain.Log();
  ASSERT_GT(s.port(), 0) << s.Log();
  // The raw output, without a parser.
  Response raw = plain.PostJson("/v1/chat/completions", ChatBody("auto", false).dump());
  ASSERT_EQ(raw.status, 200) << raw.body;
  const std::string raw_text = json::parse(raw.body)["choices"][0]["message"]["content"];

  for (const std::string choice : {"", "auto", "none"}) {
    SCOPED_TRACE("tool_choice '" + choice + "'");
    Response r = s.PostJson("/v1/chat/completions", ChatBody(choice, false).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    ExpectWellFormedMessage(j["choices"][0]);
    if (raw_text.find("<tool_call>") == std::string::npos) {
      // Gibberish without markup passes the parser unchanged.
      EXPECT_EQ(j["choices"][0]["message"]["content"], raw_text);
      EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
    }
    Response st = s.PostJson("/v1/chat/completions", ChatBody(choice, true).dump());
    ASSERT_EQ(st.status, 200) << st.body;
    const Streamed streamed = Reassemble(st.body);
    const json& m = j["choices"][0]["message"];
    EXPECT_EQ(streamed.content, m["content"].is_string() ? m["content"].get<std::string>() : "");
    EXPECT_EQ(streamed.tool_calls.size(), m.value("tool_calls", json::array()).size());
    EXPECT_EQ(streamed.finish_reason, j["choices"][0]["finish_reason"]);
  }
  // required / a named function: constrained decoding forces a call in the
  // parser's syntax whose arguments match the tool's parameters, whatever
  // the (random) model prefers; greedy and sampled, streamed and not.
  for (const std::string forced :
       {R"("required")", R"({"type": "function", "function": {"name": "get_weather"}})"}) {
    for (const float temperature : {0.f, 1.f}) {
      SCOPED_TRACE("tool_choice " + forced + " temperature " + std::to_string(temperature));
      json body = ChatBody("", false);
      body["tool_choice"] = json::parse(forced);
      body["max_tokens"] = 200;
      body["temperature"] = temperature;
      body["seed"] = 5;
      // Generous: a loaded 2-core machine takes seconds; a hang takes forever.
      Response r = s.PostJson("/v1/chat/completions", body.dump(), "", std::chrono::seconds(120));
      ASSERT_EQ(r.status, 200) << r.body;
      const json j = json::parse(r.body);
      ExpectWellFormedMessage(j["choices"][0]);
      const json& m = j["choices"][0]["message"];
      ASSERT_TRUE(m.contains("tool_calls")) << r.body;
      ASSERT_GE(m["tool_calls"].size(), 1u);
      if (forced != R"("required")") EXPECT_EQ(m["tool_calls"].size(), 1u);
      for (const json& c : m["tool_calls"]) {
        EXPECT_EQ(c["function"]["name"], "get_weather");
        const json args = json::parse(c["function"]["arguments"].get<std::string>());
        EXPECT_TRUE(args["city"].is_string()) << args.dump();  // required by the schema
      }
      body["stream"] = true;
      Response st = s.PostJson("/v1/chat/completions", body.dump(), "", std::chrono::seconds(120));
      ASSERT_EQ(st.status, 200) << st.body;
      const Streamed streamed = Reassemble(st.body);
      EXPECT_EQ(streamed.tool_calls.size(), m["tool_calls"].size());
      EXPECT_EQ(streamed.finish_reason, j["choices"][0]["finish_reason"]);
    }
    // Without a --tool-call-parser there is no syntax to force.
    json body = ChatBody("", false);
    body["tool_choice"] = json::parse(forced);
    Response r = plain.PostJson("/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_THAT(r.body, HasSubstr("--tool-call-parser"));
    EXPECT_THAT(r.body, HasSubstr("\"param\":\"tool_choice\""));
  }
}

TEST(ToolCallsE2E, ReasoningParserSplitsTheOutput) {
  Server plain({"--model-path", HermesModel(), "--served-model-name", "m"});
  Server r1({"--model-path", HermesModel(), "--served-model-name", "m", "--reasoning-parser",
             "deepseek-r1"});
  Server q3(
      {"--model-path", HermesModel(), "--served-model-name", "m", "--reasoning-parser", "qwen3"});
  ASSERT_GT(plain.port(), 0) << plain.Log();
  ASSERT_GT(r1.port(), 0) << r1.Log();
  ASSERT_GT(q3.port(), 0) << q3.Log();
  json body = {{"model", "m"},
               {"messages", {{{"role", "user"}, {"content", "Think first."}}}},
               {"max_tokens", 16},
               {"temperature", 0},
               {"ignore_eos", true}};
  Response raw = plain.PostJson("/v1/chat/completions", body.dump());
  ASSERT_EQ(raw.status, 200) << raw.body;
  const std::string text = json::parse(raw.body)["choices"][0]["message"]["content"];
  ASSERT_EQ(text.find("</think>"), std::string::npos)
      << "the fixture's gibberish closed a think block";

  // deepseek-r1: the output starts inside the reasoning and never closes it.
  Response a = r1.PostJson("/v1/chat/completions", body.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  const json am = json::parse(a.body)["choices"][0]["message"];
  EXPECT_EQ(am["reasoning_content"], text.starts_with("<think>") ? text.substr(7) : text);
  EXPECT_EQ(am["content"], "");
  body["stream"] = true;
  Response as = r1.PostJson("/v1/chat/completions", body.dump());
  ASSERT_EQ(as.status, 200);
  const Streamed s = Reassemble(as.body);
  EXPECT_EQ(s.reasoning, am["reasoning_content"]);
  EXPECT_EQ(s.content, "");
  // enable_thinking false: no reasoning expected, everything is content.
  body["stream"] = false;
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  Response off = r1.PostJson("/v1/chat/completions", body.dump());
  ASSERT_EQ(off.status, 200);
  EXPECT_EQ(json::parse(off.body)["choices"][0]["message"]["content"], text);
  EXPECT_FALSE(json::parse(off.body)["choices"][0]["message"].contains("reasoning_content"));
  // qwen3: output that does not open <think> is all content.
  body.erase("chat_template_kwargs");
  Response q = q3.PostJson("/v1/chat/completions", body.dump());
  ASSERT_EQ(q.status, 200);
  if (!text.starts_with("<think>")) {
    EXPECT_EQ(json::parse(q.body)["choices"][0]["message"]["content"], text);
    EXPECT_FALSE(json::parse(q.body)["choices"][0]["message"].contains("reasoning_content"));
  }
}

}  // namespace

namespace {

// /v1/responses runs the chat path: the same conversation as Responses items
// (function_call + function_call_output) renders the same prompt as its chat
// form, so greedy output and token counts are equal; reasoning and tools
// come out as output items, streamed and not.
TEST(ResponsesE2E, ItemsRenderLikeChatAndReasoningIsAnItem) {
  Server r1({"--model-path", HermesModel(), "--served-model-name", "m", "--reasoning-parser",
             "deepseek-r1"});
  ASSERT_GT(r1.port(), 0) << r1.Log();
  // ordered_json: the template renders the tools as sent (key order counts).
  using ojson = nlohmann::ordered_json;
  const std::string params = R"({"type": "object", "properties": {"city": {"type": "string"}},
                                  "required": ["city"]})";
  ojson chat = ojson::parse(R"({"model": "m", "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
      {"role": "user", "content": "And in Rome?"}],
      "max_tokens": 12, "temperature": 0, "ignore_eos": true})");
  chat["tools"] = ojson::array({{{"type", "function"},
                                 {"function",
                                  {{"name", "get_weather"},
                                   {"description", "Current weather"},
                                   {"parameters", ojson::parse(params)}}}}});
  ojson responses = ojson::parse(R"({"model": "m", "input": [
      {"role": "user", "content": "Weather in Paris?"},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather",
       "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
      {"role": "user", "content": [{"type": "input_text", "text": "And in Rome?"}]}],
      "max_output_tokens": 12, "temperature": 0, "ignore_eos": true, "store": true})");
  responses["tools"] = ojson::array({{{"type", "function"},
                                      {"name", "get_weather"},
                                      {"description", "Current weather"},
                                      {"parameters", ojson::parse(params)}}});
  Response c = r1.PostJson("/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  Response r = r1.PostJson("/v1/responses", responses.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json cj = json::parse(c.body), rj = json::parse(r.body);
  EXPECT_EQ(rj["object"], "response");
  EXPECT_TRUE(rj["id"].get<std::string>().starts_with("resp_"));
  EXPECT_EQ(rj["store"], true) << "kept: store is true and the server has a store";
  EXPECT_EQ(rj["usage"]["input_tokens"], cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(rj["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);
  EXPECT_EQ(rj["status"], "incomplete");
  EXPECT_EQ(rj["incomplete_details"]["reason"], "max_output_tokens");
  // deepseek-r1 puts all of the (never closed) output in the reasoning.
  ASSERT_GE(rj["output"].size(), 1u) << rj.dump();
  const json& item = rj["output"][0];
  EXPECT_EQ(item["type"], "reasoning");
  EXPECT_EQ(item["content"][0]["text"], cj["choices"][0]["message"]["reasoning_content"]);

  // Streamed: reasoning_text deltas add up to the same text; sequence
  // numbers count from 0; the last event is response.incomplete.
  responses["stream"] = true;
  Response s = r1.PostJson("/v1/responses", responses.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  std::string reasoning, last_type;
  int64_t seq = 0;
  size_t pos = 0;
  while ((pos = s.body.find("data: ", pos)) != std::string::npos) {
    const size_t end = s.body.find("\n\n", pos);
    const json ev = json::parse(s.body.substr(pos + 6, end - pos - 6));
    pos = end;
    EXPECT_EQ(ev["sequence_number"], seq++);
    last_type = ev["type"];
    if (ev["type"] == "response.reasoning_text.delta") reasoning += ev["delta"].get<std::string>();
  }
  EXPECT_EQ(reasoning, item["content"][0]["text"]);
  EXPECT_EQ(last_type, "response.incomplete");
  EXPECT_EQ(s.body.find("[DONE]"), std::string::npos);

  // An unknown previous response is OpenAI's 400, naming the field and why.
  Response bad = r1.PostJson("/v1/responses",
                             R"({"model": "m", "input": "x", "previous_response_id": "resp_1"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("\"param\":\"previous_response_id\""));
  EXPECT_THAT(bad.body, HasSubstr("previous_response_not_found"));
  EXPECT_THAT(bad.body, HasSubstr("another replica"));
}

std::string Delete(const std::string& path) {
  return "DELETE " + path + " HTTP/1.1\r\nHost: test\r\n\r\n";
}

// The response store through the binary: store (default true) keeps a
// response; previous_response_id continues it (the prompt is the whole
// conversation: input_tokens equal the same conversation sent in full);
// item_reference resolves a stored item (equal to sending it inline); GET
// returns it, DELETE removes it, and every unknown id is an error saying
// so; store: false keeps nothing; --responses-store-max-items evicts the
// least recently used, seen in GET and in /metrics.
TEST(ResponsesE2E, StoreContinuesConversationsAndResolvesReferences) {
  Server r1({"--model-path", HermesModel(), "--served-model-name", "m",
             "--responses-store-max-items", "3"});
  ASSERT_GT(r1.port(), 0) << r1.Log();
  const std::string sampling = R"("max_output_tokens": 6, "temperature": 0, "ignore_eos": true)";
  Response first = r1.PostJson("/v1/responses",
                               R"({"model": "m", "input": "Weather in Paris?", )" + sampling + "}");
  ASSERT_EQ(first.status, 200) << first.body;
  const json fj = json::parse(first.body);
  EXPECT_EQ(fj["store"], true);
  const std::string id = fj["id"];
  const json message = fj["output"][0];
  ASSERT_EQ(message["type"], "message");

  // GET: the same object.
  Response got = r1.Request(Get("/v1/responses/" + id));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(json::parse(got.body), fj);

  // input_items: the input it was made from (a string input as a user
  // message item with an id); bad paging is a 400 naming the field; paths
  // and methods not served say so.
  Response items = r1.Request(Get("/v1/responses/" + id + "/input_items?order=asc"));
  ASSERT_EQ(items.status, 200) << items.body;
  const json ij = json::parse(items.body);
  EXPECT_EQ(ij["object"], "list");
  ASSERT_EQ(ij["data"].size(), 1u);
  EXPECT_EQ(ij["data"][0]["content"][0]["text"], "Weather in Paris?");
  EXPECT_EQ(ij["first_id"], ij["data"][0]["id"]);
  EXPECT_EQ(ij["has_more"], false);
  Response bad_limit = r1.Request(Get("/v1/responses/" + id + "/input_items?limit=0"));
  EXPECT_EQ(bad_limit.status, 400);
  EXPECT_THAT(bad_limit.body, HasSubstr("\"param\":\"limit\""));
  EXPECT_EQ(r1.PostJson("/v1/responses/" + id + "/cancel", "{}").status, 404);
  EXPECT_EQ(r1.PostJson("/v1/responses/" + id, "{}").status, 405);

  // previous_response_id == the conversation sent whole.
  Response next =
      r1.PostJson("/v1/responses", R"({"model": "m", "previous_response_id": ")" + id +
                                       R"(", "input": "And in Rome?", )" + sampling + "}");
  ASSERT_EQ(next.status, 200) << next.body;
  json whole = json::parse(R"({"model": "m", "input": [
      {"role": "user", "content": "Weather in Paris?"}], "max_output_tokens": 6,
      "temperature": 0, "ignore_eos": true, "store": false})");
  whole["input"].push_back(message);
  whole["input"].push_back({{"role", "user"}, {"content", "And in Rome?"}});
  Response full = r1.PostJson("/v1/responses", whole.dump());
  ASSERT_EQ(full.status, 200) << full.body;
  const json nj = json::parse(next.body), wj = json::parse(full.body);
  EXPECT_EQ(nj["previous_response_id"], id);
  EXPECT_EQ(nj["usage"]["input_tokens"], wj["usage"]["input_tokens"]);
  EXPECT_EQ(nj["output"][0]["content"][0]["text"], wj["output"][0]["content"][0]["text"])
      << "greedy: the same prompt gives the same text";
  EXPECT_GT(nj["usage"]["input_tokens"].get<int>(), fj["usage"]["input_tokens"].get<int>());
  EXPECT_EQ(wj["store"], false);
  EXPECT_EQ(r1.Request(Get("/v1/responses/" + wj["id"].get<std::string>())).status, 404)
      << "store: false keeps nothing";

  // item_reference == the item inline (what the Vercel AI SDK sends).
  json ref = whole;
  ref.erase("store");  // the default: true
  ref["input"][1] = {{"type", "item_reference"}, {"id", message["id"]}};
  Response refd = r1.PostJson("/v1/responses", ref.dump());
  ASSERT_EQ(refd.status, 200) << refd.body;
  EXPECT_EQ(json::parse(refd.body)["usage"]["input_tokens"], wj["usage"]["input_tokens"]);
  ref["input"][1]["id"] = "msg_unknown";
  Response unknown_item = r1.PostJson("/v1/responses", ref.dump());
  EXPECT_EQ(unknown_item.status, 404) << unknown_item.body;
  EXPECT_THAT(unknown_item.body, HasSubstr("\"param\":\"input[1]\""));
  EXPECT_THAT(unknown_item.body, HasSubstr("msg_unknown"));

  // Streamed responses are kept too, as their response.completed said.
  Response streamed = r1.PostJson(
      "/v1/responses", R"({"model": "m", "input": "hi", "stream": true, )" + sampling + "}");
  ASSERT_EQ(streamed.status, 200);
  const size_t at = streamed.body.rfind("data: ");
  const json done = json::parse(streamed.body.substr(at + 6))["response"];
  Response sgot = r1.Request(Get("/v1/responses/" + done["id"].get<std::string>()));
  ASSERT_EQ(sgot.status, 200) << sgot.body;
  EXPECT_EQ(json::parse(sgot.body), done);

  // Three kept at most: first, next, refd, then streamed evicted the least
  // recently used -- first: refd's reference was found in next (which holds
  // first's message in its conversation too, and is the newer holder).
  Response evicted = r1.Request(Get("/v1/responses/" + id));
  EXPECT_EQ(evicted.status, 404) << "evicted";
  EXPECT_THAT(evicted.body, HasSubstr("evicted"));
  EXPECT_EQ(r1.Request(Get("/v1/responses/" + nj["id"].get<std::string>())).status, 200);
  EXPECT_EQ(r1.Metric("strata_responses_store_responses{model=\"m\",role=\"colocated\"}"), 3);
  EXPECT_EQ(r1.Metric("strata_responses_store_evictions_total{model=\"m\",role=\"colocated\"}"), 1);
  // Its message is still there, in next's conversation.
  ref["input"][1]["id"] = message["id"];
  EXPECT_EQ(r1.PostJson("/v1/responses", ref.dump()).status, 200);

  // DELETE, then it is gone.
  const std::string sid = nj["id"];
  Response del = r1.Request(Delete("/v1/responses/" + sid));
  ASSERT_EQ(del.status, 200) << del.body;
  EXPECT_EQ(json::parse(del.body), json({{"id", sid}, {"object", "response"}, {"deleted", true}}));
  EXPECT_EQ(r1.Request(Delete("/v1/responses/" + sid)).status, 404);
  EXPECT_EQ(r1.Request(Get("/v1/responses/" + sid)).status, 404);
  EXPECT_EQ(r1.Metric("strata_responses_store_responses{model=\"m\",role=\"colocated\"}"), 2);
}

// --responses-store-max-items 0: nothing kept, store answered false, and a
// reference says the server keeps none.
TEST(ResponsesE2E, StoreOffKeepsNothing) {
  Server r1({"--model-path", HermesModel(), "--served-model-name", "m",
             "--responses-store-max-items", "0"});
  ASSERT_GT(r1.port(), 0) << r1.Log();
  Response r =
      r1.PostJson("/v1/responses", R"({"model": "m", "input": "x", "max_output_tokens": 2})");
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["store"], false);
  EXPECT_EQ(r1.Request(Get("/v1/responses/" + j["id"].get<std::string>())).status, 404);
  Response bad =
      r1.PostJson("/v1/responses", R"({"model": "m", "input": "x", "previous_response_id": ")" +
                                       j["id"].get<std::string>() + "\"}");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("--responses-store-max-items 0"));
}

}  // namespace
