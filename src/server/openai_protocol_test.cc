#include "server/openai_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "server/chat_prompt.h"
#include "server/json_body.h"
#include "server/openai_protocol_test_util.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;
using namespace protocol_test;  // NOLINT: test helpers

// ---------------------------------------------------------------------------
// Defaults and every field's happy path.

TEST(CompletionRequest, DefaultsFollowOpenAIAndVllm) {
  CompletionRequest r = Completion(R"({"model": "m", "prompt": "Hello"})");
  EXPECT_FALSE(r.is_chat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].text, "Hello");
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.sampling.max_tokens, 16);
  EXPECT_EQ(r.sampling.temperature, 1.f);
  EXPECT_EQ(r.sampling.top_p, 1.f);
  EXPECT_EQ(r.sampling.top_k, -1);
  EXPECT_EQ(r.sampling.min_p, 0.f);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.f);
  EXPECT_EQ(r.sampling.logprobs, -1);
  EXPECT_FALSE(r.sampling.seed);
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_TRUE(r.add_special_tokens);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_TRUE(r.ignored_fields.empty());
  EXPECT_TRUE(r.sampling.Validate().ok());
}

TEST(CompletionRequest, EveryFieldIsRead) {
  CompletionRequest r = Completion(R"({
    "model": "qwen", "prompt": ["a", "b"], "max_tokens": 7, "n": 3, "echo": true, "stream": true,
    "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    "stop": ["x", "yz"], "stop_token_ids": [5, 6], "seed": 42, "temperature": 0.5, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "frequency_penalty": 0.5, "presence_penalty": -0.5,
    "repetition_penalty": 1.1, "ignore_eos": true, "return_tokens_as_token_ids": true, "user": "u1",
    "skip_special_tokens": false, "include_stop_str_in_output": true, "add_special_tokens": false})");
  EXPECT_EQ(r.model, "qwen");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].text, "b");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.max_tokens, 7);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.echo);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.stream_options.include_usage);
  EXPECT_TRUE(r.stream_options.continuous_usage_stats);
  EXPECT_THAT(r.stop, ElementsAre("x", "yz"));
  EXPECT_THAT(r.sampling.stop_token_ids, ElementsAre(5, 6));
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_TRUE(r.return_tokens_as_token_ids);
  EXPECT_EQ(r.user, "u1");
  EXPECT_FALSE(r.skip_special_tokens);
  EXPECT_TRUE(r.include_stop_str_in_output);
  EXPECT_FALSE(r.add_special_tokens);
  EXPECT_TRUE(r.sampling.Validate().ok());
}

TEST(CompletionRequest, PromptShapes) {
  CompletionRequest tokens = Completion(R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(tokens.prompts.size(), 1u);
  EXPECT_TRUE(tokens.prompts[0].is_tokens);
  EXPECT_THAT(tokens.prompts[0].token_ids, ElementsAre(1, 2, 3));

  CompletionRequest batch = Completion(R"({"prompt": [[1, 2], [3]]})");
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_THAT(batch.prompts[1].token_ids, ElementsAre(3));

  CompletionRequest texts = Completion(R"({"prompt": ["x", "y", "z"]})");
  ASSERT_EQ(texts.prompts.size(), 3u);
  EXPECT_EQ(texts.prompts[2].text, "z");
  EXPECT_TRUE(texts.model.empty()) << "model is optional (vLLM)";
}

TEST(CompletionRequest, NullMeansDefault) {
  CompletionRequest r = Completion(CompletionBody(
      R"("max_tokens": null, "temperature": null, "stop": null, "seed": null, "logprobs": null, "n": null,
         "stream_options": null, "top_k": null, "user": null)"));
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.sampling.temperature, 1.f);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.logprobs);
}

TEST(CompletionRequest, SingleStopStringAndSmallValues) {
  CompletionRequest r =
      Completion(CompletionBody(R"("stop": "\n", "temperature": 0, "top_k": 0, "seed": -1)"));
  EXPECT_THAT(r.stop, ElementsAre("\n"));
  EXPECT_TRUE(r.sampling.IsGreedy());
  EXPECT_EQ(r.sampling.top_k, -1) << "top_k 0 means off";
  EXPECT_FALSE(r.sampling.seed) << "seed -1 means none (vLLM)";
}

TEST(CompletionRequest, IntegralFloatsCountAsIntegersAndBoundsAreInclusive) {
  CompletionRequest r = Completion(CompletionBody(
      R"("max_tokens": 5.0, "temperature": 2, "top_p": 1, "min_p": 1, "frequency_penalty": -2,
         "presence_penalty": 2, "n": 128, "logprobs": 20)"));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 2.f);
  EXPECT_EQ(r.n, 128);
  EXPECT_EQ(r.logprobs, 20);
  EXPECT_EQ(r.sampling.logprobs, 20);
}

TEST(CompletionRequest, SeedCoversTheWholeInt64Range) {
  EXPECT_EQ(Completion(CompletionBody(R"("seed": 9223372036854775807)")).sampling.seed,
            9223372036854775807ull);
  EXPECT_EQ(Completion(CompletionBody(R"("seed": -9223372036854775808)")).sampling.seed,
            9223372036854775808ull);
  EXPECT_EQ(Completion(CompletionBody(R"("seed": -2)")).sampling.seed, static_cast<uint64_t>(-2));
}

TEST(CompletionRequest, LogprobsZeroMeansSampledTokenOnly) {
  CompletionRequest r = Completion(CompletionBody(R"("logprobs": 0)"));
  EXPECT_EQ(r.logprobs, 0);
  EXPECT_EQ(r.sampling.logprobs, 0);
}

TEST(CompletionRequest, EchoWithZeroMaxTokensReturnsThePromptOnly) {
  CompletionRequest r = Completion(CompletionBody(R"("echo": true, "max_tokens": 0)"));
  EXPECT_TRUE(r.echo_only);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_EQ(r.sampling.max_tokens, 1) << "sampling stays valid";
  EXPECT_TRUE(r.sampling.Validate().ok());
}

TEST(CompletionRequest, EchoWithLogprobsWorksWhenPromptLogprobsAre) {
  ProtocolLimits limits;
  limits.prompt_logprobs_supported = true;
  EXPECT_EQ(Completion(CompletionBody(R"("echo": true, "logprobs": 2)"), limits).logprobs, 2);
}

TEST(CompletionRequest, UnknownFieldsAreListedNotRejected) {
  CompletionRequest r =
      Completion(CompletionBody(R"("zeta": 1, "alpha": {"x": []}, "user": "u", "metadata": {})"));
  EXPECT_THAT(r.ignored_fields, ElementsAre("alpha", "zeta"));
}

TEST(CompletionRequest, DefaultOfKnownUnsupportedFieldsIsAccepted) {
  Completion(
      CompletionBody(R"("logit_bias": {}, "suffix": "", "best_of": 1, "use_beam_search": false,
                               "min_tokens": 0, "prompt_logprobs": null, "bad_words": [])"));
  Completion(CompletionBody(R"("n": 2, "best_of": 2, "temperature": 0.7)"));
}

TEST(CompletionRequest, TokenIdsAreCheckedAgainstTheVocabulary) {
  ProtocolLimits limits;
  limits.vocab_size = 10;
  Completion(R"({"prompt": [0, 9]})", limits);
  ApiOr<CompletionRequest> r = ParseCompletionRequest(R"({"prompt": [[1], [2, 10]]})", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().param, "prompt[1][1]");
  EXPECT_EQ(r.error().message, "prompt[1][1] must be a token id in [0, 9], got 10");
}

// ---------------------------------------------------------------------------
// Chat.

TEST(ChatRequest, DefaultsAndMessages) {
  ChatCompletionRequest r = Chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi", "name": "bob"}]})");
  EXPECT_TRUE(r.is_chat);
  EXPECT_FALSE(r.max_tokens) << "chat default: up to the context";
  EXPECT_FALSE(r.logprobs);
  EXPECT_EQ(r.sampling.logprobs, -1);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_FALSE(r.continue_final_message);
  EXPECT_FALSE(r.add_special_tokens) << "chat templates write BOS themselves";
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_EQ(r.response_role, "assistant");
  EXPECT_EQ(
      r.messages.dump(),
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi","name":"bob"}])");
}

TEST(ChatRequest, TextPartsAreJoinedWithNewlines) {
  ChatCompletionRequest r = Chat(R"({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]})");
  EXPECT_EQ(r.messages[0]["content"], "one\ntwo");
}

TEST(ChatRequest, AssistantMayOmitContentAndCarriesToolCallsAndReasoning) {
  ChatCompletionRequest r = Chat(R"({"messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get", "arguments": "{\"city\": \"Paris\", \"n\": 2}"}},
                      {"id": "c2", "type": "function", "function": {"name": "now", "arguments": ""}}]},
      {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]})");
  const Json& a = r.messages[1];
  EXPECT_EQ(a["content"], "");
  EXPECT_EQ(a["reasoning_content"], "think");
  EXPECT_EQ(a["reasoning"], "think");
  EXPECT_EQ(a["tool_calls"][0]["function"]["arguments"].dump(), R"({"city":"Paris","n":2})")
      << "arguments are parsed to an object, key order kept";
  EXPECT_EQ(a["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(a["tool_calls"][1]["function"]["arguments"].dump(), "{}");
  EXPECT_EQ(r.messages[2]["tool_call_id"], "c1");
}

TEST(ChatRequest, EveryChatFieldIsRead) {
  ChatCompletionRequest r = Chat(ChatBody(R"(
      "max_completion_tokens": 12, "max_tokens": 99, "logprobs": true, "top_logprobs": 3,
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "b": 1, "a": 2}}}],
      "tool_choice": "auto", "response_format": {"type": "text"},
      "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": true,
      "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n\n"], "n": 2)"));
  EXPECT_EQ(r.max_tokens, 12) << "max_completion_tokens wins over max_tokens";
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.sampling.logprobs, 3);
  EXPECT_EQ(r.tools[0]["function"]["parameters"].dump(), R"({"type":"object","b":1,"a":2})")
      << "tool schemas keep the client's key order";
  EXPECT_EQ(r.chat_template_kwargs.dump(), R"({"enable_thinking":false})");
  EXPECT_EQ(r.enable_thinking, false);
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_TRUE(r.stream_options.include_usage);
  EXPECT_EQ(r.n, 2);
  EXPECT_THAT(r.stop, ElementsAre("\n\n"));
}

TEST(ChatRequest, MaxTokensAloneAndLogprobsWithoutTop) {
  ChatCompletionRequest r = Chat(ChatBody(R"("max_tokens": 5, "logprobs": true)"));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.max_tokens, 5);
  EXPECT_EQ(r.sampling.logprobs, 0) << "logprobs true, top 0: the sampled token's logprob only";
  EXPECT_EQ(Chat(ChatBody(R"("top_logprobs": 0)")).sampling.logprobs, -1);
}

TEST(ChatRequest, ContinueFinalMessageTurnsOffTheGenerationPrompt) {
  ChatCompletionRequest r = Chat(R"({"messages": [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Sure, here"}], "continue_final_message": true})");
  EXPECT_TRUE(r.continue_final_message);
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_EQ(r.response_role, "assistant");
}

TEST(ChatRequest, WithoutGenerationPromptTheReplyTakesTheLastRole) {
  ChatCompletionRequest r = Chat(ChatBody(R"("add_generation_prompt": false)"));
  EXPECT_EQ(r.response_role, "user");
}

TEST(ChatRequest, DeveloperRoleAndUnknownMessageKeys) {
  ChatCompletionRequest r = Chat(R"({"messages": [{"role": "developer", "content": "x", "extra": 1},
                                                   {"role": "user", "content": "y"}]})");
  EXPECT_EQ(r.messages[0].dump(), R"({"role":"developer","content":"x"})");
}

// ---------------------------------------------------------------------------
// Errors: status, exact param, and a message that says what is allowed.

TEST(RequestErrors, MalformedJson) {
  for (const char* body :
       {"", "{", "{\"prompt\": }", "[1, 2", "{\"a\": 1} x", "nul", "{\"a\": \"\xff\"}"}) {
    ApiOr<CompletionRequest> r = ParseCompletionRequest(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_EQ(r.error().param, "");
    EXPECT_THAT(r.error().message, HasSubstr("invalid JSON: "));
  }
  ApiOr<CompletionRequest> r = ParseCompletionRequest("{\"prompt\": tru}");
  EXPECT_THAT(r.error().message, HasSubstr("line 1, column"));
}

TEST(RequestErrors, BodyMustBeAnObject) {
  ExpectCompletionError({"[1]", "", "must be a JSON object, got an array"});
  ExpectChatError({"\"hi\"", "", "must be a JSON object, got a string"});
}

TEST(RequestErrors, NestingIsBounded) {
  std::string deep =
      R"({"prompt": "x", "x_deep": )" + std::string(200, '[') + std::string(200, ']') + "}";
  ExpectCompletionError({deep, "", "nested deeper than 128 levels"});
  ProtocolLimits limits;
  limits.max_json_depth = 300;
  Completion(deep, limits);
}

TEST(RequestErrors, SamplingRanges) {
  const std::vector<ErrorCase> cases = {
      {CompletionBody(R"("temperature": 3.5)"), "temperature",
       "temperature must be in [0, 2], got 3.5"},
      {CompletionBody(R"("temperature": -0.1)"), "temperature", "[0, 2]"},
      {CompletionBody(R"("top_p": 0)"), "top_p", "top_p must be in (0, 1], got 0"},
      {CompletionBody(R"("top_p": 1.5)"), "top_p", "(0, 1]"},
      {CompletionBody(R"("min_p": -0.5)"), "min_p", "min_p must be in [0, 1], got -0.5"},
      {CompletionBody(R"("frequency_penalty": 2.5)"), "frequency_penalty",
       "must be in [-2, 2], got 2.5"},
      {CompletionBody(R"("presence_penalty": -3)"), "presence_penalty",
       "must be in [-2, 2], got -3"},
      {CompletionBody(R"("repetition_penalty": 0)"), "repetition_penalty",
       "must be > 0 (1 is off), got 0"},
      {CompletionBody(R"("top_k": -2)"), "top_k",
       "top_k must be -1 or 0 (off) or at least 1, got -2"},
      {CompletionBody(R"("top_k": 1.5)"), "top_k", "top_k must be an integer, got 1.5"},
      {CompletionBody(R"("n": 0)"), "n", "n must be in [1, 128], got 0"},
      {CompletionBody(R"("n": 129)"), "n", "got 129"},
      {CompletionBody(R"("max_tokens": 0)"), "max_tokens", "0 is allowed only with echo"},
      {CompletionBody(R"("max_tokens": -5)"), "max_tokens",
       "max_tokens must be in [0, 2147483647], got -5"},
      {CompletionBody(R"("max_tokens": 3000000000)"), "max_tokens", "got 3000000000"},
      {CompletionBody(R"("logprobs": 21)"), "logprobs", "logprobs must be in [0, 20], got 21"},
      {CompletionBody(R"("logprobs": -1)"), "logprobs", "got -1"},
      {CompletionBody(R"("seed": 9223372036854775808)"), "seed",
       "seed must be an integer in [-2^63, 2^63 - 1]"},
      {CompletionBody(R"("seed": 1.5)"), "seed", "got 1.5"},
      {CompletionBody(R"("stop_token_ids": [1, -1])"), "stop_token_ids[1]",
       "must be a token id in [0, "},
  };
  for (const ErrorCase& c : cases) ExpectCompletionError(c);
}

TEST(RequestErrors, WrongJsonTypes) {
  const std::vector<ErrorCase> cases = {
      {CompletionBody(R"("temperature": "hot")"), "temperature",
       "temperature must be a number, got a string"},
      {CompletionBody(R"("top_p": true)"), "top_p", "must be a number, got a boolean"},
      {CompletionBody(R"("n": "2")"), "n", "n must be an integer, got a string"},
      {CompletionBody(R"("n": true)"), "n", "must be an integer, got a boolean"},
      {CompletionBody(R"("stream": 1)"), "stream", "stream must be a boolean, got an integer"},
      {CompletionBody(R"("echo": "yes")"), "echo", "echo must be a boolean"},
      {CompletionBody(R"("model": 5)"), "model", "model must be a string, got an integer"},
      {CompletionBody(R"("user": [])"), "user", "must be a string, got an array"},
      {CompletionBody(R"("stop": 5)"), "stop",
       "stop must be a string or an array of strings, got an integer"},
      {CompletionBody(R"("stop": ["a", 1])"), "stop[1]",
       "stop[1] must be a string, got an integer"},
      {CompletionBody(R"("stop_token_ids": 5)"), "stop_token_ids", "must be an array of token ids"},
      {CompletionBody(R"("stop_token_ids": ["a"])"), "stop_token_ids[0]",
       "must be a token id (integer)"},
      {CompletionBody(R"("seed": "1")"), "seed", "seed must be an integer, got a string"},
      {CompletionBody(R"("logprobs": true)"), "logprobs",
       "logprobs must be an integer, got a boolean"},
      {CompletionBody(R"("stream_options": [])"), "stream_options", "must be an object"},
      {CompletionBody(R"("stream": true, "stream_options": {"include_usage": "yes"})"),
       "stream_options.include_usage", "must be a boolean, got a string"},
      {CompletionBody(R"("ignore_eos": null, "skip_special_tokens": 0)"), "skip_special_tokens",
       "a boolean"},
      {CompletionBody(R"("return_tokens_as_token_ids": "no")"), "return_tokens_as_token_ids",
       "a boolean"},
      {CompletionBody(R"("include_stop_str_in_output": 1)"), "include_stop_str_in_output",
       "a boolean"},
      {CompletionBody(R"("add_special_tokens": "x")"), "add_special_tokens", "a boolean"},
  };
  for (const ErrorCase& c : cases) ExpectCompletionError(c);
}

TEST(RequestErrors, StopStrings) {
  ExpectCompletionError(
      {CompletionBody(R"("stop": "")"), "stop", "stop must not be an empty string"});
  ExpectCompletionError(
      {CompletionBody(R"("stop": ["a", ""])"), "stop[1]", "stop[1] must not be empty"});
  ProtocolLimits limits;
  limits.max_stop_strings = 2;
  limits.max_stop_string_bytes = 3;
  ExpectCompletionError(
      {CompletionBody(R"("stop": ["a", "b", "c"])"), "stop", "stop has 3 strings; at most 2"},
      limits);
  ExpectCompletionError(
      {CompletionBody(R"("stop": ["a", "abcd"])"), "stop[1]", "4 bytes long; at most 3"}, limits);
  ExpectCompletionError({CompletionBody(R"("stop": "abcd")"), "stop", "4 bytes long"}, limits);
}

TEST(RequestErrors, StreamOptionsNeedStream) {
  ExpectCompletionError({CompletionBody(R"("stream_options": {"include_usage": true})"),
                         "stream_options", "stream_options can only be set when stream is true"});
  Completion(CompletionBody(R"("stream_options": {})"));
}

TEST(RequestErrors, Prompts) {
  const std::vector<ErrorCase> cases = {
      {R"({"model": "m"})", "prompt", "prompt is required"},
      {R"({"prompt": null})", "prompt", "prompt is required"},
      {R"({"prompt": ""})", "prompt", "prompt must not be empty"},
      {R"({"prompt": []})", "prompt", "prompt must not be an empty array"},
      {R"({"prompt": 5})", "prompt",
       "prompt must be a string, an array of strings, an array of token ids"},
      {R"({"prompt": {"text": "x"}})", "prompt", "got an object"},
      {R"({"prompt": ["a", 1]})", "prompt[1]", "must be a string like the other prompts"},
      {R"({"prompt": ["a", ""]})", "prompt[1]", "prompt[1] must not be empty"},
      {R"({"prompt": [1, "a"]})", "prompt[1]", "must be a token id (integer), got a string"},
      {R"({"prompt": [1, 2.5]})", "prompt[1]", "must be a token id"},
      {R"({"prompt": [-1]})", "prompt[0]", "must be a token id in [0, 2147483647], got -1"},
      {R"({"prompt": [[1], []]})", "prompt[1]", "prompt[1] must not be an empty array"},
      {R"({"prompt": [[1], [2, "x"]]})", "prompt[1][1]", "must be a token id"},
      {R"({"prompt": [[1], 2]})", "prompt[1]", "got an integer"},
      {R"({"prompt": [null]})", "prompt", "got an array"},
      {R"({"prompt": [true]})", "prompt", "prompt must be a string, an array of strings"},
  };
  for (const ErrorCase& c : cases) ExpectCompletionError(c);
  ProtocolLimits limits;
  limits.max_prompts = 2;
  ExpectCompletionError(
      {R"({"prompt": ["a", "b", "c"]})", "prompt", "prompt has 3 prompts; at most 2"}, limits);
  Completion(R"({"prompt": [1, 2, 3]})", limits);  // one prompt of token ids
}

TEST(RequestErrors, UnsupportedFeaturesAreRejectedNotIgnored) {
  const std::vector<ErrorCase> cases = {
      {CompletionBody(R"("logit_bias": {"x": 10})"), "logit_bias.x", "keys must be token ids"},
      {CompletionBody(R"("logit_bias": {"5": 101})"), "logit_bias.5", "must be in [-100, 100]"},
      {CompletionBody(R"("logit_bias": {"5": "1"})"), "logit_bias.5", "must be a number"},
      {CompletionBody(R"("logit_bias": 5)"), "logit_bias",
       "must be an object mapping token ids to biases"},
      {CompletionBody(R"("suffix": "end")"), "suffix", "suffix is not supported"},
      {CompletionBody(R"("best_of": 3)"), "best_of", "best_of must equal n or be omitted"},
      {CompletionBody(R"("use_beam_search": true)"), "use_beam_search", "not supported"},
      {CompletionBody(R"("min_tokens": -1)"), "min_tokens", "must be in [0, 2147483647]"},
      {CompletionBody(R"("prompt_logprobs": 1)"), "prompt_logprobs", "not supported"},
      {CompletionBody(R"("guided_json": "nope")"), "guided_json", "must be a JSON schema"},
      {CompletionBody(R"("guided_json": {}, "guided_regex": "a")"), "guided_regex",
       "both ask for structured output"},
      {CompletionBody(R"("structured_outputs": {"structural_tag": "x"})"),
       "structured_outputs.structural_tag", "not supported"},
      {CompletionBody(R"("structured_outputs": {"regex": "a", "choice": ["b"]})"),
       "structured_outputs.choice", "takes one of"},
      {CompletionBody(R"("guided_choice": [])"), "guided_choice", "non-empty array"},
      {CompletionBody(R"("prompt_embeds": "abc")"), "prompt_embeds", "not supported"},
      {CompletionBody(R"("truncate_prompt_tokens": 5)"), "truncate_prompt_tokens", "not supported"},
      {CompletionBody(R"("response_format": {"type": "xml"})"), "response_format.type",
       "not supported"},
      {CompletionBody(R"("echo": true, "logprobs": 1)"), "logprobs",
       "logprobs with echo needs the prompt's logprobs"},
  };
  for (const ErrorCase& c : cases) ExpectCompletionError(c);
}

TEST(RequestErrors, ChatMessages) {
  const std::vector<ErrorCase> cases = {
      {R"({"model": "m"})", "messages", "messages is required"},
      {R"({"messages": []})", "messages", "messages must not be empty"},
      {R"({"messages": "hi"})", "messages", "messages must be an array of messages, got a string"},
      {R"({"messages": ["hi"]})", "messages[0]", "messages[0] must be an object, got a string"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role", "messages[0].role is required"},
      {R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role", "must be a string"},
      {R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "x"}]})",
       "messages[1].role", "must be one of system, user, assistant, tool, developer; got \"bot\""},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content",
       "messages[0].content is required for role 'user'"},
      {R"({"messages": [{"role": "system", "content": null}]})", "messages[0].content",
       "required for role 'system'"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "must be a string or an array of content parts, got an integer"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0].type", "only text content is supported"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]})",
       "messages[0].content[1]", "must be a content part object, got a string"},
      {R"({"messages": [{"role": "user", "content": [{"text": "a"}]}]})",
       "messages[0].content[0].type", "is required"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]})",
       "messages[0].content[0].text", "must be a string"},
      {R"({"messages": [{"role": "user", "content": "x", "name": 1}]})", "messages[0].name",
       "must be a string"},
      {R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", "messages[0].tool_calls",
       "must be an array"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "a"}]}]})",
       "messages[0].tool_calls[0].function", "is required"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name", "is required and must be a string"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "must be a JSON string: invalid JSON"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "a JSON string or an object"},
      {R"({"messages": [{"role": "assistant", "content": "a", "reasoning_content": 1}]})",
       "messages[0].reasoning_content", "must be a string"},
      {R"({"messages": [{"role": "tool", "content": "a", "tool_call_id": 1}]})",
       "messages[0].tool_call_id", "must be a string"},
  };
  for (const ErrorCase& c : cases) ExpectChatError(c);
}

TEST(RequestErrors, ChatFields) {
  const std::vector<ErrorCase> cases = {
      {ChatBody(R"("max_tokens": 0)"), "max_tokens",
       "max_tokens must be in [1, 2147483647], got 0"},
      {ChatBody(R"("max_completion_tokens": -1)"), "max_completion_tokens", "got -1"},
      {ChatBody(R"("logprobs": 1)"), "logprobs", "logprobs must be a boolean, got an integer"},
      {ChatBody(R"("top_logprobs": 2)"), "top_logprobs",
       "top_logprobs requires logprobs to be true"},
      {ChatBody(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs",
       "must be in [0, 20], got 21"},
      {ChatBody(R"("logprobs": true, "top_logprobs": "3")"), "top_logprobs", "must be an integer"},
      {ChatBody(R"("tools": [])"), "tools", "tools must not be an empty array"},
      {ChatBody(R"("tools": {})"), "tools", "tools must be an array"},
      {ChatBody(R"("tools": [{"type": "code"}])"), "tools[0].type", "must be \"function\""},
      {ChatBody(R"("tools": [{"type": "function"}])"), "tools[0].function", "must be an object"},
      {ChatBody(R"("tools": [{"function": {"description": "d"}}])"), "tools[0].function.name",
       "is required"},
      {ChatBody(R"("tool_choice": "required")"), "tool_choice", "needs tools to call"},
      {ChatBody(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"),
       "tool_choice.function.name", "not among the request's tools"},
      {ChatBody(R"("tool_choice": {"type": "function"})"), "tool_choice", "must be \"none\""},
      {ChatBody(R"("tool_choice": "any")"), "tool_choice", "must be \"none\""},
      {ChatBody(R"("chat_template_kwargs": {"enable_thinking": "no"})"),
       "chat_template_kwargs.enable_thinking", "must be a boolean"},
      {ChatBody(R"("tool_choice": 1)"), "tool_choice", "must be a string or an object"},
      {ChatBody(R"("response_format": {"type": "json_schema"})"), "response_format.json_schema",
       "is required"},
      {ChatBody(R"("response_format": {"type": "json_schema", "json_schema": {"schema": 3}})"),
       "response_format.json_schema.schema", "must be a JSON schema"},
      {ChatBody(R"("response_format": {"type": "json_schema", "json_schema": {"strict": 1}})"),
       "response_format.json_schema.strict", "must be a boolean"},
      {ChatBody(R"("response_format": "text")"), "response_format", "must be an object"},
      {ChatBody(R"("chat_template_kwargs": [])"), "chat_template_kwargs", "must be an object"},
      {ChatBody(R"("chat_template_kwargs": {"messages": []})"), "chat_template_kwargs.messages",
       "may not be set"},
      {ChatBody(R"("chat_template_kwargs": {"add_generation_prompt": false})"),
       "chat_template_kwargs.add_generation_prompt",
       "use the request's own add_generation_prompt field"},
      {ChatBody(R"("add_generation_prompt": "no")"), "add_generation_prompt", "must be a boolean"},
      {ChatBody(R"("continue_final_message": true, "add_generation_prompt": true)"),
       "continue_final_message", "cannot both be true"},
      {R"({"messages": [{"role": "assistant"}], "continue_final_message": true})",
       "messages[0].content",
       "continue_final_message needs a final message with non-empty text content"},
      {ChatBody(R"("echo": true)"), "echo", "not supported for chat"},
      {ChatBody(R"("chat_template": "{{ x }}")"), "chat_template", "not supported"},
      {ChatBody(R"("documents": [{"text": "a"}])"), "documents", "not supported"},
      {ChatBody(R"("temperature": 9)"), "temperature", "[0, 2]"},
  };
  for (const ErrorCase& c : cases) ExpectChatError(c);
}

TEST(RequestErrors, ErrorValueIsShortenedInMessages) {
  std::string big(500, '9');
  ApiOr<CompletionRequest> r = ParseCompletionRequest(CompletionBody("\"temperature\": 1" + big));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.error().message.size(), 200u);
}

// ---------------------------------------------------------------------------
// Known fields: every one has its type checked (issue 6 item 9: "functions":
// [1, "a"] was a 200). A value of the wrong type for each field, by endpoint.

struct WrongTypeCase {
  const char* field;
  const char* value;  // JSON
};

const std::vector<WrongTypeCase>& CommonWrongTypes() {
  static const std::vector<WrongTypeCase> cases = {{"model", "5"},
                                                   {"n", R"("2")"},
                                                   {"stream", "1"},
                                                   {"stream_options", "[]"},
                                                   {"stop", "5"},
                                                   {"stop_token_ids", "5"},
                                                   {"include_stop_str_in_output", "1"},
                                                   {"skip_special_tokens", "0"},
                                                   {"spaces_between_special_tokens", R"("yes")"},
                                                   {"return_tokens_as_token_ids", R"("no")"},
                                                   {"add_special_tokens", R"("x")"},
                                                   {"max_tokens", R"("5")"},
                                                   {"temperature", R"("hot")"},
                                                   {"top_p", "true"},
                                                   {"top_k", R"("1")"},
                                                   {"min_p", "[]"},
                                                   {"frequency_penalty", "{}"},
                                                   {"presence_penalty", R"("0")"},
                                                   {"repetition_penalty", R"("1")"},
                                                   {"seed", R"("1")"},
                                                   {"ignore_eos", "1"},
                                                   {"user", "[]"},
                                                   {"logit_bias", "5"},
                                                   {"use_beam_search", R"("no")"},
                                                   {"min_tokens", R"("0")"},
                                                   {"prompt_logprobs", R"("1")"},
                                                   {"bad_words", R"("x")"},
                                                   {"allowed_token_ids", R"({"a": 1})"},
                                                   {"structured_outputs", "5"},
                                                   {"guided_json", "5"},
                                                   {"guided_regex", "5"},
                                                   {"guided_choice", "5"},
                                                   {"guided_grammar", "5"},
                                                   {"json_schema", "5"},
                                                   {"grammar", "5"},
                                                   {"logprob_token_ids", R"("1")"},
                                                   {"truncate_prompt_tokens", R"("5")"},
                                                   {"best_of", R"("1")"},
                                                   {"echo", R"("yes")"},
                                                   {"response_format", R"("text")"},
                                                   {"request_id", "5"},
                                                   {"priority", R"("high")"},
                                                   {"metadata", R"(["a"])"},
                                                   {"store", R"("no")"},
                                                   {"service_tier", "1"},
                                                   {"length_penalty", R"("1")"},
                                                   {"cache_salt", "5"},
                                                   {"return_token_ids", R"("yes")"},
                                                   {"bootstrap_host", "5"},
                                                   {"bootstrap_port", R"("8998")"},
                                                   {"bootstrap_room", R"("1")"}};
  return cases;
}

void ExpectWrongTypeRejected(bool chat, const WrongTypeCase& c) {
  // A repeated key's last value wins, so this also overrides prompt/messages/model.
  const std::string body = (chat ? ChatBody("") : CompletionBody(""));
  const std::string with =
      body.substr(0, body.size() - 1) + ", \"" + c.field + "\": " + c.value + "}";
  ApiError e;
  if (chat) {
    ApiOr<ChatCompletionRequest> r = ParseChatCompletionRequest(with);
    ASSERT_FALSE(r.ok()) << with;
    e = r.error();
  } else {
    ApiOr<CompletionRequest> r = ParseCompletionRequest(with);
    ASSERT_FALSE(r.ok()) << with;
    e = r.error();
  }
  EXPECT_EQ(e.http_status, 400) << with;
  EXPECT_EQ(e.param, c.field) << with << "\n" << e.message;
  EXPECT_THAT(e.message, HasSubstr(c.field)) << with;
}

TEST(KnownFields, EveryFieldRejectsAWrongType) {
  std::vector<WrongTypeCase> completion = CommonWrongTypes(), chat = CommonWrongTypes();
  completion.insert(
      completion.end(),
      {{"logprobs", "true"}, {"prompt", "5"}, {"suffix", "5"}, {"prompt_embeds", "5"}});
  chat.insert(chat.end(), {{"logprobs", "1"},
                           {"messages", R"("hi")"},
                           {"max_completion_tokens", R"("5")"},
                           {"top_logprobs", R"("3")"},
                           {"tools", "{}"},
                           {"tool_choice", "1"},
                           {"parallel_tool_calls", R"("yes")"},
                           {"chat_template_kwargs", "[]"},
                           {"add_generation_prompt", R"("no")"},
                           {"continue_final_message", "1"},
                           {"documents", "5"},
                           {"chat_template", "5"},
                           {"reasoning_effort", "1"},
                           {"include_reasoning", R"("no")"},
                           {"modalities", R"("text")"},
                           {"functions", R"([1, "a"])"},
                           {"function_call", "5"}});
  for (bool is_chat : {false, true}) {
    std::vector<std::string> covered;
    for (const WrongTypeCase& c : is_chat ? chat : completion) {
      ExpectWrongTypeRejected(is_chat, c);
      covered.push_back(c.field);
    }
    std::sort(covered.begin(), covered.end());
    EXPECT_EQ(covered, KnownRequestFields(is_chat))
        << "every known field needs a wrong-type case here (" << (is_chat ? "chat" : "completions")
        << ")";
  }
}

TEST(KnownFields, FieldsWithoutEffectHereAreAcceptedWithTheirType) {
  const std::string common = R"("spaces_between_special_tokens": false, "length_penalty": 0.5,
      "metadata": {"team": "a"}, "priority": 0, "service_tier": "auto", "store": false, "user": "u",
      "use_beam_search": false, "min_tokens": 0, "bad_words": [], "allowed_token_ids": [], "logit_bias": {})";
  Completion(CompletionBody(common));
  ChatCompletionRequest r =
      Chat(ChatBody(common + R"(, "parallel_tool_calls": false, "include_reasoning": true,
      "modalities": ["text"], "service_tier": "default")"));
  EXPECT_TRUE(r.ignored_fields.empty());
}

TEST(ChatRequest, ToolChoiceAndParserFields) {
  ChatCompletionRequest r = Chat(ChatBody(R"("tool_choice": "none", "parallel_tool_calls": false,
      "include_reasoning": false)"));
  EXPECT_EQ(r.tool_choice, "none");
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_FALSE(r.include_reasoning);
  EXPECT_EQ(r.enable_thinking, std::nullopt);
  ChatCompletionRequest d = Chat(ChatBody(""));
  EXPECT_EQ(d.tool_choice, "auto");
  EXPECT_TRUE(d.parallel_tool_calls);
  EXPECT_TRUE(d.include_reasoning);
}

TEST(KnownFields, ImplementedVllmFields) {
  CompletionRequest c =
      Completion(CompletionBody(R"("request_id": "job-7:a", "return_token_ids": true)"));
  EXPECT_EQ(c.request_id, "job-7:a");
  EXPECT_TRUE(c.return_token_ids);
  EXPECT_FALSE(Completion(CompletionBody("")).return_token_ids);
  EXPECT_FALSE(Completion(CompletionBody("")).request_id);

  ChatCompletionRequest r = Chat(ChatBody(R"("reasoning_effort": "low")"));
  EXPECT_EQ(r.chat_template_kwargs.dump(), R"({"reasoning_effort":"low"})")
      << "a template variable";
  ChatCompletionRequest both = Chat(ChatBody(
      R"("reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high"})"));
  EXPECT_EQ(both.chat_template_kwargs.dump(), R"({"reasoning_effort":"high"})")
      << "chat_template_kwargs wins";
}

TEST(KnownFields, ValuesThisServerCannotHonourAreRejected) {
  const std::vector<ErrorCase> chat = {
      {ChatBody(R"("functions": [1, "a"])"), "functions", "deprecated"},
      {ChatBody(R"("functions": [{"name": "f", "parameters": {}}])"), "functions",
       "send them as tools"},
      {ChatBody(R"("function_call": "auto")"), "function_call", "use tool_choice"},
      {ChatBody(R"("priority": 1)"), "priority", "no priority scheduling, got 1"},
      {ChatBody(R"("priority": -3)"), "priority", "got -3"},
      {ChatBody(R"("modalities": ["text", "audio"])"), "modalities[1]",
       "only the \"text\" modality"},
      {ChatBody(R"("modalities": [1])"), "modalities[0]", "modalities[0] must be a string"},
      {ChatBody(R"("store": true)"), "store", "does not store completions"},
      {ChatBody(R"("cache_salt": "s")"), "cache_salt", "prefix cache is shared"},
      {ChatBody(R"("service_tier": "flex")"), "service_tier", "\"auto\" or \"default\""},
      {ChatBody(R"("metadata": {"a": 1})"), "metadata.a",
       "metadata.a must be a string, got an integer"},
      {ChatBody(R"("request_id": "")"), "request_id", "1 to 256 printable ASCII characters"},
      {ChatBody(R"("request_id": "a b")"), "request_id", "without spaces"},
      {ChatBody(R"("reasoning_effort": "extreme")"), "reasoning_effort",
       "must be one of none, minimal, low"},
      {ChatBody(R"("bad_words": ["x"])"), "bad_words", "bad_words is not supported"},
      {ChatBody(R"("bad_words": ["x", 2])"), "bad_words[1]", "bad_words[1] must be a string"},
      {ChatBody(R"("allowed_token_ids": [1, "2"])"), "allowed_token_ids[1]", "must be a token id"},
      {ChatBody(R"("best_of": 2)"), "best_of", "best_of must equal n"},
  };
  for (const ErrorCase& c : chat) ExpectChatError(c);
  ExpectChatError(
      {std::string(
           R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "request_id": ")") +
           std::string(257, 'x') + "\"}",
       "request_id", "1 to 256"});
}

// ---------------------------------------------------------------------------
// Parsing is linear in the body (issue 6 item 1: ordered_json's own parser
// took 39 s for an ignored field of 200,000 keys). The bounds tell seconds
// from tens of seconds on a loaded machine; the work takes well under one.

double SecondsToRun(const std::function<void()>& fn) {
  auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string ManyKeys(size_t n, const std::string& value) {
  std::string out = "{";
  for (size_t i = 0; i < n; ++i) out += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + value;
  return out + "}";
}

TEST(LinearParsing, AnIgnoredFieldOf200000Keys) {
  const std::string body = R"({"prompt": "Hi", "junk": )" + ManyKeys(200000, "1") + "}";
  ASSERT_GT(body.size(), 2000000u);
  CompletionRequest r;
  double s = SecondsToRun([&] { r = Completion(body); });
  EXPECT_LT(s, 5.0)
      << "2.2 MB, 200,000 keys in one object: 39 s before, about 0.1 s on an idle core";
  EXPECT_THAT(r.ignored_fields, ElementsAre("junk"));
}

TEST(LinearParsing, DuplicateKeysKeepTheFirstPositionAndTheLastValue) {
  ApiOr<Json> small = ParseJsonBody(R"({"a": 1, "b": 2, "a": {"x": [3]}})", 8);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small.value().dump(), R"({"a":{"x":[3]},"b":2})");
  // Past the size where keys are hashed: the same rule.
  std::string big = ManyKeys(100, "0");
  big.pop_back();
  big += R"(,"k0":"first","k99":"last","new":1})";
  ApiOr<Json> large = ParseJsonBody(big, 8);
  ASSERT_TRUE(large.ok());
  ASSERT_EQ(large.value().size(), 101u);
  EXPECT_EQ(large.value().begin().key(), "k0");
  EXPECT_EQ(large.value()["k0"], "first");
  EXPECT_EQ(large.value()["k99"], "last");
  EXPECT_EQ(std::prev(large.value().end()).key(), "new");
  EXPECT_EQ(ParseChatCompletionRequest(ChatBody(R"("n": 5, "n": 2)")).value().n, 2);
}

TEST(LinearParsing, KeyOrderIsKept) {
  ApiOr<Json> j = ParseJsonBody(R"({"z": 1, "a": [{"y": 1, "b": 2}], "m": null})", 8);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j.value().dump(), R"({"z":1,"a":[{"y":1,"b":2}],"m":null})");
}

// ---------------------------------------------------------------------------
// Helpers around the request.

TEST(ResolveMaxTokens, FitsTheContextLikeOpenAI) {
  ChatCompletionRequest chat = Chat(ChatBody(""));
  EXPECT_EQ(ResolveMaxTokens(chat, 100, 4096).value(), 3996)
      << "chat without max_tokens: the rest of the context";
  chat.max_tokens = 50;
  EXPECT_EQ(ResolveMaxTokens(chat, 100, 4096).value(), 50);
  chat.max_tokens = 4000;
  ApiOr<int> over = ResolveMaxTokens(chat, 100, 4096);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().param, "messages");
  EXPECT_EQ(over.error().code, "context_length_exceeded");
  EXPECT_EQ(
      over.error().message,
      "This model's maximum context length is 4096 tokens. However, you requested 4100 tokens (100 "
      "in the "
      "messages, 4000 in the completion). Please reduce the length of the messages or completion.");

  CompletionRequest comp = Completion(CompletionBody(""));
  EXPECT_FALSE(ResolveMaxTokens(comp, 10, 25).ok())
      << "the default 16 does not fit: an error, not a clamp";
  EXPECT_EQ(ResolveMaxTokens(comp, 10, 26).value(), 16);
  ApiOr<int> full = ResolveMaxTokens(comp, 20, 20);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().param, "prompt");
  EXPECT_THAT(full.error().message, HasSubstr("your request has 20 input tokens"));

  CompletionRequest echo = Completion(CompletionBody(R"("echo": true, "max_tokens": 0)"));
  EXPECT_EQ(ResolveMaxTokens(echo, 5, 20).value(), 1);
}

// Rendering through a real template (Qwen2.5's, as in tests/fixtures/chat).
class ChatRendering : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/chat/qwen2_5.jinja");
    std::stringstream ss;
    ss << in.rdbuf();
    auto t = ChatTemplate::Parse(ss.str());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tmpl_ = *t;
    auto tok = Tokenizer::FromDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen2");
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = *tok;
  }
  std::shared_ptr<const ChatTemplate> tmpl_;
  std::shared_ptr<const Tokenizer> tok_;
};

TEST_F(ChatRendering, ToolCallArgumentsRenderAsObjects) {
  ChatCompletionRequest r = Chat(R"({"messages": [
      {"role": "user", "content": [{"type": "text", "text": "weather"}, {"type": "text", "text": "in Paris?"}]},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]})");
  ApiOr<std::string> text = RenderChatPrompt(*tmpl_, r, *tok_);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(text.value(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n"
            "<|im_start|>user\nweather\nin Paris?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": "
            "\"Paris\"}}\n"
            "</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
  ChatTemplateInputs in = MakeChatTemplateInputs(r, *tok_);
  EXPECT_EQ(in.bos_token, "<|bos|>");
  EXPECT_EQ(in.eos_token, "<|eos|>");
  EXPECT_TRUE(in.add_generation_prompt);
}

TEST_F(ChatRendering, ToolSchemasRenderInTheClientsKeyOrder) {
  ChatCompletionRequest r =
      Chat(ChatBody(R"("tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}}}])"));
  ApiOr<std::string> text = RenderChatPrompt(*tmpl_, r, *tok_);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_THAT(
      text.value(),
      HasSubstr(R"("properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}})"))
      << "tools|tojson in the order sent";
}

// A 200,000-property tool schema (item 1's 28 MB tools froze the server):
// parsed, converted for the template and rendered with tools|tojson in
// seconds; likewise chat_template_kwargs of 200,000 keys.
TEST_F(ChatRendering, HugeToolSchemasAndKwargsRenderInLinearTime) {
  const std::string props = ManyKeys(200000, R"({"type":"string"})");
  const std::string body = ChatBody(R"("tools": [{"type": "function", "function": {"name": "f",
      "parameters": {"type": "object", "properties": )" +
                                    props + "}}}]");
  ASSERT_GT(body.size(), 4000000u);
  ApiOr<std::string> text = InvalidRequestError("", "not run");
  double s = SecondsToRun([&] {
    ChatCompletionRequest r = Chat(body);
    text = RenderChatPrompt(*tmpl_, r, *tok_);
  });
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_LT(s, 10.0) << "parse + render of a 4.6 MB tool schema (about 0.5 s on an idle core)";

  EXPECT_THAT(text.value(), HasSubstr(R"("k0": {"type": "string"}, "k1": {"type": "string"})"));
  EXPECT_THAT(text.value(), HasSubstr(R"("k199999": {"type": "string"}}})"));

  const std::string kwargs = ChatBody(R"("chat_template_kwargs": )" + ManyKeys(200000, "true"));
  s = SecondsToRun([&] {
    ChatCompletionRequest r = Chat(kwargs);
    text = RenderChatPrompt(*tmpl_, r, *tok_);
  });
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_LT(s, 10.0) << "200,000 template variables";
}

TEST_F(ChatRendering, ContinueFinalMessageEndsInsideTheLastTurn) {
  ChatCompletionRequest r = Chat(R"({"messages": [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Sure, here"}], "continue_final_message": true})");
  ApiOr<std::string> text = RenderChatPrompt(*tmpl_, r, *tok_);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_THAT(
      text.value(),
      ::testing::EndsWith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nSure, here"));
}

TEST_F(ChatRendering, TemplateErrorsAre400sOnMessages) {
  auto t = ChatTemplate::Parse("{{ raise_exception('Conversation roles must alternate') }}");
  ASSERT_TRUE(t.ok());
  ApiOr<std::string> text = RenderChatPrompt(**t, Chat(ChatBody("")), *tok_);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().http_status, 400);
  EXPECT_EQ(text.error().param, "messages");
  EXPECT_THAT(text.error().message, HasSubstr("Conversation roles must alternate"));

  auto cut = ChatTemplate::Parse("{% for m in messages %}[{{ m.role }}]{% endfor %}");
  ASSERT_TRUE(cut.ok());
  ChatCompletionRequest r = Chat(R"({"messages": [{"role": "assistant", "content": "abc"}],
                                     "continue_final_message": true})");
  ApiOr<std::string> missing = RenderChatPrompt(**cut, r, *tok_);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr("does not appear in the prompt"));
}

TEST(ApiErrors, Constructors) {
  ApiError o = OverloadedError("queue full", "max_queued_requests");
  EXPECT_EQ(o.http_status, 503);
  EXPECT_EQ(o.type, "overloaded");
  EXPECT_EQ(o.code, "max_queued_requests");
  ApiError m = ModelNotFoundError("gpt-9");
  EXPECT_EQ(m.http_status, 404);
  EXPECT_EQ(m.message, "The model `gpt-9` does not exist.");
  EXPECT_EQ(m.code, "model_not_found");
  EXPECT_EQ(ApiErrorFromStatus(InvalidArgument("bad")).http_status, 400);
  EXPECT_EQ(ApiErrorFromStatus(NotFound("x")).http_status, 404);
  EXPECT_EQ(ApiErrorFromStatus(Unavailable("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(Unavailable("x")).type, "overloaded");
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhausted("x")).http_status, 503);
  EXPECT_EQ(ApiErrorFromStatus(Internal("x")).http_status, 500);
  EXPECT_EQ(ApiErrorFromStatus(Internal("x")).type, "server_error");
  EXPECT_EQ(ApiErrorFromStatus(Unimplemented("x")).http_status, 501);
  EXPECT_EQ(ApiErrorFromStatus(Aborted("x")).http_status, 499);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(PromptLogprobs, ParsedWhenTheEngineComputesThem) {
  ProtocolLimits limits;
  limits.prompt_logprobs_supported = true;
  auto c = ParseCompletionRequest(R"({"prompt": "a", "prompt_logprobs": 3})", limits);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c.value().prompt_logprobs, 3);
  auto chat = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 0})", limits);
  ASSERT_TRUE(chat.ok()) << chat.error().message;
  EXPECT_EQ(chat.value().prompt_logprobs, 0);
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "a"})", limits).value().prompt_logprobs);

  auto range = ParseCompletionRequest(R"({"prompt": "a", "prompt_logprobs": 21})", limits);
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.error().param, "prompt_logprobs");
  EXPECT_THAT(range.error().message, ::testing::HasSubstr("[0, 20]"));
  auto all = ParseCompletionRequest(R"({"prompt": "a", "prompt_logprobs": -1})", limits);
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.error().param, "prompt_logprobs");
  auto streamed = ParseChatCompletionRequest(
      R"({"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 1, "stream": true})",
      limits);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.error().param, "prompt_logprobs");
  // Completions stream them (with each choice's first chunk).
  EXPECT_TRUE(
      ParseCompletionRequest(R"({"prompt": "a", "prompt_logprobs": 1, "stream": true})", limits)
          .ok());
  // Where the engine does not (a prefill/decode pair): a 400 naming the field.
  auto off = ParseCompletionRequest(R"({"prompt": "a", "prompt_logprobs": 1})");
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.error().param, "prompt_logprobs");
}

TEST(PromptLogprobs, SuffixIsRefusedNamingIt) {
  auto r = ParseCompletionRequest(R"({"prompt": "def f(", "suffix": "  return x"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().param, "suffix");
  EXPECT_THAT(r.error().message, ::testing::HasSubstr("fill-in-the-middle"));
}

}  // namespace
}  // namespace strata
