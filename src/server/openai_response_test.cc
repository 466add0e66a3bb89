#include "server/openai_response.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/stop_matcher.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

const ResponseMeta kMeta{"cmpl-abc", 1700000000, "m"};
const ResponseMeta kChatMeta{"chatcmpl-abc", 1700000000, "m"};

std::shared_ptr<const Tokenizer> Tok() {
  static std::shared_ptr<const Tokenizer> tok = [] {
    auto t = Tokenizer::FromDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen2");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : nullptr;
  }();
  return tok;
}

LogprobOptions IdsLogprobs(int top) {
  LogprobOptions o;
  o.enabled = true;
  o.top = top;
  o.tokens_as_ids = true;
  return o;
}

GeneratedToken Token(int32_t id, float lp, std::vector<TokenLogprob> top = {}) {
  return {id, lp, std::move(top)};
}

// Splits an SSE byte stream into its JSON payloads ("[DONE]" kept as text).
std::vector<std::string> Events(const std::string& sse) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    EXPECT_EQ(sse.compare(pos, 6, "data: "), 0) << sse.substr(pos);
    size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    out.push_back(sse.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

TEST(CompletionResponse, GoldenShape) {
  ChoiceOutput c;
  c.index = 0;
  c.text = "Hello";
  c.finish_reason = FinishReason::kLength;
  Usage u{5, 3, std::nullopt};
  EXPECT_EQ(
      DumpJson(CompletionResponseJson(kMeta, {c}, u, LogprobOptions{})),
      R"({"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"m",)"
      R"("choices":[{"index":0,"text":"Hello","logprobs":null,"finish_reason":"length","stop_reason":null,)"
      R"("token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null}],)"
      R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}})")
      << "vLLM's choice fields: prompt_logprobs null, not absent (vLLM clients read it)";
}

TEST(CompletionResponse, StopReasonsAndCachedTokens) {
  ChoiceOutput a, b, c;
  a.index = 0;
  a.stop_reason = std::string("\n\n");
  b.index = 1;
  b.stop_reason = int32_t{7};
  c.index = 2;
  c.finish_reason = FinishReason::kAbort;
  Json j = CompletionResponseJson(kMeta, {a, b, c}, Usage{4, 2, 3}, LogprobOptions{});
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], "\n\n");
  EXPECT_EQ(j["choices"][1]["stop_reason"], 7);
  EXPECT_EQ(j["choices"][2]["finish_reason"], "abort");
  EXPECT_EQ(
      j["usage"].dump(),
      R"({"prompt_tokens":4,"completion_tokens":2,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":3}})");
}

TEST(CompletionResponse, LogprobsGolden) {
  ChoiceOutput c;
  c.text = "ab";
  c.tokens = {Token(10, -0.5f, {{10, -0.5f}, {11, -1.25f}}),
              Token(12, -2.f, {{13, -0.25f}, {12, -2.f}})};
  Json j = CompletionResponseJson(kMeta, {c}, Usage{}, IdsLogprobs(1));
  // The sampled token first, then the top 1 (a token in both appears once).
  EXPECT_EQ(
      j["choices"][0]["logprobs"].dump(),
      R"({"text_offset":[0,11],"token_logprobs":[-0.5,-2.0],"tokens":["token_id:10","token_id:12"],)"
      R"("top_logprobs":[{"token_id:10":-0.5},{"token_id:12":-2.0,"token_id:13":-0.25}]})");
}

TEST(CompletionResponse, LogprobsZeroTopIsTheSampledTokenAndInfinityIsClamped) {
  GeneratedToken t = Token(3, -std::numeric_limits<float>::infinity(), {{1, -0.1f}});
  Json lp = CompletionLogprobsJson(std::span(&t, 1), IdsLogprobs(0), 0);
  EXPECT_EQ(lp["token_logprobs"].dump(), "[-9999.0]");
  EXPECT_EQ(lp["top_logprobs"].dump(), R"([{"token_id:3":-9999.0}])");
  t.logprob = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(CompletionLogprobsJson(std::span(&t, 1), IdsLogprobs(0), 0)["token_logprobs"].dump(),
            "[-9999.0]");
}

TEST(CompletionResponse, EchoOffsetsStartAfterThePromptInCodePoints) {
  ChoiceOutput c;
  c.text =
      "héllo"
      "ab";
  c.echo_offset = CodePointCount("héllo");
  c.tokens = {Token(1, -1.f), Token(2, -1.f)};
  Json j = CompletionResponseJson(kMeta, {c}, Usage{}, IdsLogprobs(0));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"].dump(), "[5,15]")
      << "5 code points, then len(\"token_id:1\")";
}

TEST(CompletionResponse, EchoedPromptTokensStartWithANullLogprob) {
  ChoiceOutput c;
  c.text = "ab";
  c.tokens = {Token(1, 0.f), Token(2, -1.f, {{3, -0.5f}})};
  c.leading_null_logprobs = 1;
  Json j = CompletionResponseJson(kMeta, {c}, Usage{}, IdsLogprobs(1));
  EXPECT_EQ(
      j["choices"][0]["logprobs"].dump(),
      R"({"text_offset":[0,10],"token_logprobs":[null,-1.0],"tokens":["token_id:1","token_id:2"],)"
      R"("top_logprobs":[null,{"token_id:2":-1.0,"token_id:3":-0.5}]})");
}

TEST(CompletionResponse, TokenTextsComeFromTheTokenizer) {
  auto tok = Tok();
  ASSERT_TRUE(tok);
  std::vector<int32_t> ids = tok->Encode("Hello world", /*add_special_tokens=*/false);
  ASSERT_GE(ids.size(), 2u);
  LogprobOptions o;
  o.enabled = true;
  o.top = 1;
  o.tokenizer = tok.get();
  std::vector<GeneratedToken> tokens;
  std::string joined;
  for (int32_t id : ids) {
    tokens.push_back(Token(id, -1.f, {{3, -2.f}}));
    joined += tok->Decode({id});
  }
  ASSERT_EQ(joined, "Hello world");
  Json lp = CompletionLogprobsJson(tokens, o, 0);
  std::string from_tokens;
  for (const Json& t : lp["tokens"]) from_tokens += t.get<std::string>();
  EXPECT_EQ(from_tokens, "Hello world");
  EXPECT_EQ(lp["text_offset"].back(), 11 - static_cast<int64_t>(tok->Decode({ids.back()}).size()));
  EXPECT_TRUE(lp["top_logprobs"][0].contains("<|im_end|>")) << "special tokens are spelled out";
  EXPECT_EQ(TokenText(ids[0], o), tok->Decode({ids[0]}));
  o.tokens_as_ids = true;
  EXPECT_EQ(TokenText(ids[0], o), "token_id:" + std::to_string(ids[0]));
}

TEST(ChatResponse, GoldenShape) {
  ChoiceOutput c;
  c.text = "Hi there";
  c.stop_reason = int32_t{3};
  EXPECT_EQ(
      DumpJson(
          ChatCompletionResponseJson(kChatMeta, {c}, Usage{9, 2, std::nullopt}, LogprobOptions{})),
      R"({"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,"model":"m",)"
      R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hi there","refusal":null},)"
      R"("logprobs":null,"finish_reason":"stop","stop_reason":3,"token_ids":null}],)"
      R"("usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11},)"
      R"("prompt_logprobs":null,"prompt_token_ids":null})")
      << "vLLM's response fields: prompt_logprobs null, not absent";
}

TEST(Responses, ReturnTokenIdsCarriesPromptAndOutputIds) {
  ChoiceOutput a, b;
  a.index = 0, b.index = 1;
  a.prompt_token_ids = std::vector<int32_t>{1, 2};
  a.token_ids = std::vector<int32_t>{7, 8, 9};
  b.prompt_token_ids = std::vector<int32_t>{3};
  b.token_ids = std::vector<int32_t>{};
  Json c = CompletionResponseJson(kMeta, {a, b}, Usage{}, LogprobOptions{});
  EXPECT_EQ(c["choices"][0]["prompt_token_ids"].dump(), "[1,2]");
  EXPECT_EQ(c["choices"][0]["token_ids"].dump(), "[7,8,9]");
  EXPECT_EQ(c["choices"][1]["prompt_token_ids"].dump(), "[3]")
      << "completions: each choice its own prompt";
  EXPECT_EQ(c["choices"][1]["token_ids"].dump(), "[]");
  Json chat = ChatCompletionResponseJson(kChatMeta, {a}, Usage{}, LogprobOptions{});
  EXPECT_EQ(chat["prompt_token_ids"].dump(), "[1,2]") << "chat: once, at the top level (vLLM)";
  EXPECT_EQ(chat["choices"][0]["token_ids"].dump(), "[7,8,9]");
  EXPECT_FALSE(chat["choices"][0].contains("prompt_token_ids"));
}

TEST(ChatResponse, ReasoningContentAndRole) {
  ChoiceOutput c;
  c.text = "42";
  c.reasoning_content = "let me think";
  Json j = ChatCompletionResponseJson(kChatMeta, {c}, Usage{}, LogprobOptions{}, "user");
  EXPECT_EQ(j["choices"][0]["message"].dump(),
            R"({"role":"user","content":"42","refusal":null,"reasoning_content":"let me think"})");
}

TEST(ChatResponse, LogprobsGolden) {
  ChoiceOutput c;
  c.text = "x";
  c.tokens = {Token(7, -0.5f, {{7, -0.5f}, {8, -1.f}, {9, -3.f}})};
  Json j = ChatCompletionResponseJson(kChatMeta, {c}, Usage{}, IdsLogprobs(2));
  EXPECT_EQ(
      j["choices"][0]["logprobs"].dump(),
      R"({"content":[{"token":"token_id:7","logprob":-0.5,"bytes":[116,111,107,101,110,95,105,100,58,55],)"
      R"("top_logprobs":[{"token":"token_id:7","logprob":-0.5,"bytes":[116,111,107,101,110,95,105,100,58,55]},)"
      R"({"token":"token_id:8","logprob":-1.0,"bytes":[116,111,107,101,110,95,105,100,58,56]}]}]})");
  Json none = ChatLogprobsJson(c.tokens, IdsLogprobs(0));
  EXPECT_EQ(none["content"][0]["top_logprobs"].dump(), "[]");
}

// OpenAI's "bytes" join back into the text even where a character is split
// over tokens (issue 6 item 11(c): each split token sent the bytes of U+FFFD).
TEST(ChatResponse, BytesOfSplitCharactersJoinIntoTheText) {
  auto tok = Tok();
  ASSERT_TRUE(tok);
  const std::string text = "café 😀 中文 ok";
  std::vector<int32_t> ids = tok->Encode(text, false);
  LogprobOptions o;
  o.enabled = true;
  o.top = 2;
  o.tokenizer = tok.get();
  std::vector<GeneratedToken> tokens;
  size_t split = 0;  // tokens that end or start inside a character
  for (size_t i = 0; i < ids.size(); ++i) {
    // The top alternatives: the token itself and the next one.
    tokens.push_back(Token(ids[i], -1.f, {{ids[i], -1.f}, {ids[(i + 1) % ids.size()], -2.f}}));
    split += TokenText(ids[i], o).find("\xEF\xBF\xBD") != std::string::npos;
  }
  ASSERT_GT(split, 0u)
      << "the fixture tokenizer must split a character for this test to mean anything";
  Json lp = ChatLogprobsJson(tokens, o);
  std::string joined, joined_top, joined_next;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Json& e = lp["content"][i];
    for (int b : e["bytes"]) joined += static_cast<char>(b);
    for (int b : e["top_logprobs"][0]["bytes"]) joined_top += static_cast<char>(b);
    if (i + 1 < ids.size()) {
      for (int b : e["top_logprobs"][1]["bytes"]) joined_next += static_cast<char>(b);
    }
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(joined_top, text) << "top_logprobs entries carry their token's own bytes too";
  EXPECT_EQ(joined_next, text.substr(tok->TokenBytes(ids[0]).size()));
  EXPECT_THAT(DumpJson(lp), HasSubstr("\"bytes\":["))
      << "serialises even with partial UTF-8 tokens";
  EXPECT_EQ(lp["content"][0]["token"], TokenText(ids[0], o))
      << "the token string stays as vLLM renders it";
}

TEST(ErrorBody, GoldenShape) {
  EXPECT_EQ(
      DumpJson(
          ErrorJson(InvalidRequestError("temperature", "temperature must be in [0, 2], got 3.5"))),
      R"({"error":{"message":"temperature must be in [0, 2], got 3.5","type":"invalid_request_error",)"
      R"("param":"temperature","code":null}})");
  EXPECT_EQ(
      DumpJson(ErrorJson(OverloadedError("queue is full", "max_queued_requests"))),
      R"({"error":{"message":"queue is full","type":"overloaded","param":null,"code":"max_queued_requests"}})");
}

TEST(Sse, FramingAndInvalidUtf8) {
  EXPECT_EQ(SseEvent(Json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(DumpJson(Json("a\xff")), "\"a\xEF\xBF\xBD\"") << "replaced, not thrown";
  EXPECT_EQ(DumpJson(Json("é\n")), "\"é\\n\"") << "UTF-8 stays raw, as vLLM sends it";
}

TEST(ResponseMeta, FreshIdsAndTime) {
  ResponseMeta a = NewResponseMeta("chatcmpl-", "m");
  ResponseMeta b = NewResponseMeta("chatcmpl-", "m");
  EXPECT_EQ(a.id.size(), 9u + 32u);
  EXPECT_EQ(a.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(a.id, b.id);
  EXPECT_GT(a.created, 1700000000);
  EXPECT_EQ(a.model, "m");
}

TEST(ChatStream, GoldenEventSequence) {
  StreamSettings s;
  StreamEncoder enc(StreamEncoder::Kind::kChat, kChatMeta, s);
  auto delta = [](std::string text, int32_t id, FinishReason f) {
    StreamDelta d;
    d.text = std::move(text);
    d.tokens = {Token(id, 0)};
    d.finish_reason = f;
    return d;
  };
  std::string sse = enc.Start();
  sse += enc.Delta(delta("Hel", 1, FinishReason::kNone));
  sse += enc.Delta(delta("", 2, FinishReason::kNone));  // held back: no event
  sse += enc.Delta(delta("lo", 3, FinishReason::kStop));
  sse += enc.Finish(Usage{4, 3, std::nullopt});
  std::vector<std::string> ev = Events(sse);
  const std::string head =
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",)";
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(
      ev[0],
      head + R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,)"
             R"("finish_reason":null}]})");
  EXPECT_EQ(
      ev[1],
      head +
          R"("choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(
      ev[2],
      head +
          R"("choices":[{"index":0,"delta":{"content":"lo"},"logprobs":null,"finish_reason":"stop",)"
          R"("stop_reason":null}]})");
  EXPECT_EQ(ev[3], "[DONE]");
  EXPECT_EQ(enc.completion_tokens(0), 3);
}

TEST(ChatStream, IncludeUsageAddsNullUsageAndAFinalUsageChunk) {
  StreamSettings s;
  s.num_choices = 2;
  s.options.include_usage = true;
  StreamEncoder enc(StreamEncoder::Kind::kChat, kChatMeta, s);
  std::string sse = enc.Start();
  sse += enc.Delta({1, "x", std::nullopt, {Token(1, 0)}, FinishReason::kLength, {}});
  sse += enc.Finish(Usage{4, 1, 2});
  std::vector<std::string> ev = Events(sse);
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(Json::parse(ev[0])["choices"][0]["index"], 0);
  EXPECT_EQ(Json::parse(ev[1])["choices"][0]["index"], 1);
  EXPECT_TRUE(Json::parse(ev[2]).contains("usage"));
  EXPECT_TRUE(Json::parse(ev[2])["usage"].is_null());
  EXPECT_EQ(Json::parse(ev[2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(
      ev[3],
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",)"
      R"("choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5,)"
      R"("prompt_tokens_details":{"cached_tokens":2}}})");
  EXPECT_EQ(ev[4], "[DONE]");
}

TEST(ChatStream, ContinuousUsageAndLogprobsAndReasoning) {
  StreamSettings s;
  s.options.include_usage = true;
  s.options.continuous_usage_stats = true;
  s.logprobs = IdsLogprobs(0);
  s.prompt_tokens = 6;
  StreamEncoder enc(StreamEncoder::Kind::kChat, kChatMeta, s);
  enc.Start();
  // A held-back token still sends its logprobs (with empty content).
  Json a = Json::parse(
      Events(enc.Delta({0, "", std::nullopt, {Token(5, -0.5f)}, FinishReason::kNone, {}}))[0]);
  EXPECT_EQ(a["choices"][0]["delta"].dump(), R"({"content":""})");
  EXPECT_EQ(a["choices"][0]["logprobs"]["content"][0]["token"], "token_id:5");
  EXPECT_EQ(a["usage"].dump(), R"({"prompt_tokens":6,"completion_tokens":1,"total_tokens":7})");
  Json b = Json::parse(
      Events(enc.Delta({0, "", std::string("hmm"), {Token(6, -1.f)}, FinishReason::kNone, {}}))[0]);
  EXPECT_EQ(b["choices"][0]["delta"].dump(), R"({"reasoning_content":"hmm"})");
  EXPECT_EQ(b["usage"]["completion_tokens"], 2);
}

// vLLM sends continuous usage stats only with include_usage (issue 6 item
// 11(b): they went on every chunk without it).
TEST(Stream, ContinuousUsageStatsNeedIncludeUsage) {
  for (StreamEncoder::Kind kind : {StreamEncoder::Kind::kChat, StreamEncoder::Kind::kCompletion}) {
    StreamSettings s;
    s.options.continuous_usage_stats = true;
    s.prompt_tokens = 6;
    StreamEncoder enc(kind, kind == StreamEncoder::Kind::kChat ? kChatMeta : kMeta, s);
    std::string sse = enc.Start();
    sse += enc.Delta({0, "a", std::nullopt, {Token(1, 0)}, FinishReason::kNone, {}});
    sse += enc.Delta({0, "b", std::nullopt, {Token(2, 0)}, FinishReason::kStop, {}});
    sse += enc.Finish(Usage{6, 2, std::nullopt});
    std::vector<std::string> ev = Events(sse);
    ASSERT_EQ(ev.size(), kind == StreamEncoder::Kind::kChat ? 4u : 3u);
    for (const std::string& e : ev) {
      if (e == "[DONE]") continue;
      EXPECT_FALSE(Json::parse(e).contains("usage")) << e;
    }
  }
}

TEST(Stream, ReturnTokenIds) {
  StreamSettings s;
  s.num_choices = 2;
  s.return_token_ids = true;
  s.prompt_token_ids = {{1, 2}, {3}};
  StreamEncoder chat(StreamEncoder::Kind::kChat, kChatMeta, s);
  std::vector<std::string> ev = Events(chat.Start());
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(Json::parse(ev[0])["prompt_token_ids"].dump(), "[1,2]") << "chat: on the first chunk";
  EXPECT_FALSE(Json::parse(ev[1]).contains("prompt_token_ids"));
  // A token that produced no text yet still sends its id.
  Json held = Json::parse(
      Events(chat.Delta({0, "", std::nullopt, {Token(7, 0)}, FinishReason::kNone, {}}))[0]);
  EXPECT_EQ(held["choices"][0]["token_ids"].dump(), "[7]");
  EXPECT_FALSE(held.contains("prompt_token_ids"));

  StreamEncoder comp(StreamEncoder::Kind::kCompletion, kMeta, s);
  Json a0 = Json::parse(
      Events(comp.Delta({0, "x", std::nullopt, {Token(7, 0)}, FinishReason::kNone, {}}))[0]);
  Json b0 = Json::parse(Events(
      comp.Delta({1, "y", std::nullopt, {Token(8, 0), Token(9, 0)}, FinishReason::kNone, {}}))[0]);
  Json a1 = Json::parse(
      Events(comp.Delta({0, "z", std::nullopt, {Token(5, 0)}, FinishReason::kStop, {}}))[0]);
  EXPECT_EQ(a0["choices"][0]["prompt_token_ids"].dump(), "[1,2]")
      << "completions: each choice's first chunk";
  EXPECT_EQ(b0["choices"][0]["prompt_token_ids"].dump(), "[3]");
  EXPECT_EQ(b0["choices"][0]["token_ids"].dump(), "[8,9]");
  EXPECT_FALSE(a1["choices"][0].contains("prompt_token_ids"));
  EXPECT_EQ(a1["choices"][0]["token_ids"].dump(), "[5]");

  StreamEncoder plain(StreamEncoder::Kind::kCompletion, kMeta, StreamSettings{});
  EXPECT_FALSE(Json::parse(Events(
      plain.Delta({0, "x", std::nullopt, {Token(7, 0)}, FinishReason::kNone, {}}))[0])["choices"][0]
                   .contains("token_ids"));
}

TEST(CompletionStream, GoldenEventsWithOffsetsAcrossChunks) {
  StreamSettings s;
  s.num_choices = 1;
  s.logprobs = IdsLogprobs(0);
  StreamEncoder enc(StreamEncoder::Kind::kCompletion, kMeta, s);
  EXPECT_EQ(enc.Start(), "");
  std::string sse = enc.Delta({0,
                               "Pré"
                               "A",
                               std::nullopt,
                               {Token(1, -1.f)},
                               FinishReason::kNone,
                               {}});
  sse +=
      enc.Delta({0, "B", std::nullopt, {Token(2, -2.f)}, FinishReason::kStop, std::string("\n")});
  sse += enc.Finish(Usage{});
  std::vector<std::string> ev = Events(sse);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(
      ev[0],
      R"({"id":"cmpl-abc","object":"text_completion","created":1700000000,"model":"m","choices":[)"
      R"({"index":0,"text":"PréA","logprobs":{"text_offset":[0],"token_logprobs":[-1.0],)"
      R"("tokens":["token_id:1"],"top_logprobs":[{"token_id:1":-1.0}]},"finish_reason":null,)"
      R"("stop_reason":null}]})");
  Json second = Json::parse(ev[1]);
  EXPECT_EQ(second["choices"][0]["logprobs"]["text_offset"].dump(), "[4]")
      << "4 code points sent before";
  EXPECT_EQ(second["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(second["choices"][0]["stop_reason"], "\n");
  EXPECT_EQ(ev[2], "[DONE]");
}

TEST(Stream, MidStreamError) {
  EXPECT_EQ(StreamEncoder::Error(ApiErrorFromStatus(Internal("boom"))),
            "data: "
            "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"param\":null,\"code\":"
            "null}}\n\n");
}

// The pieces fit together: decoded pieces through a StopMatcher into a
// stream, whose content deltas concatenate to the text before the stop.
TEST(Stream, StopMatcherFeedsDeltas) {
  auto tok = Tok();
  ASSERT_TRUE(tok);
  std::vector<int32_t> ids = tok->Encode("one two three four", false);
  IncrementalDecoder dec(tok, /*skip_special_tokens=*/true);
  StopMatcher stop({" three"});
  StreamEncoder enc(StreamEncoder::Kind::kChat, kChatMeta, StreamSettings{});
  std::string sse = enc.Start();
  for (int32_t id : ids) {
    StopMatcher::Result r = stop.Add(dec.Add(id));
    StreamDelta d{0, r.text, std::nullopt, {Token(id, 0)}, FinishReason::kNone, {}};
    if (r.stop_index) {
      d.finish_reason = FinishReason::kStop;
      d.stop_reason = stop.matched();
    }
    sse += enc.Delta(d);
    if (r.stop_index) break;
  }
  sse += enc.Finish(Usage{});
  std::string content;
  std::string finish;
  for (const std::string& e : Events(sse)) {
    if (e == "[DONE]") continue;
    Json j = Json::parse(e);
    content += j["choices"][0]["delta"].value("content", "");
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
    if (j["choices"][0].contains("stop_reason")) {
      EXPECT_EQ(j["choices"][0]["stop_reason"], " three");
    }
  }
  EXPECT_EQ(content, "one two");
  EXPECT_EQ(finish, "stop");
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(ChatResponse, ToolCallsGolden) {
  ChoiceOutput c;
  c.finish_reason = FinishReason::kStop;
  c.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}, {"call_2", "get_time", "{}"}};
  Json j = ChatCompletionResponseJson(kChatMeta, {c}, Usage{3, 9, std::nullopt}, LogprobOptions{});
  EXPECT_EQ(
      j["choices"][0]["message"].dump(),
      R"({"role":"assistant","content":null,"refusal":null,"tool_calls":[)"
      R"({"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"},"index":0},)"
      R"({"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"},"index":1}]})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  c.text = "Checking.";
  c.finish_reason = FinishReason::kAbort;
  j = ChatCompletionResponseJson(kChatMeta, {c}, Usage{}, LogprobOptions{});
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Checking.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "abort") << "an aborted choice says so, calls or not";
}

TEST(ChatStream, ToolCallDeltasAreOpenAiShaped) {
  StreamSettings s;
  StreamEncoder enc(StreamEncoder::Kind::kChat, kChatMeta, s);
  StreamDelta d;
  d.text = "Checking.";
  d.tool_calls = {{ToolCallEvent::Kind::kStart, 0, "call_1", "f", ""},
                  {ToolCallEvent::Kind::kArguments, 0, "", "", R"({"a":1})"},
                  {ToolCallEvent::Kind::kEnd, 0, "", "", ""}};
  d.tokens = {Token(1, 0)};
  std::vector<std::string> ev = Events(enc.Delta(d));
  const std::string head =
      R"({"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"m",)";
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(
      ev[0],
      head +
          R"("choices":[{"index":0,"delta":{"content":"Checking."},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(
      ev[1],
      head +
          R"("choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",)"
          R"("function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(
      ev[2],
      head + R"("choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":)"
             R"("{\"a\":1}"}}]},"logprobs":null,"finish_reason":null}]})");
  StreamDelta fin;
  fin.finish_reason = FinishReason::kStop;
  fin.made_tool_calls = true;
  ev = Events(enc.Delta(fin));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(
      ev[0],
      head +
          R"("choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"tool_calls",)"
          R"("stop_reason":null}]})");
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(PromptLogprobsJson, VllmShapeOwnTokenFirstThenTop) {
  std::vector<PromptLogprob> lp = {
      {7, -1.5f, 3, {{9, -0.5f}, {8, -1.0f}}},    // the token ranks 3rd: both tops added
      {9, -0.25f, 1, {{9, -0.25f}, {2, -2.0f}}},  // the token is the top one: once
  };
  Json j = PromptLogprobsJson(lp, IdsLogprobs(2));
  EXPECT_EQ(j, Json::parse(R"([null,
      {"7": {"logprob": -1.5, "rank": 3, "decoded_token": "token_id:7"},
       "9": {"logprob": -0.5, "rank": 1, "decoded_token": "token_id:9"},
       "8": {"logprob": -1.0, "rank": 2, "decoded_token": "token_id:8"}},
      {"9": {"logprob": -0.25, "rank": 1, "decoded_token": "token_id:9"},
       "2": {"logprob": -2.0, "rank": 2, "decoded_token": "token_id:2"}}])"))
      << j.dump();
  ChoiceOutput c;
  c.prompt_logprobs = lp;
  EXPECT_EQ(
      CompletionResponseJson(kMeta, {c}, Usage{}, IdsLogprobs(0))["choices"][0]["prompt_logprobs"],
      j);
  EXPECT_EQ(ChatCompletionResponseJson(kChatMeta, {c}, Usage{}, IdsLogprobs(0))["prompt_logprobs"],
            j);
  ChoiceOutput none;
  EXPECT_TRUE(CompletionResponseJson(kMeta, {none}, Usage{},
                                     IdsLogprobs(0))["choices"][0]["prompt_logprobs"]
                  .is_null());
}

}  // namespace
}  // namespace strata
