#include "server/openai_responses.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace strata {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

Json ChatBody(const std::string& responses_body) {
  std::vector<std::string> params;
  auto r = ResponsesToChatBody(Json::parse(responses_body), &params);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : Json();
}

ApiError ErrorOf(const std::string& body) {
  auto r = ParseResponsesRequest(body);
  EXPECT_FALSE(r.ok()) << body;
  return r.ok() ? ApiError{} : r.error();
}

TEST(ResponsesToChat, StringInputAndInstructions) {
  Json chat = ChatBody(R"({"model": "m", "instructions": "be brief", "input": "hi",
                            "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9})");
  EXPECT_EQ(chat["messages"], Json::parse(R"([{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "hi"}])"));
  EXPECT_EQ(chat["max_completion_tokens"], 7);
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["top_p"], 0.9);
  EXPECT_EQ(chat["model"], "m");
  EXPECT_FALSE(chat.contains("max_output_tokens"));
}

TEST(ResponsesToChat, ItemsBecomeMessagesWithToolCalls) {
  // A tool round trip as the OpenAI SDK and the AI SDK send it: the
  // assistant's reasoning, text and calls are one turn; each output a tool message.
  Json chat = ChatBody(R"({"input": [
      {"role": "developer", "content": "sys"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                      {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "message", "role": "assistant", "id": "msg_1",
       "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": ""},
      {"type": "function_call_output", "call_id": "c1", "output": "one"},
      {"type": "function_call_output", "call_id": "c2",
       "output": [{"type": "input_text", "text": "two"}]},
      {"role": "assistant", "content": "done"}]})");
  EXPECT_EQ(chat["messages"], Json::parse(R"([
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": "a\nb"},
      {"role": "assistant", "content": "calling", "reasoning_content": "think",
       "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
         {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "one"},
      {"role": "tool", "tool_call_id": "c2", "content": "two"},
      {"role": "assistant", "content": "done"}])"))
      << chat["messages"].dump(1);
  // And the chat parser takes it (arguments parsed for the template).
  auto r = ParseResponsesRequest(R"({"input": [
      {"role": "user", "content": "q"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "one"}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Json& m = r.value().chat.messages;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], Json::parse(R"({"x":1})"));
  EXPECT_EQ(m[2]["tool_call_id"], "c1");
}

TEST(ResponsesToChat, FlatFunctionToolsAndToolChoice) {
  Json chat = ChatBody(R"({"input": "x", "tools": [
      {"type": "function", "name": "get_weather", "description": "d",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
       "strict": true}],
      "tool_choice": {"type": "function", "name": "get_weather"},
      "parallel_tool_calls": false})");
  EXPECT_EQ(chat["tools"], Json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "d",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
      "strict": true}}])"));
  EXPECT_EQ(chat["tool_choice"], Json::parse(R"({"type": "function",
                                                 "function": {"name": "get_weather"}})"));
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(ChatBody(R"({"input": "x", "tool_choice": "required"})")["tool_choice"], "required");

  auto r = ParseResponsesRequest(
      R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().chat.tools[0]["function"]["name"], "f");
  EXPECT_EQ(r.value().chat.tool_choice, "auto");
  // The response object repeats the tools in the Responses shape.
  EXPECT_EQ(r.value().context.echo["tools"],
            Json::parse(R"([{"type": "function", "name": "f", "description": null,
                             "parameters": {}, "strict": true}])"));
}

// text.format is the chat endpoint's response_format, field for field, so
// whatever the chat path does with a constraint, /v1/responses does too.
TEST(ResponsesToChat, TextFormatIsTheChatResponseFormat) {
  const Json schema = Json::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  Json body = {{"input", "x"},
               {"text",
                {{"format",
                  {{"type", "json_schema"},
                   {"name", "thing"},
                   {"description", "a thing"},
                   {"schema", schema},
                   {"strict", true}}}}}};
  Json chat = ChatBody(body.dump());
  const Json expected = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "thing"}, {"description", "a thing"}, {"schema", schema}, {"strict", true}}}};
  EXPECT_EQ(chat["response_format"], expected);
  EXPECT_EQ(
      ChatBody(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")["response_format"],
      Json::parse(R"({"type": "json_object"})"));
  EXPECT_EQ(ChatBody(R"({"input": "x", "text": {"format": {"type": "text"}}})")["response_format"],
            Json::parse(R"({"type": "text"})"));

  // The same verdict as the chat parser on the same response_format:
  // accepted or refused alike (the refusal names the Responses field).
  for (const Json& rf :
       {expected, Json::parse(R"({"type": "json_object"})"), Json::parse(R"({"type": "text"})")}) {
    Json chat_body = {{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})},
                      {"response_format", rf}};
    Json format = rf["type"] == "json_schema" ? Json(body["text"]["format"]) : rf;
    Json responses_body = {{"input", "x"}, {"text", {{"format", format}}}};
    auto via_chat = ParseChatCompletionRequest(chat_body.dump());
    auto via_responses = ParseResponsesRequest(responses_body.dump());
    ASSERT_EQ(via_chat.ok(), via_responses.ok()) << rf.dump();
    if (!via_chat.ok()) {
      EXPECT_EQ(via_responses.error().http_status, via_chat.error().http_status);
      std::string param = via_chat.error().param;
      EXPECT_THAT(param, ::testing::StartsWith("response_format"));
      EXPECT_THAT(via_responses.error().param, ::testing::StartsWith("text.format"));
    }
  }
}

TEST(ResponsesToChat, ReasoningEffortAndLogprobs) {
  Json chat = ChatBody(R"({"input": "x", "reasoning": {"effort": "low"},
                            "include": ["message.output_text.logprobs"], "top_logprobs": 3})");
  EXPECT_EQ(chat["reasoning_effort"], "low");
  EXPECT_EQ(chat["logprobs"], true);
  EXPECT_EQ(chat["top_logprobs"], 3);
  auto r = ParseResponsesRequest(R"({"input": "x", "top_logprobs": 2})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().chat.sampling.logprobs, 2);
  EXPECT_FALSE(ChatBody(R"({"input": "x"})").contains("logprobs"));
}

TEST(ResponsesToChat, VllmSamplingFieldsPassThrough) {
  auto r = ParseResponsesRequest(
      R"({"input": "x", "top_k": 5, "seed": 7, "stop": ["z"], "repetition_penalty": 1.1,
          "unknown_thing": 1})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().chat.sampling.top_k, 5);
  EXPECT_EQ(r.value().chat.sampling.seed, 7u);
  EXPECT_EQ(r.value().chat.stop, std::vector<std::string>{"z"});
  EXPECT_EQ(r.value().ignored_fields, std::vector<std::string>{"unknown_thing"});
}

TEST(ResponsesErrors, NameTheResponsesField) {
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {R"({})", "input", "input is required"},
      {R"({"input": []})", "input", "must not be empty"},
      {R"({"input": 5})", "input", "a string or an array"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens", "max_output_tokens must"},
      {R"({"input": "x", "max_output_tokens": "5"})", "max_output_tokens", "max_output_tokens"},
      {R"({"input": "x", "temperature": 3})", "temperature", "[0, 2]"},
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id",
       "keeps no responses"},
      {R"({"input": "x", "conversation": "c"})", "conversation", "previous_response_id"},
      {R"({"input": "x", "background": true})", "background", "not supported"},
      {R"({"input": [{"type": "item_reference"}]})", "input[0].id", "required"},
      {R"({"input": "x", "prompt": {"id": "p"}})", "prompt", "stored prompt"},
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type", "built-in"},
      {R"({"input": "x", "tools": [{"type": "function"}]})", "tools[0].name", "required"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 1}]})",
       "tools[0].parameters", "an object"},
      {R"({"input": "x", "tool_choice": {"type": "web_search_preview"}})", "tool_choice",
       "built-in"},
      {R"({"input": "x", "truncation": "auto"})", "truncation", "disabled"},
      {R"({"input": "x", "max_tool_calls": 2})", "max_tool_calls", "parallel_tool_calls"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})",
       "input[0].content[0].type", "only text"},
      {R"({"input": [{"role": "robot", "content": "x"}]})", "input[0].role", "one of"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]})",
       "input[0].arguments", "JSON"},
      {R"({"input": [{"type": "function_call_output", "output": "o"}]})", "input[0].call_id",
       "required"},
      {R"({"input": [{"type": "computer_call_output", "call_id": "c"}]})", "input[0].type",
       "not supported"},
      {R"({"input": "x", "text": {"format": {"type": "xml"}}})", "text.format.type", "xml"},
      {R"({"input": "x", "reasoning": {"effort": "max"}})", "reasoning.effort", "reasoning.effort"},
      {R"({"input": "x", "top_logprobs": 99})", "top_logprobs", "top_logprobs"},
      {R"([1])", "", "JSON object"},
  };
  for (const Case& c : cases) {
    ApiError e = ErrorOf(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
  }
}

// store: OpenAI's default is true; the response says whether it is kept
// (not without a store, nor when asked false).
TEST(ResponsesRequest, StoreIsTrueByDefaultWhenTheServerKeepsOne) {
  ResponseStore store({});
  for (auto [body, st, expected] : {std::tuple{R"({"input": "x"})", &store, true},
                                    std::tuple{R"({"input": "x", "store": false})", &store, false},
                                    std::tuple{R"({"input": "x", "store": true})",
                                               static_cast<ResponseStore*>(nullptr), false}}) {
    auto r = ParseResponsesRequest(body, {}, st);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value().store, expected) << body;
    EXPECT_EQ(r.value().context.echo["store"], expected) << body;
  }
  ResponseStore off({.max_items = 0});
  auto r = ParseResponsesRequest(R"({"input": "x"})", {}, &off);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value().store);
}

// previous_response_id prepends the stored conversation (input then output
// items; not its instructions); item_reference is replaced by the stored
// item; both give the same messages as the conversation sent whole.
TEST(ResponsesRequest, StoredReferencesResolveToTheConversation) {
  ResponseStore store({});
  const Json output = Json::parse(R"([{"id": "rs_1", "type": "reasoning", "summary": [],
      "content": [{"type": "reasoning_text", "text": "think"}]},
      {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f",
       "arguments": "{}", "status": "completed"}])");
  store.Put("resp_1", Json{{"id", "resp_1"}, {"instructions", "be brief"}, {"output", output}},
            Json::parse(R"([{"type": "message", "role": "user",
                             "content": [{"type": "input_text", "text": "hi"}]}])"));
  const std::string tail =
      R"({"type": "function_call_output", "call_id": "call_1", "output": "42"})";
  auto whole = ParseResponsesRequest(R"({"input": [{"role": "user", "content": "hi"},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}, )" +
                                         tail + "]}",
                                     {}, &store);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  auto prev = ParseResponsesRequest(
      R"({"previous_response_id": "resp_1", "input": [)" + tail + "]}", {}, &store);
  ASSERT_TRUE(prev.ok()) << prev.error().message;
  auto refs = ParseResponsesRequest(R"({"input": [{"role": "user", "content": "hi"},
      {"type": "item_reference", "id": "rs_1"}, {"id": "fc_1"}, )" +
                                        tail + "]}",
                                    {}, &store);
  ASSERT_TRUE(refs.ok()) << refs.error().message;
  EXPECT_EQ(prev.value().chat.messages, whole.value().chat.messages);
  EXPECT_EQ(refs.value().chat.messages, whole.value().chat.messages);
  EXPECT_EQ(prev.value().context.echo["previous_response_id"], "resp_1");
  EXPECT_EQ(whole.value().context.echo["previous_response_id"], nullptr);
  // What the store keeps for the new response: the whole conversation,
  // references resolved.
  ASSERT_EQ(prev.value().input_items.size(), 4u);
  EXPECT_EQ(prev.value().input_items[1], output[0]);
  EXPECT_EQ(refs.value().input_items[2], output[1]);
  for (size_t i = 1; i < 3; ++i)
    EXPECT_EQ(refs.value().input_items[i], prev.value().input_items[i]);
  // Own items get ids (OpenAI's kept items all have one).
  EXPECT_TRUE(prev.value().input_items[3]["id"].get<std::string>().starts_with("fco_"));
  EXPECT_TRUE(refs.value().input_items[0]["id"].get<std::string>().starts_with("msg_"));

  // Unknown ids say so, as OpenAI's errors: 400 for the previous response, 404
  // for an item, each naming the field and that this server does not have it.
  auto e1 =
      ParseResponsesRequest(R"({"previous_response_id": "resp_2", "input": "x"})", {}, &store);
  ASSERT_FALSE(e1.ok());
  EXPECT_EQ(e1.error().http_status, 400);
  EXPECT_EQ(e1.error().param, "previous_response_id");
  EXPECT_EQ(e1.error().code, "previous_response_not_found");
  EXPECT_THAT(e1.error().message, HasSubstr("resp_2"));
  EXPECT_THAT(e1.error().message, HasSubstr("another replica"));
  auto e2 = ParseResponsesRequest(
      R"({"input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_9"}]})",
      {}, &store);
  ASSERT_FALSE(e2.ok());
  EXPECT_EQ(e2.error().http_status, 404);
  EXPECT_EQ(e2.error().param, "input[1]");
  EXPECT_THAT(e2.error().message, HasSubstr("msg_9"));
  EXPECT_THAT(e2.error().message, HasSubstr("evicted"));
}

// Every field this endpoint knows has its type checked.
TEST(ResponsesRequest, EveryKnownFieldRejectsAWrongType) {
  const std::vector<std::pair<std::string, std::string>> wrong = {
      {"model", "5"},
      {"input", "5"},
      {"instructions", "5"},
      {"max_output_tokens", R"("5")"},
      {"temperature", R"("hot")"},
      {"top_p", R"("1")"},
      {"tools", "{}"},
      {"tool_choice", "5"},
      {"parallel_tool_calls", R"("yes")"},
      {"text", "5"},
      {"reasoning", "5"},
      {"stream", R"("yes")"},
      {"stream_options", "5"},
      {"store", R"("yes")"},
      {"metadata", "5"},
      {"user", "5"},
      {"include", "5"},
      {"top_logprobs", R"("3")"},
      {"truncation", "5"},
      {"service_tier", "5"},
      {"previous_response_id", "5"},
      {"conversation", "5"},
      {"background", R"("yes")"},
      {"prompt", "5"},
      {"max_tool_calls", R"("5")"},
      {"context_management", "5"},
      {"safety_identifier", "5"},
      {"prompt_cache_key", "5"},
      {"prompt_cache_retention", "5"},
      {"top_k", R"("5")"},
      {"min_p", R"("5")"},
      {"repetition_penalty", R"("5")"},
      {"frequency_penalty", R"("5")"},
      {"presence_penalty", R"("5")"},
      {"seed", R"("5")"},
      {"stop", "5"},
      {"stop_token_ids", "5"},
      {"ignore_eos", "5"},
      {"skip_special_tokens", "5"},
      {"include_stop_str_in_output", "5"},
      {"chat_template_kwargs", "5"},
      {"request_id", "5"},
      {"priority", R"("5")"},
      {"logit_bias", "5"},
      {"min_tokens", R"("5")"},
      {"structured_outputs", "5"},
      {"guided_json", "5"},
      {"guided_regex", "5"},
      {"guided_choice", "5"},
      {"guided_grammar", "5"},
      {"cache_salt", "5"},
      {"bad_words", "5"},
      {"allowed_token_ids", "5"},
      {"include_reasoning", "5"},
  };
  std::vector<std::string> covered;
  for (const auto& [field, value] : wrong) {
    Json body = {{"input", "x"}};
    body[field] = Json::parse(value);
    auto r = ParseResponsesRequest(body.dump());
    EXPECT_FALSE(r.ok()) << field << " = " << value;
    if (!r.ok()) {
      EXPECT_THAT(r.error().param, ::testing::StartsWith(field)) << r.error().message;
    }
    covered.push_back(field);
  }
  std::sort(covered.begin(), covered.end());
  EXPECT_EQ(covered, KnownResponsesFields());
}

// ---------------------------------------------------------------------------
// Output

ResponsesContext Context() {
  auto r = ParseResponsesRequest(R"({"input": "x", "instructions": "i", "max_output_tokens": 5})");
  EXPECT_TRUE(r.ok());
  ResponsesContext c = r.value().context;
  c.meta = ResponseMeta{"resp_abc", 1700000000, "m"};
  return c;
}

TEST(ResponseObject, TextAnswer) {
  ChoiceOutput out;
  out.text = "hello";
  out.finish_reason = FinishReason::kStop;
  Usage usage{10, 3, 4};
  Json r = ResponseObjectJson(Context(), out, usage);
  EXPECT_EQ(r["id"], "resp_abc");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 1700000000);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["model"], "m");
  EXPECT_EQ(r["instructions"], "i");
  EXPECT_EQ(r["max_output_tokens"], 5);
  EXPECT_EQ(r["store"], false);
  EXPECT_TRUE(r["incomplete_details"].is_null());
  ASSERT_EQ(r["output"].size(), 1u);
  const Json& msg = r["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["status"], "completed");
  EXPECT_THAT(msg["id"].get<std::string>(), ::testing::StartsWith("msg_"));
  EXPECT_EQ(msg["content"], Json::parse(R"([{"type": "output_text", "text": "hello",
                                            "annotations": [], "logprobs": []}])"));
  EXPECT_EQ(r["usage"], Json::parse(R"({"input_tokens": 10,
      "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3,
      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13})"));
}

TEST(ResponseObject, CutByMaxOutputTokensIsIncomplete) {
  ChoiceOutput out;
  out.text = "hel";
  out.finish_reason = FinishReason::kLength;
  Json r = ResponseObjectJson(Context(), out, Usage{});
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], Json::parse(R"({"reason": "max_output_tokens"})"));
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
}

TEST(ResponseObject, ReasoningAndCallsAreItems) {
  ChoiceOutput out;
  out.reasoning_content = "hmm";
  out.tool_calls = {{"call_1", "f", R"({"a":1})"}, {"call_2", "g", "{}"}};
  out.finish_reason = FinishReason::kStop;
  Json r = ResponseObjectJson(Context(), out, Usage{});
  ASSERT_EQ(r["output"].size(), 3u) << r["output"].dump();  // no empty message with calls only
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"],
            Json::parse(R"([{"type": "reasoning_text", "text": "hmm"}])"));
  EXPECT_EQ(r["output"][0]["summary"], Json::array());
  const Json& call = r["output"][1];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["call_id"], "call_1");
  EXPECT_EQ(call["name"], "f");
  EXPECT_EQ(call["arguments"], R"({"a":1})");
  EXPECT_EQ(call["status"], "completed");
  EXPECT_THAT(call["id"].get<std::string>(), ::testing::StartsWith("fc_"));
  EXPECT_EQ(r["output"][2]["call_id"], "call_2");
  EXPECT_EQ(r["status"], "completed");
}

// "event: <type>\ndata: <json>\n\n" events, parsed; checks the framing.
std::vector<Json> Parse(const std::string& sse) {
  std::vector<Json> out;
  size_t at = 0;
  while (at < sse.size()) {
    size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    std::string ev = sse.substr(at, end - at);
    at = end + 2;
    EXPECT_TRUE(ev.starts_with("event: ")) << ev;
    size_t nl = ev.find('\n');
    std::string type = ev.substr(7, nl - 7);
    EXPECT_TRUE(ev.compare(nl + 1, 6, "data: ") == 0) << ev;
    Json j = Json::parse(ev.substr(nl + 7));
    EXPECT_EQ(j["type"], type);
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<std::string> Types(const std::vector<Json>& events) {
  std::vector<std::string> t;
  for (const Json& e : events) t.push_back(e["type"]);
  return t;
}

TEST(ResponsesStream, TextEventsInOrderWithSequenceNumbers) {
  ResponsesStreamEncoder enc(Context());
  std::string sse = enc.Start();
  StreamDelta d;
  d.text = "Hel";
  sse += enc.Delta(d);
  d.text = "lo";
  d.finish_reason = FinishReason::kStop;
  sse += enc.Delta(d);
  sse += enc.Finish(Usage{2, 2, 0});
  std::vector<Json> ev = Parse(sse);
  EXPECT_EQ(Types(ev),
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.delta", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i]["sequence_number"], i);
  EXPECT_EQ(ev[0]["response"]["status"], "in_progress");
  EXPECT_EQ(ev[0]["response"]["output"], Json::array());
  const std::string id = ev[2]["item"]["id"];
  for (size_t i = 3; i < 8; ++i) EXPECT_EQ(ev[i]["item_id"], id) << i;
  EXPECT_EQ(ev[4]["delta"], "Hel");
  EXPECT_EQ(ev[6]["text"], "Hello");
  EXPECT_EQ(ev[8]["item"]["content"][0]["text"], "Hello");
  EXPECT_EQ(ev[8]["item"]["status"], "completed");
  const Json& done = ev[9]["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["output"][0], ev[8]["item"]);
  EXPECT_EQ(done["usage"]["total_tokens"], 4);
}

TEST(ResponsesStream, ReasoningTextThenCallThenIncomplete) {
  ResponsesStreamEncoder enc(Context());
  std::string sse = enc.Start();
  StreamDelta d;
  d.reasoning_content = "think";
  sse += enc.Delta(d);
  d = {};
  d.text = "ok";
  sse += enc.Delta(d);
  d = {};
  d.tool_calls = {{ToolCallEvent::Kind::kStart, 0, "call_1", "f", ""},
                  {ToolCallEvent::Kind::kArguments, 0, "", "", R"({"a":1})"},
                  {ToolCallEvent::Kind::kEnd, 0, "", "", ""}};
  d.finish_reason = FinishReason::kStop;
  d.made_tool_calls = true;
  sse += enc.Delta(d);
  sse += enc.Finish(Usage{});
  std::vector<Json> ev = Parse(sse);
  EXPECT_EQ(Types(ev), (std::vector<std::string>{
                           "response.created", "response.in_progress",
                           // reasoning item
                           "response.output_item.added", "response.content_part.added",
                           "response.reasoning_text.delta", "response.reasoning_text.done",
                           "response.content_part.done", "response.output_item.done",
                           // message item
                           "response.output_item.added", "response.content_part.added",
                           "response.output_text.delta", "response.output_text.done",
                           "response.content_part.done", "response.output_item.done",
                           // the call
                           "response.output_item.added", "response.function_call_arguments.delta",
                           "response.function_call_arguments.done", "response.output_item.done",
                           "response.completed"}));
  EXPECT_EQ(ev[2]["item"]["type"], "reasoning");
  EXPECT_EQ(ev[5]["text"], "think");
  EXPECT_EQ(ev[8]["output_index"], 1);
  EXPECT_EQ(ev[14]["output_index"], 2);
  EXPECT_EQ(ev[14]["item"]["arguments"], "");
  EXPECT_EQ(ev[14]["item"]["call_id"], "call_1");
  EXPECT_EQ(ev[16]["arguments"], R"({"a":1})");
  EXPECT_EQ(ev[16]["name"], "f");
  EXPECT_EQ(ev[17]["item"]["arguments"], R"({"a":1})");
  const Json& r = ev[18]["response"];
  ASSERT_EQ(r["output"].size(), 3u);
  EXPECT_EQ(r["output"][2]["type"], "function_call");
  EXPECT_EQ(r["output"][2]["status"], "completed");

  ResponsesStreamEncoder cut(Context());
  d = {};
  d.text = "ab";
  d.finish_reason = FinishReason::kLength;
  std::string sse2 = cut.Start();  // (one call per statement: + leaves the order open)
  sse2 += cut.Delta(d);
  sse2 += cut.Finish(Usage{});
  std::vector<Json> ev2 = Parse(sse2);
  EXPECT_EQ(ev2.back()["type"], "response.incomplete");
  EXPECT_EQ(ev2.back()["response"]["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(ev2.back()["response"]["output"][0]["status"], "incomplete");
}

TEST(ResponsesStream, EmptyOutputStillHasAMessageAndErrorsEndWithFailed) {
  ResponsesStreamEncoder enc(Context());
  StreamDelta d;
  d.finish_reason = FinishReason::kStop;
  std::string sse = enc.Start();
  sse += enc.Delta(d);
  sse += enc.Finish(Usage{});
  std::vector<Json> ev = Parse(sse);
  EXPECT_EQ(ev.back()["response"]["output"].size(), 1u);
  EXPECT_EQ(ev.back()["response"]["output"][0]["content"][0]["text"], "");

  ResponsesStreamEncoder failing(Context());
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.code = "request_aborted";
  e.message = "gone";
  d = {};
  d.text = "a";
  std::string sse2 = failing.Start();
  sse2 += failing.Delta(d);
  sse2 += failing.Error(e, Usage{});
  std::vector<Json> ev2 = Parse(sse2);
  ASSERT_GE(ev2.size(), 2u);
  EXPECT_EQ(ev2[ev2.size() - 2]["type"], "error");
  EXPECT_EQ(ev2[ev2.size() - 2]["code"], "request_aborted");
  EXPECT_EQ(ev2.back()["type"], "response.failed");
  EXPECT_EQ(ev2.back()["response"]["status"], "failed");
  EXPECT_EQ(ev2.back()["response"]["error"]["message"], "gone");
  for (size_t i = 0; i < ev2.size(); ++i) EXPECT_EQ(ev2[i]["sequence_number"], i);
}

TEST(ResponsesIds, StoredIdsNameTheirServerAndOthersNameNone) {
  const std::string inst = "0123456789abcdef";
  const std::string id = NewStoredResponseId(inst);
  EXPECT_EQ(id.substr(0, 22), "resp_" + inst + "_");
  EXPECT_EQ(id.size(), 54u);
  EXPECT_EQ(ResponseIdInstance(id), inst);
  EXPECT_NE(NewStoredResponseId(inst), id);
  // Ids of the plain form, a client's request_id, damaged ones: no server.
  EXPECT_EQ(ResponseIdInstance(NewResponsesId("resp_")), "");
  EXPECT_EQ(ResponseIdInstance("resp_my-request-7"), "");
  EXPECT_EQ(ResponseIdInstance(id.substr(0, 53)), "");
  std::string bad = id;
  bad[7] = 'X';
  EXPECT_EQ(ResponseIdInstance(bad), "");
  EXPECT_EQ(ResponseIdInstance("msg_" + id.substr(5)), "");
  // An instance id that is not 16 hex digits gives the plain form.
  EXPECT_EQ(ResponseIdInstance(NewStoredResponseId("")), "");
  EXPECT_EQ(NewStoredResponseId("").size(), 37u);
}

}  // namespace
}  // namespace strata
