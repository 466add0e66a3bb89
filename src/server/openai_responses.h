// POST /v1/responses: the OpenAI Responses API for text, as a translation
// onto the chat path. Pure functions and one stream encoder: no transport,
// no engine (openai_server.cc wires them in).
//
// A Responses request becomes the chat-completions body it means
// (ResponsesToChatBody) and is then parsed by ParseChatCompletionRequest, so
// every sampling field, tool, template and constraint rule is the chat
// endpoint's, checked once, in one place:
//   instructions              -> a first "system" message
//   input (string)            -> one "user" message
//   input items               -> messages: {type:"message", role, content}
//                                (input_text / output_text parts joined);
//                                function_call items join the assistant turn's
//                                tool_calls; function_call_output -> a "tool"
//                                message; reasoning items -> the assistant
//                                turn's reasoning_content
//   max_output_tokens         -> max_completion_tokens
//   tools [{type:"function", name, description, parameters, strict}]
//                             -> [{type:"function", function:{...}}]
//   tool_choice {type:"function", name} -> {type:"function", function:{name}}
//   text.format               -> response_format ({type:"json_schema", name,
//                                schema, description, strict} ->
//                                {type:"json_schema", json_schema:{...}}), so
//                                the same constraint request as the chat
//                                endpoint's
//   reasoning.effort          -> reasoning_effort
//   top_logprobs, include ["message.output_text.logprobs"] -> logprobs
//   vLLM's extra sampling fields (top_k, min_p, seed, stop, ...) pass as is.
// Errors name the Responses field ("max_output_tokens", "input[2].content",
// "text.format.schema"), never the chat field it became. The translated body
// is serialised and parsed again by the chat parser: a second linear pass,
// so the parsing guarantee (json_body.h) holds.
//
// Stored state (response_store.h): `store` (default true, as OpenAI's) keeps
// the finished response; `previous_response_id` prepends that response's
// conversation (its input items, then its output items; not its
// instructions, as OpenAI does), and `item_reference` items are replaced by
// the stored items they name, before the translation above. An unknown id
// is an error saying it is unknown to this server: previous_response_id a
// 400 (code previous_response_not_found), an item_reference a 404, both
// OpenAI's. Refused with a 400 naming the field: conversation and background
// (no Conversations objects, no background runs), prompt (stored prompt
// templates), built-in tools (web_search, file_search, ...: this server runs
// no tools) and tool_choice naming one, non-text input parts, truncation
// "auto", max_tool_calls.
//
// Output: reasoning (a --reasoning-parser's split) as a "reasoning" item with
// content [{type:"reasoning_text"}], the text as a "message" item with one
// "output_text" part, each parsed tool call as a "function_call" item. A
// choice cut by max_output_tokens is status "incomplete" with
// incomplete_details.reason "max_output_tokens".
//
// Thread-safety: functions are reentrant; a ResponsesStreamEncoder belongs to
// one response stream and is used by one thread at a time.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_protocol.h"
#include "server/openai_response.h"
#include "server/response_store.h"

namespace strata {

// What the response object repeats of its request, and how to render it.
struct ResponsesContext {
  ResponseMeta meta;  // id "resp_...", created_at, model
  // The request's own fields as the response object echoes them
  // (instructions, max_output_tokens, temperature, top_p, tools, tool_choice,
  // text, reasoning, parallel_tool_calls, metadata, ...), already defaulted.
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  LogprobOptions logprobs;  // tokenizer set by the server
};

struct ResponsesRequest {
  ChatCompletionRequest chat;               // what the chat path runs
  ResponsesContext context;                 // meta.model/id left to the server
  std::vector<std::string> ignored_fields;  // unknown top-level keys, sorted
  // The conversation the model sees as Responses items, references resolved
  // (previous_response_id's, then this request's input): what the store
  // keeps as this response's input items.
  nlohmann::ordered_json input_items = nlohmann::ordered_json::array();
  bool store = false;  // asked (the default) and the server has a store
};

// The Responses body (a JSON object, no previous_response_id, no
// item_reference: ParseResponsesRequest resolves those) as the
// chat-completions body it means. *message_params gets, per message of the
// result, the Responses field it came from ("instructions", "input",
// "input[3]"), for error messages; the first `history_items` input items
// came from previous_response_id (and are named so).
ApiOr<nlohmann::ordered_json> ResponsesToChatBody(const nlohmann::ordered_json& body,
                                                  std::vector<std::string>* message_params,
                                                  size_t history_items = 0);

// Parses and validates a /v1/responses body, resolving previous_response_id
// and item_reference items against `store` (null: none kept; every such id
// is then unknown).
ApiOr<ResponsesRequest> ParseResponsesRequest(std::string_view body,
                                              const ProtocolLimits& limits = {},
                                              ResponseStore* store = nullptr);

// The 404 for GET / DELETE /v1/responses/{id} of an id `store` does not have.
ApiError UnknownResponseError(const std::string& id, const ResponseStore* store);

// The top-level fields /v1/responses knows, sorted; others are ignored.
std::vector<std::string> KnownResponsesFields();

// Fresh ids: "resp_", "msg_", "fc_", "rs_" + 32 hex digits.
std::string NewResponsesId(std::string_view prefix);

// A response's id names the server whose store keeps it: "resp_" + that
// server's instance id (its /server_info "instance_id", 16 hex digits) +
// "_" + 32 random hex digits. `strata router` sends what refers to a
// response (previous_response_id; GET and DELETE /v1/responses/{id}) to
// the worker of that instance (ResponseIdInstance), since each server's
// store is its own.
std::string NewStoredResponseId(std::string_view instance_id);
// The instance id inside a NewStoredResponseId id; "" for any other text
// (a client-chosen request_id, another server's ids).
std::string_view ResponseIdInstance(std::string_view id);

// The finished response object (non-streaming, and response.completed).
nlohmann::ordered_json ResponseObjectJson(const ResponsesContext& context,
                                          const ChoiceOutput& output, const Usage& usage);

// The SSE events of one streamed response: Start(), Delta() per step of
// the (only) choice, then Finish() -- or Error() in place of Finish(); the
// opening events come with whichever call is first (Start() is then ""). Each
// event is "event: <type>\ndata: <json>\n\n" with a sequence_number from 0
// (OpenAI's framing; there is no "data: [DONE]").
//   response.created, response.in_progress
//   per item: response.output_item.added, (message / reasoning)
//     response.content_part.added, response.output_text.delta* /
//     response.reasoning_text.delta*, response.output_text.done /
//     response.reasoning_text.done, response.content_part.done;
//     (function_call) response.function_call_arguments.delta,
//     response.function_call_arguments.done; response.output_item.done
//   response.completed, or response.incomplete (cut by max_output_tokens)
// Items are opened in the order their output arrives (text after a call
// opens a new message item).
class ResponsesStreamEncoder {
 public:
  explicit ResponsesStreamEncoder(ResponsesContext context);

  std::string Start();
  std::string Delta(const StreamDelta& delta);
  std::string Finish(const Usage& usage);
  // In the middle of a stream: an "error" event, then response.failed.
  std::string Error(const ApiError& error, const Usage& usage);
  // After Finish(): the response object its last event carried (what the
  // store keeps).
  const nlohmann::ordered_json& final_response() const { return final_; }

 private:
  enum class Open { kNone, kReasoning, kMessage };
  std::string Event(nlohmann::ordered_json event);
  std::string CloseOpenItem();
  std::string OpenItem(Open kind);
  nlohmann::ordered_json Snapshot(const char* status, const Usage* usage) const;

  ResponsesContext context_;
  bool started_ = false;  // response.created and response.in_progress sent
  int64_t sequence_ = 0;
  std::vector<nlohmann::ordered_json> items_;  // done items, in output order
  Open open_ = Open::kNone;
  nlohmann::ordered_json open_item_;  // the item being streamed (kReasoning / kMessage)
  std::string open_text_;
  nlohmann::ordered_json open_logprobs_ = nlohmann::ordered_json::array();
  std::vector<GeneratedToken> pending_tokens_;  // logprobs not yet attached to text
  // Function calls by parser index: position in items_ and arguments so far.
  struct Call {
    size_t item = 0;
    std::string arguments;
  };
  std::vector<Call> calls_;
  FinishReason finish_ = FinishReason::kNone;
  bool made_tool_calls_ = false;
  nlohmann::ordered_json final_;
};

}  // namespace strata
