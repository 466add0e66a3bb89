// OpenAI-compatible responses: the JSON bodies of /v1/completions and
// /v1/chat/completions, their server-sent-event (SSE) stream chunks, and the
// error body, shaped as OpenAI and vLLM send them.
//
// Inputs are plain structs (what the engine produced, already detokenized
// and stop-matched by the caller), so this file knows nothing of the engine
// or the transport. The Tokenizer is used only to spell tokens in logprobs.
//
// Shapes (see the tests for exact goldens):
//   completion  {"id":"cmpl-..","object":"text_completion","created","model",
//                "choices":[{"index","text","logprobs","finish_reason","stop_reason",
//                            "token_ids","prompt_logprobs","prompt_token_ids"}],
//                "usage":{"prompt_tokens","completion_tokens","total_tokens",
//                         "prompt_tokens_details"?:{"cached_tokens"}}}
//   chat        {"id":"chatcmpl-..","object":"chat.completion",...,
//                "choices":[{"index","message":{"role","content","refusal"},
//                            "logprobs","finish_reason","stop_reason","token_ids"}],"usage":{..},
//                "prompt_logprobs","prompt_token_ids"}
//               (vLLM's fields: prompt_logprobs and the token ids are null
//               unless asked: prompt_logprobs is [null, {"<id>": {"logprob",
//               "rank","decoded_token"}, ...}, ...], the prompt's token first,
//               then the top N)
//   chunks      "object":"text_completion" / "chat.completion.chunk"; chat
//               opens each choice with delta {"role","content":""}; with
//               stream_options.include_usage every chunk has "usage": null
//               (with continuous_usage_stats too: the usage so far) and a last
//               chunk has "choices": [] and the usage; then "data: [DONE]".
//   logprobs    completions {"tokens","token_logprobs","top_logprobs":[{text: lp}],
//               "text_offset"} (offsets in code points, as vLLM's Python len());
//               chat {"content":[{"token","logprob","bytes","top_logprobs":[..]}]},
//               "bytes" the token's own bytes (Tokenizer::TokenBytes), which
//               concatenate to the text even across a split character.
//               -inf / NaN logprobs are sent as -9999.0 (OpenAI and vLLM).
//   errors      {"error":{"message","type","param","code"}}.
//
// Thread-safety: functions are reentrant; a StreamEncoder belongs to one
// response stream and is used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/request.h"
#include "engine/sampler.h"
#include "model/tokenizer/tokenizer.h"
#include "server/openai_protocol.h"
#include "server/tool_call_parser.h"

namespace strata {

// Generated tokens are the engine's GeneratedToken (engine/request.h): id,
// plus logprob and top alternatives, read only when logprobs were asked for.

// FinishReason and FinishReasonName: engine/request.h (the wire strings).

// vLLM's stop_reason: the stop string or stop token id that ended a choice;
// none when it ended on EOS, on length, or has not ended.
using StopReason = std::variant<std::monostate, std::string, int32_t>;

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  std::optional<int64_t> cached_tokens;  // prompt tokens served from the prefix cache, when known
};

// Identity shared by every chunk of one response.
struct ResponseMeta {
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

// A fresh id (prefix + 32 random hex digits) and the current time.
ResponseMeta NewResponseMeta(std::string_view prefix, std::string model);

// How tokens appear in logprobs.
struct LogprobOptions {
  bool enabled = false;
  int top = 0;                           // entries of top_logprobs per token
  bool tokens_as_ids = false;            // "token_id:123" instead of the token's text
  const Tokenizer* tokenizer = nullptr;  // REQUIRED when enabled && !tokens_as_ids
};
LogprobOptions LogprobOptionsFor(const CompletionRequest& request, const Tokenizer* tokenizer);
LogprobOptions LogprobOptionsFor(const ChatCompletionRequest& request, const Tokenizer* tokenizer);

// The text a token is shown as: "token_id:<id>" or its decoded text
// (special tokens included).
std::string TokenText(int32_t id, const LogprobOptions& options);

// One choice of a finished (non-streaming) response.
struct ChoiceOutput {
  int index = 0;     // completions: prompt * n + sample (vLLM); chat: sample
  std::string text;  // completions with echo: the prompt text already prepended
  std::optional<std::string> reasoning_content;  // chat only
  // Chat: the calls a --tool-call-parser found. When any, message.tool_calls
  // carries them, content is null when empty, and finish_reason is
  // "tool_calls" (unless the choice was aborted), as vLLM does.
  std::vector<ToolCall> tool_calls;
  std::vector<GeneratedToken> tokens;  // for logprobs (may be empty when not asked)
  FinishReason finish_reason = FinishReason::kStop;
  StopReason stop_reason;
  // Completions with echo: the text_offset of the first entry of `tokens`:
  // the prompt's length in code points when `tokens` holds the output only,
  // 0 when it starts with the prompt's tokens (echo with prompt logprobs).
  int64_t echo_offset = 0;
  // The first this-many entries of `tokens` have no logprob and are sent
  // with null token_logprobs / top_logprobs: with echo and prompt logprobs,
  // 1 (the first prompt token, as vLLM sends it).
  size_t leading_null_logprobs = 0;
  // return_token_ids (vLLM): the prompt's token ids and this choice's output
  // token ids; null in the response when not set. Chat sends the first
  // choice's prompt ids once, at the top level.
  std::optional<std::vector<int32_t>> prompt_token_ids;
  std::optional<std::vector<int32_t>> token_ids;
  // prompt_logprobs (vLLM), already cut to the N asked: prompt tokens 1..;
  // sent with a leading null. Chat sends the first choice's at the top level.
  std::optional<std::vector<PromptLogprob>> prompt_logprobs;
};

nlohmann::ordered_json CompletionResponseJson(const ResponseMeta& meta,
                                              const std::vector<ChoiceOutput>& choices,
                                              const Usage& usage, const LogprobOptions& logprobs);
nlohmann::ordered_json ChatCompletionResponseJson(const ResponseMeta& meta,
                                                  const std::vector<ChoiceOutput>& choices,
                                                  const Usage& usage,
                                                  const LogprobOptions& logprobs,
                                                  std::string_view role = "assistant");

// Logprobs objects on their own (the builders above and StreamEncoder use
// them). text_offset starts at initial_offset code points; the first
// null_logprobs tokens get null logprobs.
nlohmann::ordered_json CompletionLogprobsJson(std::span<const GeneratedToken> tokens,
                                              const LogprobOptions& options, int64_t initial_offset,
                                              size_t null_logprobs = 0);
nlohmann::ordered_json ChatLogprobsJson(std::span<const GeneratedToken> tokens,
                                        const LogprobOptions& options);
// vLLM's prompt_logprobs: [null, one {"<token id>": {"logprob", "rank",
// "decoded_token"}} per prompt token after the first: its own token, then
// its top alternatives]. decoded_token is TokenText.
nlohmann::ordered_json PromptLogprobsJson(std::span<const PromptLogprob> logprobs,
                                          const LogprobOptions& options);

// {"error": {...}} for an ApiError; the HTTP status is error.http_status.
nlohmann::ordered_json ErrorJson(const ApiError& error);

// Serialises without throwing: invalid UTF-8 becomes U+FFFD.
std::string DumpJson(const nlohmann::ordered_json& json);
// "data: <json>\n\n".
std::string SseEvent(const nlohmann::ordered_json& json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// What one streamed step adds to one choice.
struct StreamDelta {
  int index = 0;
  std::string text;  // new text, safe to send (stop strings already removed)
  std::optional<std::string> reasoning_content;  // chat only
  // The tokens this step produced (ids always; logprobs when asked). Counted
  // for continuous usage stats, rendered into logprobs.
  std::vector<GeneratedToken> tokens;
  FinishReason finish_reason = FinishReason::kNone;
  StopReason stop_reason;
  // Chat: tool-call events of this step, each sent as its own chunk after
  // the text: a call's start as {index, id, type, function: {name,
  // arguments: ""}}, its argument fragments as {index, function:
  // {arguments}} (OpenAI's stream shape).
  std::vector<ToolCallEvent> tool_calls;
  // The choice made tool calls: its finish_reason is "tool_calls".
  bool made_tool_calls = false;
  // Completions with echo and logprobs: tokens starts with the prompt's,
  // the first this-many without a logprob (null).
  size_t leading_null_logprobs = 0;
  // Completions: prompt_logprobs, sent with the choice's first chunk.
  std::optional<std::vector<PromptLogprob>> prompt_logprobs;
};

struct StreamSettings {
  int num_choices = 1;             // chat: n; completions: prompts * n
  std::string role = "assistant";  // chat: the role of the reply
  StreamOptions options;
  LogprobOptions logprobs;
  int64_t prompt_tokens = 0;  // for continuous usage stats
  // return_token_ids (vLLM): each chunk's choice carries "token_ids" (the
  // step's tokens), and the prompt's ids come once: chat, at the top level of
  // the first chunk; completions, in each choice's first chunk.
  bool return_token_ids = false;
  std::vector<std::vector<int32_t>> prompt_token_ids;  // by choice index
};

// Builds the SSE events of one streamed response, in order:
// Start(), Delta() per step, then Finish() (or Error() then Finish()).
class StreamEncoder {
 public:
  enum class Kind { kCompletion, kChat };
  StreamEncoder(Kind kind, ResponseMeta meta, StreamSettings settings);

  // Chat: one event per choice with delta {"role", "content": ""}.
  // Completions: "" (there is no opening chunk).
  std::string Start();
  // The event for one step of one choice; "" when there is nothing to send
  // (no text, no logprobs, not finished).
  std::string Delta(const StreamDelta& delta);
  // The usage event (when include_usage) and "data: [DONE]".
  std::string Finish(const Usage& usage);
  // An error in the middle of a stream: "data: {"error": ...}\n\n".
  static std::string Error(const ApiError& error);

  // Output tokens seen so far for one choice.
  int64_t completion_tokens(int index) const;

 private:
  nlohmann::ordered_json Chunk() const;  // id, object, created, model
  bool UsageOnChunks() const;            // every chunk has "usage" (null or continuous stats)
  nlohmann::ordered_json UsageFor(int index) const;
  nlohmann::ordered_json PromptTokenIds(int index) const;

  Kind kind_;
  ResponseMeta meta_;
  StreamSettings settings_;
  std::map<int, int64_t> text_offset_;  // code points sent per choice (completions)
  std::map<int, int64_t> tokens_;       // tokens seen per choice
  std::set<int> prompt_ids_sent_;       // completions: choices whose prompt_token_ids went out
};

// The usage object: {"prompt_tokens","completion_tokens","total_tokens"} and
// "prompt_tokens_details" when cached_tokens is known.
nlohmann::ordered_json UsageJson(const Usage& usage);

// Number of Unicode code points in UTF-8 text (Python's len()).
int64_t CodePointCount(std::string_view utf8);

}  // namespace strata
