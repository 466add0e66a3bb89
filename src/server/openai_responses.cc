#include "server/openai_responses.h"

#include <algorithm>
#include <exception>
#include <set>

#include "server/json_body.h"
#include "server/openai_fields.h"

namespace strata {

namespace {

using namespace openai_fields;  // NOLINT: the request readers

// The Responses fields read here; KnownResponsesFields() lists them with the
// pass-through ones.
const std::set<std::string>& OwnKeys() {
  static const std::set<std::string> keys = {"model",
                                             "input",
                                             "instructions",
                                             "max_output_tokens",
                                             "temperature",
                                             "top_p",
                                             "tools",
                                             "tool_choice",
                                             "parallel_tool_calls",
                                             "text",
                                             "reasoning",
                                             "stream",
                                             "stream_options",
                                             "store",
                                             "metadata",
                                             "user",
                                             "include",
                                             "top_logprobs",
                                             "truncation",
                                             "service_tier",
                                             "previous_response_id",
                                             "conversation",
                                             "background",
                                             "prompt",
                                             "max_tool_calls",
                                             "context_management",
                                             "safety_identifier",
                                             "prompt_cache_key",
                                             "prompt_cache_retention"};
  return keys;
}

// Chat fields (vLLM's extensions mostly) a Responses request may send as they
// are; the chat parser checks them.
const std::set<std::string>& PassThroughKeys() {
  static const std::set<std::string> keys = {"top_k",
                                             "min_p",
                                             "repetition_penalty",
                                             "frequency_penalty",
                                             "presence_penalty",
                                             "seed",
                                             "stop",
                                             "stop_token_ids",
                                             "ignore_eos",
                                             "skip_special_tokens",
                                             "include_stop_str_in_output",
                                             "chat_template_kwargs",
                                             "request_id",
                                             "priority",
                                             "logit_bias",
                                             "min_tokens",
                                             "structured_outputs",
                                             "guided_json",
                                             "guided_regex",
                                             "guided_choice",
                                             "guided_grammar",
                                             "cache_salt",
                                             "bad_words",
                                             "allowed_token_ids",
                                             "include_reasoning"};
  return keys;
}

MaybeError NotSupported(const std::string& param, const std::string& what) {
  return InvalidRequestError(param, what +
                                        " is not supported by this server; continue a conversation "
                                        "with previous_response_id, or send all of it in input");
}

// A content part list or string as text: input_text / output_text /
// refusal / reasoning_text parts joined with "\n" (the chat path's join).
MaybeError ContentText(const Json& content, const std::string& param, std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return WrongType(param, "a string or an array of content parts", content);
  out->clear();
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string p = Index(param, j);
    const Json& part = content[j];
    if (!part.is_object()) return WrongType(p, "a content part object", part);
    const Json* type = Get(part, "type");
    if (!type || !type->is_string())
      return InvalidRequestError(p + ".type", p + ".type is required and must be a string");
    const std::string& t = type->get_ref<const std::string&>();
    const char* key = t == "refusal" ? "refusal" : "text";
    if (t != "input_text" && t != "output_text" && t != "refusal" && t != "reasoning_text" &&
        t != "summary_text" && t != "text") {
      return InvalidRequestError(p + ".type", "only text input is supported; " + p + " has type " +
                                                  Shown(*type) +
                                                  " (this server serves a text model)");
    }
    const Json* text = Get(part, key);
    if (!text || !text->is_string())
      return InvalidRequestError(p + "." + key,
                                 p + "." + key + " is required and must be a string");
    if (j > 0) *out += '\n';
    *out += text->get_ref<const std::string&>();
  }
  return std::nullopt;
}

// input -> messages (see the header). params gets each message's origin:
// the first `history` items came from previous_response_id's conversation.
MaybeError InputToMessages(const Json& input, size_t history, Json* messages,
                           std::vector<std::string>* params) {
  if (input.is_string()) {
    messages->push_back(Json{{"role", "user"}, {"content", input}});
    params->push_back("input");
    return std::nullopt;
  }
  if (!input.is_array()) return WrongType("input", "a string or an array of input items", input);
  // The assistant turn being assembled from consecutive reasoning, message
  // and function_call items: its index in *messages, or npos.
  size_t turn = std::string::npos;
  auto assistant_turn = [&](const std::string& p) -> Json& {
    if (turn == std::string::npos) {
      messages->push_back(Json{{"role", "assistant"}, {"content", ""}});
      params->push_back(p);
      turn = messages->size() - 1;
    }
    return (*messages)[turn];
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string p = i < history ? "previous_response_id" : Index("input", i - history);
    const Json& item = input[i];
    if (!item.is_object()) return WrongType(p, "an input item object", item);
    const Json* type = Get(item, "type");
    if (type && !type->is_string()) return WrongType(p + ".type", "a string", *type);
    const std::string t = type ? type->get<std::string>() : "message";
    if (t == "message") {
      const Json* role = Get(item, "role");
      if (!role) return InvalidRequestError(p + ".role", p + ".role is required");
      if (!role->is_string()) return WrongType(p + ".role", "a string", *role);
      const std::string& r = role->get_ref<const std::string&>();
      if (r != "user" && r != "assistant" && r != "system" && r != "developer") {
        return InvalidRequestError(p + ".role", p +
                                                    ".role must be one of user, assistant, system, "
                                                    "developer; got " +
                                                    Shown(*role));
      }
      const Json* content = Get(item, "content");
      if (!content) return InvalidRequestError(p + ".content", p + ".content is required");
      std::string text;
      RETURN_IF_API_ERROR(ContentText(*content, p + ".content", &text));
      if (r == "assistant") {
        Json& m = assistant_turn(p);
        // Text after this turn's calls starts a new turn (as it was said).
        if (m.contains("tool_calls")) {
          turn = std::string::npos;
          assistant_turn(p)["content"] = text;
        } else {
          m["content"] = m["content"].get<std::string>() + text;
        }
      } else {
        turn = std::string::npos;
        messages->push_back(Json{{"role", r}, {"content", text}});
        params->push_back(p);
      }
    } else if (t == "function_call") {
      for (const char* key : {"call_id", "name", "arguments"}) {
        const Json* v = Get(item, key);
        if (!v || !v->is_string())
          return InvalidRequestError(p + "." + key,
                                     p + "." + key + " is required and must be a string");
      }
      // Checked here so that an error names this item, not the turn it joins
      // (the chat parser parses them again, under the server's limits).
      const std::string& args = item["arguments"].get_ref<const std::string&>();
      if (!args.empty()) {
        ApiOr<Json> parsed = ParseJsonBody(args, ProtocolLimits().max_json_depth);
        if (!parsed.ok())
          return InvalidRequestError(
              p + ".arguments", p + ".arguments must be a JSON string: " + parsed.error().message);
      }
      Json& m = assistant_turn(p);
      if (!m.contains("tool_calls")) m["tool_calls"] = Json::array();
      m["tool_calls"].push_back(
          Json{{"id", item["call_id"]},
               {"type", "function"},
               {"function", Json{{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    } else if (t == "function_call_output") {
      const Json* id = Get(item, "call_id");
      if (!id || !id->is_string())
        return InvalidRequestError(p + ".call_id", p + ".call_id is required and must be a string");
      const Json* output = Get(item, "output");
      if (!output) return InvalidRequestError(p + ".output", p + ".output is required");
      std::string text;
      RETURN_IF_API_ERROR(ContentText(*output, p + ".output", &text));
      turn = std::string::npos;
      messages->push_back(Json{{"role", "tool"}, {"tool_call_id", *id}, {"content", text}});
      params->push_back(p);
    } else if (t == "reasoning") {
      std::string text;
      if (const Json* content = Get(item, "content")) {
        RETURN_IF_API_ERROR(ContentText(*content, p + ".content", &text));
      } else if (const Json* summary = Get(item, "summary")) {
        RETURN_IF_API_ERROR(ContentText(*summary, p + ".summary", &text));
      }
      // Reasoning comes before the turn's answer: a turn that already has
      // text or calls is finished.
      if (turn != std::string::npos) {
        const Json& m = (*messages)[turn];
        if (m.contains("tool_calls") || !m["content"].get<std::string>().empty())
          turn = std::string::npos;
      }
      Json& m = assistant_turn(p);
      std::string r = m.value("reasoning_content", std::string()) + text;
      m["reasoning_content"] = r;
    } else if (t == "item_reference") {
      // ParseResponsesRequest resolves references against the store first.
      return InvalidRequestError(p, p + " (an item_reference) needs the response store");
    } else {
      return InvalidRequestError(p + ".type", p + ".type " + Shown(*type) +
                                                  " is not supported: this server takes message, "
                                                  "function_call, function_call_output and "
                                                  "reasoning items (it runs no built-in tools)");
    }
  }
  if (messages->empty()) return InvalidRequestError("input", "input must not be empty");
  return std::nullopt;
}

// tools (the flat Responses shape) -> chat tools; *echo gets them as the
// response object repeats them.
MaybeError ToolsToChat(const Json& tools, Json* out, Json* echo) {
  if (!tools.is_array()) return WrongType("tools", "an array of tools", tools);
  *out = Json::array();
  *echo = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = Index("tools", i);
    const Json& t = tools[i];
    if (!t.is_object()) return WrongType(p, "an object", t);
    const Json* type = Get(t, "type");
    if (!type || !type->is_string())
      return InvalidRequestError(p + ".type", p + ".type is required and must be a string");
    if (*type != "function") {
      return InvalidRequestError(
          p + ".type", p + ".type " + Shown(*type) +
                           " is a built-in tool, which this server does not run; declare it as a "
                           "function tool ({\"type\": \"function\", \"name\", \"parameters\"}) and "
                           "run it in your client");
    }
    const Json* name = Get(t, "name");
    if (!name || !name->is_string())
      return InvalidRequestError(p + ".name", p + ".name is required and must be a string");
    Json fn = Json::object();
    fn["name"] = *name;
    Json e = Json{{"type", "function"}, {"name", *name}};
    if (const Json* d = Get(t, "description")) {
      if (!d->is_string()) return WrongType(p + ".description", "a string", *d);
      fn["description"] = *d;
    }
    e["description"] = t.contains("description") ? t["description"] : Json(nullptr);
    if (const Json* params = Get(t, "parameters")) {
      if (!params->is_object()) return WrongType(p + ".parameters", "an object", *params);
      fn["parameters"] = *params;
    }
    e["parameters"] = t.contains("parameters") ? t["parameters"] : Json(nullptr);
    if (const Json* strict = Get(t, "strict")) {
      if (!strict->is_boolean()) return WrongType(p + ".strict", "a boolean", *strict);
      fn["strict"] = *strict;
    }
    e["strict"] = t.contains("strict") ? t["strict"] : Json(true);  // OpenAI's default
    out->push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
    echo->push_back(std::move(e));
  }
  return std::nullopt;
}

MaybeError ToolChoiceToChat(const Json& choice, Json* out) {
  if (choice.is_string()) {
    *out = choice;  // "auto" / "none" / "required": the chat parser decides
    return std::nullopt;
  }
  if (!choice.is_object()) return WrongType("tool_choice", "a string or an object", choice);
  const Json* type = Get(choice, "type");
  if (type && *type == "function") {
    const Json* name = Get(choice, "name");
    if (!name || !name->is_string())
      return InvalidRequestError("tool_choice.name",
                                 "tool_choice.name is required and must be a string");
    *out = Json{{"type", "function"}, {"function", Json{{"name", *name}}}};
    return std::nullopt;
  }
  return InvalidRequestError(
      "tool_choice",
      "tool_choice " + Shown(choice) +
          " is not supported: use \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
          "\"name\": ...} (this server runs no built-in tools)");
}

// text.format -> response_format (the chat endpoint's shape).
MaybeError TextFormatToChat(const Json& format, Json* out) {
  if (!format.is_object()) return WrongType("text.format", "an object", format);
  const Json* type = Get(format, "type");
  if (!type || !type->is_string())
    return InvalidRequestError("text.format.type",
                               "text.format.type is required and must be a string");
  if (*type != "json_schema") {  // text, json_object, or what the chat parser refuses
    *out = Json{{"type", *type}};
    return std::nullopt;
  }
  Json schema = Json::object();
  for (const char* key : {"name", "description", "schema", "strict"})
    if (format.contains(key)) schema[key] = format[key];
  *out = Json{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return std::nullopt;
}

// The chat parser's param for a field this file renamed, back to the
// Responses name: "max_completion_tokens" -> "max_output_tokens",
// "response_format.json_schema.schema" -> "text.format.schema",
// "tools[2].function.parameters" -> "tools[2].parameters",
// "messages[3].content" -> the item it came from.
std::string ResponsesParam(const std::string& param, const std::vector<std::string>& messages) {
  auto rest_after = [&](std::string_view prefix, std::string* rest) {
    if (!param.starts_with(prefix)) return false;
    *rest = param.substr(prefix.size());
    return true;
  };
  std::string rest;
  if (param == "max_completion_tokens" || param == "max_tokens") return "max_output_tokens";
  if (rest_after("response_format.json_schema", &rest)) return "text.format" + rest;
  if (rest_after("response_format", &rest)) return "text.format" + rest;
  if (param == "reasoning_effort") return "reasoning.effort";
  if (param == "logprobs") return "top_logprobs";
  if (param.starts_with("tools[")) {
    size_t close = param.find(']');
    std::string head = param.substr(0, close + 1);
    std::string tail = param.substr(close + 1);
    if (tail.starts_with(".function")) tail = tail.substr(9);
    return head + tail;
  }
  if (param.starts_with("tool_choice.function")) return "tool_choice" + param.substr(20);
  if (param.starts_with("messages[")) {
    size_t close = param.find(']');
    size_t i = std::stoul(param.substr(9, close - 9));
    std::string tail = param.substr(close + 1);
    if (i < messages.size()) {
      // A field the item itself has keeps its name; tool_calls were made of
      // function_call items, which only the item names.
      if (tail.starts_with(".tool_calls")) tail.clear();
      return messages[i] + tail;
    }
    return "input";
  }
  if (param == "messages") return "input";
  return param;
}

ApiError ToResponsesError(ApiError e, const std::vector<std::string>& messages) {
  const std::string old_param = e.param;
  e.param = ResponsesParam(e.param, messages);
  if (old_param != e.param && !old_param.empty()) {
    // The message names the field too: name it the client's way.
    for (size_t at = e.message.find(old_param); at != std::string::npos;
         at = e.message.find(old_param, at + e.param.size()))
      e.message.replace(at, old_param.size(), e.param);
  }
  return e;
}

Json DefaultedEcho(const Json& body, const ChatCompletionRequest& chat, const Json& tools_echo,
                   bool stored) {
  Json echo = Json::object();
  echo["instructions"] = body.contains("instructions") ? body["instructions"] : Json(nullptr);
  echo["max_output_tokens"] =
      body.contains("max_output_tokens") ? body["max_output_tokens"] : Json(nullptr);
  echo["max_tool_calls"] = nullptr;
  echo["metadata"] =
      body.contains("metadata") && !body["metadata"].is_null() ? body["metadata"] : Json::object();
  echo["parallel_tool_calls"] = chat.parallel_tool_calls;
  echo["previous_response_id"] =
      body.contains("previous_response_id") ? body["previous_response_id"] : Json(nullptr);
  Json reasoning = Json{{"effort", nullptr}, {"summary", nullptr}};
  if (const Json* r = Get(body, "reasoning"); r && r->is_object())
    for (const char* k : {"effort", "summary"})
      if (r->contains(k)) reasoning[k] = (*r)[k];
  echo["reasoning"] = std::move(reasoning);
  echo["service_tier"] = "default";
  echo["store"] = stored;  // false when asked so, or when the server keeps no store
  echo["temperature"] = chat.sampling.temperature;
  Json text = Json{{"format", Json{{"type", "text"}}}};
  if (const Json* t = Get(body, "text"); t && t->is_object()) {
    for (auto it = t->begin(); it != t->end(); ++it) text[it.key()] = it.value();
  }
  echo["text"] = std::move(text);
  echo["tool_choice"] = body.contains("tool_choice") && !body["tool_choice"].is_null()
                            ? body["tool_choice"]
                            : Json("auto");
  echo["tools"] = tools_echo;
  echo["top_logprobs"] = body.contains("top_logprobs") && !body["top_logprobs"].is_null()
                             ? body["top_logprobs"]
                             : Json(0);
  echo["top_p"] = chat.sampling.top_p;
  echo["truncation"] = "disabled";
  echo["user"] = chat.user.empty() ? Json(nullptr) : Json(chat.user);
  return echo;
}

}  // namespace

std::vector<std::string> KnownResponsesFields() {
  std::vector<std::string> keys(OwnKeys().begin(), OwnKeys().end());
  keys.insert(keys.end(), PassThroughKeys().begin(), PassThroughKeys().end());
  std::sort(keys.begin(), keys.end());
  return keys;
}

ApiOr<nlohmann::ordered_json> ResponsesToChatBody(const nlohmann::ordered_json& body,
                                                  std::vector<std::string>* message_params,
                                                  size_t history_items) {
  Json chat = Json::object();
  std::vector<std::string>& params = *message_params;
  params.clear();

  // Asked of state or of tools this server does not have.
  if (Get(body, "previous_response_id"))  // ParseResponsesRequest resolves it first
    return InvalidRequestError("previous_response_id",
                               "previous_response_id needs the response store");
  if (Get(body, "conversation"))
    return *NotSupported("conversation", "conversation (a stored Conversations API object)");
  bool background = false;
  RETURN_IF_API_ERROR(ReadBool(body, "background", &background));
  if (background) return *NotSupported("background", "background (run now, fetch later)");
  if (Get(body, "prompt"))
    return InvalidRequestError("prompt",
                               "prompt (a stored prompt template) is not supported by this server; "
                               "send the instructions and input themselves");
  if (Get(body, "max_tool_calls"))
    return InvalidRequestError("max_tool_calls",
                               "max_tool_calls is not supported by this server; set "
                               "parallel_tool_calls to false for at most one call");
  if (Get(body, "context_management"))
    return InvalidRequestError("context_management",
                               "context_management is not supported by this server");
  std::optional<std::string> truncation;
  RETURN_IF_API_ERROR(ReadString(body, "truncation", &truncation));
  if (truncation && *truncation != "disabled") {
    return InvalidRequestError(
        "truncation",
        "truncation must be \"disabled\" (this server never drops input to fit the "
        "context: a request that does not fit is a 400), got " +
            Shown(body.at("truncation")));
  }
  bool store = true;  // ParseResponsesRequest acts on it
  RETURN_IF_API_ERROR(ReadBool(body, "store", &store));
  for (const char* key : {"safety_identifier", "prompt_cache_key", "prompt_cache_retention"}) {
    std::optional<std::string> s;
    RETURN_IF_API_ERROR(ReadString(body, key, &s));  // hints for OpenAI's own routing and caching
  }
  if (const Json* so = Get(body, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    bool obfuscation = false;  // OpenAI pads deltas against side channels; nothing to pad here
    RETURN_IF_API_ERROR(ReadBool(*so, "include_obfuscation", &obfuscation));
  }

  // Messages: instructions first, then the input.
  Json messages = Json::array();
  if (const Json* ins = Get(body, "instructions")) {
    if (!ins->is_string()) return WrongType("instructions", "a string", *ins);
    messages.push_back(Json{{"role", "system"}, {"content", *ins}});
    params.push_back("instructions");
  }
  const Json* input = Get(body, "input");
  if (!input) return InvalidRequestError("input", "input is required");
  RETURN_IF_API_ERROR(InputToMessages(*input, history_items, &messages, &params));
  chat["messages"] = std::move(messages);

  for (const char* key : {"model", "temperature", "top_p", "stream", "user", "metadata",
                          "parallel_tool_calls", "service_tier"}) {
    if (body.contains(key)) chat[key] = body[key];
  }
  for (const std::string& key : PassThroughKeys())
    if (body.contains(key)) chat[key] = body[key];
  if (body.contains("max_output_tokens")) chat["max_completion_tokens"] = body["max_output_tokens"];

  if (const Json* tools = Get(body, "tools")) {
    Json out, echo;
    RETURN_IF_API_ERROR(ToolsToChat(*tools, &out, &echo));
    if (!out.empty()) chat["tools"] = std::move(out);  // [] means none, as OpenAI takes it
  }
  if (const Json* choice = Get(body, "tool_choice")) {
    Json out;
    RETURN_IF_API_ERROR(ToolChoiceToChat(*choice, &out));
    chat["tool_choice"] = std::move(out);
  }
  if (const Json* text = Get(body, "text")) {
    if (!text->is_object()) return WrongType("text", "an object", *text);
    if (const Json* format = Get(*text, "format")) {
      Json out;
      RETURN_IF_API_ERROR(TextFormatToChat(*format, &out));
      chat["response_format"] = std::move(out);
    }
    std::optional<std::string> verbosity;  // a hint to OpenAI's models; echoed
    RETURN_IF_API_ERROR(ReadString(*text, "verbosity", &verbosity));
  }
  if (const Json* r = Get(body, "reasoning")) {
    if (!r->is_object()) return WrongType("reasoning", "an object", *r);
    if (const Json* effort = Get(*r, "effort")) chat["reasoning_effort"] = *effort;
    // summary: this server returns the reasoning itself (content), not a summary.
    std::optional<std::string> summary;
    RETURN_IF_API_ERROR(ReadString(*r, "summary", &summary));
  }

  // Logprobs: OpenAI returns them when include asks; top_logprobs says how many.
  bool include_logprobs = false;
  if (const Json* inc = Get(body, "include")) {
    if (!inc->is_array()) return WrongType("include", "an array of strings", *inc);
    for (size_t i = 0; i < inc->size(); ++i) {
      const Json& v = (*inc)[i];
      if (!v.is_string()) return WrongType(Index("include", i), "a string", v);
      if (v == "message.output_text.logprobs") include_logprobs = true;
      // reasoning.encrypted_content and the built-in tools' extras: nothing
      // to include (the reasoning is sent in the clear, no tools run here).
    }
  }
  std::optional<int64_t> top;
  RETURN_IF_API_ERROR(ReadInt(body, "top_logprobs", &top));
  if (include_logprobs || (top && *top > 0)) {
    chat["logprobs"] = true;
    if (top) chat["top_logprobs"] = *top;
  } else if (top) {
    chat["top_logprobs"] = *top;  // 0: the chat parser checks the range
  }
  return chat;
}

namespace {

// Why an id is unknown here, for every "not found" of the store.
std::string UnknownHere(const ResponseStore* store) {
  if (!store || !store->enabled())
    return "this server keeps no responses (started with --responses-store-max-items 0 or "
           "--responses-store-max-bytes 0)";
  return "this server does not have it: it was stored with store: false, deleted, evicted "
         "from the response store (bounded by --responses-store-max-items / "
         "--responses-store-max-bytes), made before a restart, or served by another replica "
         "(behind a load balancer, send a conversation's requests to one replica, or send the "
         "whole conversation in input)";
}

ApiError NotFoundHere(int status, std::string param, std::string what, const ResponseStore* store,
                      std::string code = "") {
  ApiError e = InvalidRequestError(std::move(param), what + " not found: " + UnknownHere(store));
  e.http_status = status;
  e.code = std::move(code);
  return e;
}

// A fresh id for an input item, by its type ("msg_", "fc_", "fco_", "rs_").
std::string NewItemId(const Json& item) {
  const std::string t = item.contains("type") && item["type"].is_string()
                            ? item["type"].get<std::string>()
                            : "message";
  return NewResponsesId(t == "function_call"          ? "fc_"
                        : t == "function_call_output" ? "fco_"
                        : t == "reasoning"            ? "rs_"
                                                      : "msg_");
}

// An item_reference: {type: "item_reference", id}, or OpenAI's typeless
// {id} (an item with neither role nor content).
bool IsReference(const Json& item) {
  const Json* type = Get(item, "type");
  if (type) return *type == "item_reference";
  return item.contains("id") && !item.contains("role") && !item.contains("content");
}

// The conversation the model sees, as Responses items with no references:
// previous_response_id's stored conversation (its input and output items;
// *history = their count), then this request's input, each item_reference
// replaced by the item it names. A string input becomes one user message item.
MaybeError ResolveInput(const Json& body, ResponseStore* store, Json* items, size_t* history) {
  *items = Json::array();
  *history = 0;
  if (const Json* prev = Get(body, "previous_response_id")) {
    if (!prev->is_string()) return WrongType("previous_response_id", "a string", *prev);
    const std::string& id = prev->get_ref<const std::string&>();
    std::optional<Json> conv = store ? store->Conversation(id) : std::nullopt;
    if (!conv)
      return NotFoundHere(400, "previous_response_id", "previous response with id '" + id + "'",
                          store, "previous_response_not_found");
    *items = std::move(*conv);
    *history = items->size();
  }
  const Json* input = Get(body, "input");
  if (!input) return InvalidRequestError("input", "input is required");
  if (input->is_string()) {
    items->push_back(
        Json{{"id", NewResponsesId("msg_")},
             {"type", "message"},
             {"role", "user"},
             {"content", Json::array({Json{{"type", "input_text"}, {"text", *input}}})}});
    return std::nullopt;
  }
  if (!input->is_array()) return WrongType("input", "a string or an array of input items", *input);
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& item = (*input)[i];
    if (!item.is_object() || !IsReference(item)) {
      items->push_back(item);
      // Kept items have ids, as OpenAI's (input_items lists them by id;
      // a later request may refer to them).
      if (item.is_object() && !item.contains("id")) items->back()["id"] = NewItemId(item);
      continue;
    }
    const std::string p = Index("input", i);
    const Json* id = Get(item, "id");
    if (!id || !id->is_string())
      return InvalidRequestError(p + ".id", p + ".id is required and must be a string");
    std::optional<Json> found = store ? store->Item(id->get<std::string>()) : std::nullopt;
    if (!found)
      return NotFoundHere(404, p, p + ": item with id '" + id->get<std::string>() + "'", store);
    items->push_back(std::move(*found));
  }
  return std::nullopt;
}

}  // namespace

ApiOr<ResponsesRequest> ParseResponsesRequest(std::string_view body, const ProtocolLimits& limits,
                                              ResponseStore* store) {
  try {
    ApiOr<Json> json = ParseJsonBody(body, limits.max_json_depth);
    if (!json.ok()) return json.error();
    const Json& j = json.value();
    if (!j.is_object())
      return InvalidRequestError("", "the request body must be a JSON object, got " + TypeName(j));
    bool store_asked = true;  // OpenAI's default
    RETURN_IF_API_ERROR(ReadBool(j, "store", &store_asked));
    ResponsesRequest out;
    size_t history = 0;
    RETURN_IF_API_ERROR(ResolveInput(j, store, &out.input_items, &history));
    // What the chat path runs: the resolved conversation as the input (a
    // string input as it came, so its errors name "input").
    Json resolved = j;
    resolved.erase("previous_response_id");
    if (history > 0 || !j["input"].is_string()) resolved["input"] = out.input_items;
    std::vector<std::string> params;
    ApiOr<Json> chat_body = ResponsesToChatBody(resolved, &params, history);
    if (!chat_body.ok()) return chat_body.error();
    ApiOr<ChatCompletionRequest> chat =
        ParseChatCompletionRequest(DumpJson(chat_body.value()), limits);
    if (!chat.ok()) return ToResponsesError(chat.error(), params);
    out.chat = std::move(chat).value();
    out.chat.ignored_fields.clear();
    out.store = store_asked && store && store->enabled();
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!OwnKeys().count(it.key()) && !PassThroughKeys().count(it.key()))
        out.ignored_fields.push_back(it.key());
    std::sort(out.ignored_fields.begin(), out.ignored_fields.end());
    Json tools_echo = Json::array();
    if (const Json* tools = Get(j, "tools")) {
      Json unused;
      ToolsToChat(*tools, &unused, &tools_echo);  // valid: checked above
    }
    out.context.echo = DefaultedEcho(j, out.chat, tools_echo, out.store);
    return out;
  } catch (const std::exception& e) {
    ApiError err;
    err.http_status = 500;
    err.type = "server_error";
    err.message = std::string("internal error while parsing the request: ") + e.what();
    return err;
  }
}

ApiError UnknownResponseError(const std::string& id, const ResponseStore* store) {
  return NotFoundHere(404, "", "response with id '" + id + "'", store);
}

std::string NewResponsesId(std::string_view prefix) { return NewResponseMeta(prefix, "").id; }

namespace {
constexpr size_t kInstanceHex = 16;
bool IsHex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}
}  // namespace

std::string NewStoredResponseId(std::string_view instance_id) {
  if (instance_id.size() != kInstanceHex || !IsHex(instance_id)) return NewResponsesId("resp_");
  return NewResponsesId("resp_" + std::string(instance_id) + "_");
}

std::string_view ResponseIdInstance(std::string_view id) {
  constexpr std::string_view kPrefix = "resp_";
  if (id.size() != kPrefix.size() + kInstanceHex + 1 + 32 ||
      id.substr(0, kPrefix.size()) != kPrefix || id[kPrefix.size() + kInstanceHex] != '_')
    return {};
  const std::string_view inst = id.substr(kPrefix.size(), kInstanceHex);
  if (!IsHex(inst) || !IsHex(id.substr(kPrefix.size() + kInstanceHex + 1))) return {};
  return inst;
}

// ---------------------------------------------------------------------------
// Output

namespace {

Json ResponsesUsageJson(const Usage& usage) {
  return Json{{"input_tokens", usage.prompt_tokens},
              {"input_tokens_details", Json{{"cached_tokens", usage.cached_tokens.value_or(0)}}},
              {"output_tokens", usage.completion_tokens},
              // Reasoning tokens are not counted apart from the rest.
              {"output_tokens_details", Json{{"reasoning_tokens", 0}}},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

// OpenAI's output_text logprobs: ChatLogprobsJson's entries.
Json TextLogprobs(std::span<const GeneratedToken> tokens, const LogprobOptions& options) {
  if (!options.enabled) return Json::array();
  return ChatLogprobsJson(tokens, options)["content"];
}

Json ObjectHead(const ResponsesContext& c, const char* status) {
  Json r = Json::object();
  r["id"] = c.meta.id;
  r["object"] = "response";
  r["created_at"] = c.meta.created;
  r["status"] = status;
  r["background"] = false;
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  r["model"] = c.meta.model;
  r["output"] = Json::array();
  for (auto it = c.echo.begin(); it != c.echo.end(); ++it) r[it.key()] = it.value();
  r["usage"] = nullptr;
  return r;
}

void SetOutcome(Json& r, FinishReason finish, bool made_calls) {
  if (finish == FinishReason::kLength && !made_calls) {
    r["status"] = "incomplete";
    r["incomplete_details"] = Json{{"reason", "max_output_tokens"}};
  } else {
    r["status"] = "completed";
  }
}

const char* ItemStatus(FinishReason finish, bool made_calls) {
  return finish == FinishReason::kLength && !made_calls ? "incomplete" : "completed";
}

Json ReasoningItem(const std::string& id, const std::string& text, const char* status) {
  return Json{{"id", id},
              {"type", "reasoning"},
              {"summary", Json::array()},
              {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", text}}})},
              {"encrypted_content", nullptr},
              {"status", status}};
}

Json TextPart(const std::string& text, Json logprobs) {
  return Json{{"type", "output_text"},
              {"text", text},
              {"annotations", Json::array()},
              {"logprobs", std::move(logprobs)}};
}

Json MessageItem(const std::string& id, Json content, const char* status) {
  return Json{{"id", id},
              {"type", "message"},
              {"status", status},
              {"role", "assistant"},
              {"content", std::move(content)}};
}

Json CallItem(const std::string& id, const ToolCall& call, const char* status) {
  return Json{{"id", id},           {"type", "function_call"},
              {"status", status},   {"arguments", call.arguments},
              {"call_id", call.id}, {"name", call.name}};
}

}  // namespace

nlohmann::ordered_json ResponseObjectJson(const ResponsesContext& context,
                                          const ChoiceOutput& output, const Usage& usage) {
  Json r = ObjectHead(context, "completed");
  const bool made_calls = !output.tool_calls.empty();
  SetOutcome(r, output.finish_reason, made_calls);
  const char* status = ItemStatus(output.finish_reason, made_calls);
  Json& items = r["output"];
  if (output.reasoning_content)
    items.push_back(ReasoningItem(NewResponsesId("rs_"), *output.reasoning_content, status));
  // A message item unless the output was calls only (OpenAI sends none then).
  if (!output.text.empty() || !made_calls) {
    items.push_back(MessageItem(
        NewResponsesId("msg_"),
        Json::array({TextPart(output.text, TextLogprobs(output.tokens, context.logprobs))}),
        status));
  }
  for (const ToolCall& call : output.tool_calls)
    items.push_back(CallItem(NewResponsesId("fc_"), call, "completed"));
  r["usage"] = ResponsesUsageJson(usage);
  return r;
}

ResponsesStreamEncoder::ResponsesStreamEncoder(ResponsesContext context)
    : context_(std::move(context)) {}

std::string ResponsesStreamEncoder::Event(Json event) {
  const std::string type = event["type"].get<std::string>();
  event["sequence_number"] = sequence_++;
  return "event: " + type + "\ndata: " + DumpJson(event) + "\n\n";
}

Json ResponsesStreamEncoder::Snapshot(const char* status, const Usage* usage) const {
  Json r = ObjectHead(context_, status);
  for (const Json& item : items_) r["output"].push_back(item);
  if (usage) r["usage"] = ResponsesUsageJson(*usage);
  return r;
}

// The opening events come first whichever call comes first (the server
// builds a step's deltas before it knows it sends the headers).
std::string ResponsesStreamEncoder::Start() {
  if (started_) return "";
  started_ = true;
  std::string out =
      Event(Json{{"type", "response.created"}, {"response", Snapshot("in_progress", nullptr)}});
  out +=
      Event(Json{{"type", "response.in_progress"}, {"response", Snapshot("in_progress", nullptr)}});
  return out;
}

std::string ResponsesStreamEncoder::OpenItem(Open kind) {
  if (open_ == kind) return "";
  std::string out = CloseOpenItem();
  open_ = kind;
  open_text_.clear();
  open_logprobs_ = Json::array();
  const size_t index = items_.size();
  Json part;
  if (kind == Open::kReasoning) {
    open_item_ = ReasoningItem(NewResponsesId("rs_"), "", "in_progress");
    open_item_["content"] = Json::array();
    part = Json{{"type", "reasoning_text"}, {"text", ""}};
  } else {
    open_item_ = MessageItem(NewResponsesId("msg_"), Json::array(), "in_progress");
    part = TextPart("", Json::array());
  }
  out += Event(
      Json{{"type", "response.output_item.added"}, {"output_index", index}, {"item", open_item_}});
  out += Event(Json{{"type", "response.content_part.added"},
                    {"item_id", open_item_["id"]},
                    {"output_index", index},
                    {"content_index", 0},
                    {"part", std::move(part)}});
  return out;
}

std::string ResponsesStreamEncoder::CloseOpenItem() {
  if (open_ == Open::kNone) return "";
  const size_t index = items_.size();
  const Json id = open_item_["id"];
  const char* status = ItemStatus(finish_, made_tool_calls_);
  std::string out;
  Json part;
  if (open_ == Open::kReasoning) {
    out += Event(Json{{"type", "response.reasoning_text.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"text", open_text_}});
    part = Json{{"type", "reasoning_text"}, {"text", open_text_}};
  } else {
    // Tokens whose text never reached this part (held, or reasoning) still
    // count: their logprobs close the part.
    for (Json& e : TextLogprobs(pending_tokens_, context_.logprobs)) open_logprobs_.push_back(e);
    pending_tokens_.clear();
    out += Event(Json{{"type", "response.output_text.done"},
                      {"item_id", id},
                      {"output_index", index},
                      {"content_index", 0},
                      {"text", open_text_},
                      {"logprobs", open_logprobs_}});
    part = TextPart(open_text_, open_logprobs_);
  }
  out += Event(Json{{"type", "response.content_part.done"},
                    {"item_id", id},
                    {"output_index", index},
                    {"content_index", 0},
                    {"part", part}});
  open_item_["status"] = status;
  open_item_["content"] = Json::array({std::move(part)});
  out += Event(
      Json{{"type", "response.output_item.done"}, {"output_index", index}, {"item", open_item_}});
  items_.push_back(std::move(open_item_));
  open_ = Open::kNone;
  return out;
}

std::string ResponsesStreamEncoder::Delta(const StreamDelta& delta) {
  std::string out = Start();
  if (delta.finish_reason != FinishReason::kNone) {
    finish_ = delta.finish_reason;
    made_tool_calls_ = delta.made_tool_calls;
  }
  if (context_.logprobs.enabled)
    pending_tokens_.insert(pending_tokens_.end(), delta.tokens.begin(), delta.tokens.end());
  if (delta.reasoning_content && !delta.reasoning_content->empty()) {
    out += OpenItem(Open::kReasoning);
    open_text_ += *delta.reasoning_content;
    out += Event(Json{{"type", "response.reasoning_text.delta"},
                      {"item_id", open_item_["id"]},
                      {"output_index", items_.size()},
                      {"content_index", 0},
                      {"delta", *delta.reasoning_content}});
  }
  if (!delta.text.empty()) {
    out += OpenItem(Open::kMessage);
    open_text_ += delta.text;
    Json lp = TextLogprobs(pending_tokens_, context_.logprobs);
    pending_tokens_.clear();
    for (const Json& e : lp) open_logprobs_.push_back(e);
    out += Event(Json{{"type", "response.output_text.delta"},
                      {"item_id", open_item_["id"]},
                      {"output_index", items_.size()},
                      {"content_index", 0},
                      {"delta", delta.text},
                      {"logprobs", std::move(lp)}});
  }
  for (const ToolCallEvent& e : delta.tool_calls) {
    if (e.kind == ToolCallEvent::Kind::kStart) {
      out += CloseOpenItem();
      if (calls_.size() <= static_cast<size_t>(e.index)) calls_.resize(e.index + 1);
      calls_[e.index].item = items_.size();
      items_.push_back(CallItem(NewResponsesId("fc_"), ToolCall{e.id, e.name, ""}, "in_progress"));
      out += Event(Json{{"type", "response.output_item.added"},
                        {"output_index", items_.size() - 1},
                        {"item", items_.back()}});
      continue;
    }
    if (static_cast<size_t>(e.index) >= calls_.size()) continue;  // no start: never happens
    Call& call = calls_[e.index];
    Json& item = items_[call.item];
    if (e.kind == ToolCallEvent::Kind::kArguments) {
      call.arguments += e.arguments;
      out += Event(Json{{"type", "response.function_call_arguments.delta"},
                        {"item_id", item["id"]},
                        {"output_index", call.item},
                        {"delta", e.arguments}});
    } else {
      item["arguments"] = call.arguments;
      item["status"] = "completed";
      out += Event(Json{{"type", "response.function_call_arguments.done"},
                        {"item_id", item["id"]},
                        {"output_index", call.item},
                        {"name", item["name"]},
                        {"arguments", call.arguments}});
      out += Event(
          Json{{"type", "response.output_item.done"}, {"output_index", call.item}, {"item", item}});
    }
  }
  return out;
}

std::string ResponsesStreamEncoder::Finish(const Usage& usage) {
  // Output that was nothing at all still answers with an (empty) message,
  // as the non-streaming object does.
  std::string out = Start();
  if (items_.empty() && open_ == Open::kNone) out += OpenItem(Open::kMessage);
  out += CloseOpenItem();
  Json r = Snapshot("completed", &usage);
  SetOutcome(r, finish_, made_tool_calls_);
  const bool incomplete = r["status"] == "incomplete";
  final_ = r;
  out += Event(Json{{"type", incomplete ? "response.incomplete" : "response.completed"},
                    {"response", std::move(r)}});
  return out;
}

std::string ResponsesStreamEncoder::Error(const ApiError& error, const Usage& usage) {
  std::string out = Start();
  out += Event(Json{{"type", "error"},
                    {"code", error.code.empty() ? Json(nullptr) : Json(error.code)},
                    {"message", error.message},
                    {"param", error.param.empty() ? Json(nullptr) : Json(error.param)}});
  Json r = Snapshot("failed", &usage);
  r["error"] =
      Json{{"code", error.code.empty() ? error.type : error.code}, {"message", error.message}};
  out += Event(Json{{"type", "response.failed"}, {"response", std::move(r)}});
  return out;
}

}  // namespace strata
