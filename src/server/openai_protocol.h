// OpenAI-compatible request parsing: the bodies of POST /v1/completions and
// POST /v1/chat/completions, turned into validated structs the server hands
// to the engine. Pure functions of the request bytes: no transport, no engine.
//
// Semantics follow the OpenAI API and vLLM's extensions to it (top_k, min_p,
// repetition_penalty, stop_token_ids, ignore_eos, skip_special_tokens,
// include_stop_str_in_output, return_tokens_as_token_ids,
// chat_template_kwargs, add_generation_prompt, continue_final_message, ...),
// with vLLM's ranges: temperature [0, 2], top_p (0, 1], top_k -1, 0 (both
// off) or >= 1, min_p [0, 1], frequency/presence_penalty [-2, 2],
// repetition_penalty > 0, seed any int64 (-1: none), logprobs 0..20.
//
// Every problem is an ApiError naming the offending field in `param` the way
// OpenAI does ("temperature", "messages[1].content", "stop[2]"). A field of
// the wrong JSON type is a 400 for that field; null means "use the default".
// Unknown fields are ignored (clients send extras) and listed in
// ignored_fields so the server can log them. Every known field
// (KnownRequestFields) has its type checked and is one of:
//   - implemented;
//   - accepted because it cannot change this server's output
//     (spaces_between_special_tokens, length_penalty without beam search,
//     metadata, priority 0, service_tier "auto"/"default");
//   - a 400 when set to anything but its default, because it would change
//     the output and is not implemented (suffix, beam search, store true,
//     cache_salt, the deprecated functions/function_call, a modality other
//     than "text", ...).
// Structured outputs (response_format, structured_outputs, guided_*, and
// llama.cpp's json_schema/grammar) are read by server/structured_output.h
// into GenerationFields::structured; the server compiles them.
// Request bodies parse in time linear in their size (json_body.h). Nothing
// here throws.
//
// Thread-safety: all functions are reentrant; results are plain values.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "server/api_error.h"
#include "server/structured_output.h"

namespace strata {

// Server-wide limits the parser enforces.
struct ProtocolLimits {
  int max_n = 128;                  // choices per request
  int max_logprobs = kMaxLogprobs;  // logprobs / top_logprobs at most
  size_t max_stop_strings = 64;     // entries of `stop`
  size_t max_stop_string_bytes = 1024;
  size_t max_prompts = 1024;  // batch of prompts in one completion request
  int64_t vocab_size = 0;     // > 0: token ids must be < vocab_size
  int max_json_depth = 128;   // deeper nesting is a 400 (keeps renderers' recursion bounded)
  // The engine computes prompt logprobs (not on a prefill/decode pair):
  // prompt_logprobs and echo + logprobs on /v1/completions; a 400 otherwise.
  bool prompt_logprobs_supported = false;
};

struct StreamOptions {
  bool include_usage = false;  // a last chunk with usage and no choices
  // vLLM: with include_usage, every chunk's usage is the usage so far
  // (without include_usage it has no effect, as in vLLM).
  bool continuous_usage_stats = false;
};

// Fields both endpoints share.
struct BootstrapFields {
  std::string host;
  int port = 0;
  uint64_t room = 0;  // choice k of the request uses room + k
};

struct GenerationFields {
  bool is_chat = false;
  std::string model;  // "" when absent
  int n = 1;
  bool stream = false;
  StreamOptions stream_options;
  std::vector<std::string> stop;  // non-empty strings
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool return_tokens_as_token_ids = false;
  // Tokenizer post-processing (e.g. BOS) on the prompt text: default true
  // for completions, false for chat (the template writes BOS itself).
  bool add_special_tokens = true;
  // The requested limit on output tokens: completions default 16 (OpenAI,
  // vLLM); chat unset = the rest of the context (max_completion_tokens wins
  // over the deprecated max_tokens). ResolveMaxTokens() turns it into
  // sampling.max_tokens once the prompt length is known.
  std::optional<int64_t> max_tokens;
  // temperature .. seed, stop_token_ids, ignore_eos, logprobs. max_tokens
  // is the requested one (chat without one: a placeholder 16); set it from
  // ResolveMaxTokens() once the prompt is tokenized.
  SamplingParams sampling;
  std::string user;
  // The response's id is "<cmpl-|chatcmpl->" + request_id when sent (vLLM).
  std::optional<std::string> request_id;
  // vLLM: choices carry the prompt's and the output's token ids
  // (prompt_token_ids, token_ids).
  bool return_token_ids = false;
  // vLLM: each prompt token's logprob (after the first) with its rank and
  // the top N, N in [0, max_logprobs]; chat only without stream.
  std::optional<int> prompt_logprobs;
  // Structured output the request asks for (structured_output.h); for a
  // chat request with tool_choice "required" or a named function the server
  // builds one from the tools instead.
  std::optional<StructuredOutput> structured;
  // PD disaggregation (docs/architecture/disagg.md): where the prefill's
  // bootstrap endpoint is and the request's room; all three or none.
  std::optional<BootstrapFields> bootstrap;
  std::vector<std::string> ignored_fields;  // unknown top-level keys, sorted
};

// One prompt of a completion request: text, or token ids as sent.
struct PromptInput {
  bool is_tokens = false;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct CompletionRequest : GenerationFields {
  std::vector<PromptInput> prompts;  // >= 1; choice index = prompt * n + sample
  bool echo = false;
  // echo with max_tokens 0: answer with the prompt alone. sampling stays
  // valid (max_tokens 1, as vLLM does); the server may skip generation.
  bool echo_only = false;
  std::optional<int> logprobs;  // completions' integer logprobs (also in sampling.logprobs)
};

struct ChatCompletionRequest : GenerationFields {
  // Normalized for the chat template: each {"role", "content": string, and
  // when sent "name", "tool_calls" (arguments parsed to objects, as
  // transformers expects), "tool_call_id", "reasoning_content"/"reasoning"}.
  // Text parts of list content are joined with "\n" (vLLM).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null when absent
  // Template variables: the request's chat_template_kwargs, plus
  // reasoning_effort when sent (unless the kwargs set it).
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // "auto" (the default: the model may call a tool, and --tool-call-parser
  // parses its calls when tools are sent), "none" (tools are still
  // rendered, as vLLM does, but the output is not parsed), "required" (at
  // least one call, enforced by constrained decoding in the parser's
  // syntax, arguments valid under the tool's parameters) or "function" (a
  // named function: exactly one call to tool_choice_function).
  std::string tool_choice = "auto";
  std::string tool_choice_function;
  bool parallel_tool_calls = true;  // false: only the first parsed call is returned
  bool include_reasoning = true;  // vLLM: false drops the reasoning a --reasoning-parser splits off
  // chat_template_kwargs.enable_thinking when sent (a boolean): false means
  // no reasoning is expected, so everything is content.
  std::optional<bool> enable_thinking;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool logprobs = false;
  int top_logprobs = 0;
  // The role of the reply: "assistant", or the last message's role when
  // add_generation_prompt is false (vLLM).
  std::string response_role = "assistant";
};

// Parses and validates a request body.
ApiOr<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                const ProtocolLimits& limits = {});
ApiOr<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body,
                                                        const ProtocolLimits& limits = {});

// The top-level fields a request to /v1/chat/completions (chat) or
// /v1/completions knows, sorted; every other field is ignored.
std::vector<std::string> KnownRequestFields(bool chat);

// The output-token limit for one prompt of prompt_tokens tokens in a context
// of context_length tokens: the request's max_tokens, or (chat without one)
// the rest of the context. A 400 with code "context_length_exceeded" (param
// "messages" / "prompt") when the prompt plus max_tokens does not fit, worded
// like OpenAI's. Set sampling.max_tokens to the result.
ApiOr<int> ResolveMaxTokens(const GenerationFields& request, int64_t prompt_tokens,
                            int64_t context_length);

}  // namespace strata
