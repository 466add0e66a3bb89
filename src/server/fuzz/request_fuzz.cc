// libFuzzer entry point for the OpenAI protocol layer: any bytes are fed to
// the three request parsers (completions, chat, responses), and what they
// accept drives the stop matcher and the response builders. Checks, besides "no crash, no
// exception, no sanitizer report":
//   - a rejected request is a 400 with a message (never a 500: that means an
//     exception escaped the field readers, i.e. a bug);
//   - an accepted request is within every documented range, and its
//     SamplingParams pass SamplingParams::Validate();
//   - the stop matcher emits exactly the text before the first stop string;
//   - every response and SSE event serialises and parses back.
//
// Built as a libFuzzer binary under clang (src/server/fuzz/request_fuzz.cmake)
// and, under any compiler, run over the seed corpus plus random mutations by
// request_fuzz_test.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/openai_protocol.h"
#include "server/openai_response.h"
#include "server/openai_responses.h"
#include "server/stop_matcher.h"

namespace strata {
namespace {

#define FUZZ_CHECK(cond)                                                                    \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "request_fuzz: check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                  \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

using Json = nlohmann::ordered_json;

void CheckError(const ApiError& e) {
  FUZZ_CHECK(e.http_status == 400);
  FUZZ_CHECK(e.type == "invalid_request_error");
  FUZZ_CHECK(!e.message.empty());
  std::string body = DumpJson(ErrorJson(e));
  FUZZ_CHECK(Json::accept(body));
}

void CheckCommon(const GenerationFields& r, const ProtocolLimits& limits) {
  FUZZ_CHECK(r.sampling.Validate().ok());
  FUZZ_CHECK(r.n >= 1 && r.n <= limits.max_n);
  FUZZ_CHECK(r.stop.size() <= limits.max_stop_strings);
  for (const std::string& s : r.stop)
    FUZZ_CHECK(!s.empty() && s.size() <= limits.max_stop_string_bytes);
  FUZZ_CHECK(r.stream || !r.stream_options.include_usage);
  FUZZ_CHECK(!r.max_tokens || (*r.max_tokens >= 0 && *r.max_tokens <= INT32_MAX));
  if (r.request_id) {
    FUZZ_CHECK(!r.request_id->empty() && r.request_id->size() <= 256);
    for (char c : *r.request_id) FUZZ_CHECK(c > ' ' && c <= '~');
  }
  for (int64_t prompt : {int64_t{1}, int64_t{100}, int64_t{5000}}) {
    ApiOr<int> m = ResolveMaxTokens(r, prompt, 4096);
    if (m.ok()) {
      FUZZ_CHECK(m.value() >= 1 && prompt + m.value() <= 4096);
    } else {
      FUZZ_CHECK(m.error().code == "context_length_exceeded");
    }
  }
}

// The stop matcher against a one-shot search, on text cut into pieces at
// every k bytes (whole characters only: the input is valid UTF-8 JSON text).
void CheckStops(const std::vector<std::string>& stops, const std::string& text) {
  if (stops.empty()) return;
  // Reference: the first stop to complete scanning byte by byte.
  std::string expected = text;
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (const std::string& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0)
        best = std::min(best, end - s.size());
    }
    if (best != std::string::npos) {
      expected = text.substr(0, best);
      break;
    }
  }
  for (size_t step : {size_t{1}, size_t{3}, size_t{1000}}) {
    StopMatcher m(stops);
    std::string got;
    size_t i = 0;
    while (i < text.size() && !m.stopped()) {
      size_t len = std::min(step, text.size() - i);
      while (i + len < text.size() && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80)
        ++len;
      got += m.Add(std::string_view(text).substr(i, len)).text;
      i += len;
    }
    got += m.Flush();
    FUZZ_CHECK(got == expected);
  }
}

void CheckStream(StreamEncoder::Kind kind, const GenerationFields& r, const std::string& text) {
  StreamSettings s;
  s.num_choices = std::min(r.n, 4);
  s.options = r.stream_options;
  s.logprobs.enabled = r.sampling.logprobs >= 0;
  s.logprobs.top = r.sampling.logprobs;
  s.logprobs.tokens_as_ids = true;
  s.return_token_ids = r.return_token_ids;
  s.prompt_token_ids = {{1, 2}};  // fewer than the choices: the rest send []
  StreamEncoder enc(kind, ResponseMeta{"id", 1, r.model}, s);
  std::string sse = enc.Start();
  GeneratedToken t{7, -1.5f, {{7, -1.5f}, {8, -2.f}}};
  StreamDelta d;
  d.text = text;
  d.tokens = {t};
  sse += enc.Delta(d);
  d.text.clear();
  d.finish_reason = FinishReason::kStop;
  d.stop_reason = r.stop.empty() ? StopReason{} : r.stop[0];
  sse += enc.Delta(d);
  sse += enc.Finish(Usage{3, 2, std::nullopt});
  // Every event is "data: <json>\n\n" and the last is [DONE].
  size_t pos = 0;
  std::string last;
  while (pos < sse.size()) {
    FUZZ_CHECK(sse.compare(pos, 6, "data: ") == 0);
    size_t end = sse.find("\n\n", pos);
    FUZZ_CHECK(end != std::string::npos);
    last = sse.substr(pos + 6, end - pos - 6);
    FUZZ_CHECK(last == "[DONE]" || Json::accept(last));
    pos = end + 2;
  }
  FUZZ_CHECK(last == "[DONE]");
}

void FuzzOne(std::string_view body) {
  ProtocolLimits limits;
  limits.max_stop_strings = 8;
  limits.max_prompts = 16;

  ApiOr<CompletionRequest> completion = ParseCompletionRequest(body, limits);
  if (!completion.ok()) {
    CheckError(completion.error());
  } else {
    const CompletionRequest& r = completion.value();
    CheckCommon(r, limits);
    FUZZ_CHECK(!r.prompts.empty() && r.prompts.size() <= limits.max_prompts);
    FUZZ_CHECK(!r.echo_only || r.echo);
    for (const PromptInput& p : r.prompts)
      FUZZ_CHECK(p.is_tokens ? !p.token_ids.empty() : !p.text.empty());
    if (!r.prompts[0].is_tokens) CheckStops(r.stop, r.prompts[0].text);
    CheckStream(StreamEncoder::Kind::kCompletion, r, r.prompts[0].text);
    ChoiceOutput c;
    c.text = r.prompts[0].text;
    c.tokens = {GeneratedToken{1, -0.5f, {{2, -0.25f}}}};
    if (r.return_token_ids)
      c.prompt_token_ids = std::vector<int32_t>{3}, c.token_ids = std::vector<int32_t>{1};
    LogprobOptions lp = LogprobOptionsFor(r, nullptr);
    FUZZ_CHECK(Json::accept(
        DumpJson(CompletionResponseJson(ResponseMeta{"cmpl-x", 1, r.model}, {c}, Usage{}, lp))));
  }

  ApiOr<ChatCompletionRequest> chat = ParseChatCompletionRequest(body, limits);
  if (!chat.ok()) {
    CheckError(chat.error());
  } else {
    const ChatCompletionRequest& r = chat.value();
    CheckCommon(r, limits);
    FUZZ_CHECK(r.messages.is_array() && !r.messages.empty());
    for (const Json& m : r.messages) FUZZ_CHECK(m["role"].is_string() && m["content"].is_string());
    FUZZ_CHECK(r.sampling.logprobs == (r.logprobs ? r.top_logprobs : -1));
    FUZZ_CHECK(!(r.continue_final_message && r.add_generation_prompt));
    FUZZ_CHECK(r.tools.is_null() || (r.tools.is_array() && !r.tools.empty()));
    const std::string text = r.messages.back()["content"].get<std::string>();
    CheckStops(r.stop, text);
    CheckStream(StreamEncoder::Kind::kChat, r, text);
    // Normalised messages must serialise (they go to the template's tojson).
    FUZZ_CHECK(Json::accept(DumpJson(r.messages)));
  }

  // /v1/responses: the chat checks hold for what it translates to; the
  // response object and every stream event serialise.
  ApiOr<ResponsesRequest> responses = ParseResponsesRequest(body, limits);
  if (!responses.ok()) {
    CheckError(responses.error());
  } else {
    const ResponsesRequest& r = responses.value();
    CheckCommon(r.chat, limits);
    FUZZ_CHECK(r.chat.n == 1 && !r.chat.messages.empty());
    ChoiceOutput c;
    c.text = r.chat.messages.back()["content"].get<std::string>();
    c.tool_calls = {ToolCall{"call_1", "f", "{}"}};
    FUZZ_CHECK(Json::accept(DumpJson(ResponseObjectJson(r.context, c, Usage{}))));
    ResponsesStreamEncoder enc(r.context);
    std::string sse = enc.Start();
    StreamDelta d;
    d.text = c.text;
    d.reasoning_content = "r";
    sse += enc.Delta(d);
    d = {};
    d.finish_reason = FinishReason::kLength;
    sse += enc.Delta(d);
    sse += enc.Finish(Usage{});
    for (size_t pos = 0; pos < sse.size();) {
      FUZZ_CHECK(sse.compare(pos, 7, "event: ") == 0);
      const size_t data = sse.find("\ndata: ", pos);
      const size_t end = sse.find("\n\n", pos);
      FUZZ_CHECK(data != std::string::npos && end != std::string::npos && data < end);
      FUZZ_CHECK(Json::accept(sse.substr(data + 7, end - data - 7)));
      pos = end + 2;
    }
  }
}

}  // namespace
}  // namespace strata

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
