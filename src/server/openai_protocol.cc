#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <set>

#include "server/chat_messages.h"
#include "server/json_body.h"
#include "server/openai_fields.h"
#include "server/structured_output.h"

namespace strata {

namespace {

using namespace openai_fields;  // NOLINT: this file is their one user

// Every top-level field the parser knows; anything else lands in
// ignored_fields. Each one is read below with its type checked: implemented,
// accepted where it cannot change this server's output (said where it is
// read), or a 400 naming it. openai_protocol_test holds every name here to a
// wrong-type case (KnownFields.EveryFieldRejectsAWrongType).
const std::set<std::string>& CommonKeys() {
  static const std::set<std::string> keys = {"model",
                                             "n",
                                             "stream",
                                             "stream_options",
                                             "stop",
                                             "stop_token_ids",
                                             "include_stop_str_in_output",
                                             "skip_special_tokens",
                                             "spaces_between_special_tokens",
                                             "return_tokens_as_token_ids",
                                             "add_special_tokens",
                                             "max_tokens",
                                             "temperature",
                                             "top_p",
                                             "top_k",
                                             "min_p",
                                             "frequency_penalty",
                                             "presence_penalty",
                                             "repetition_penalty",
                                             "seed",
                                             "ignore_eos",
                                             "user",
                                             "logprobs",
                                             "logit_bias",
                                             "use_beam_search",
                                             "min_tokens",
                                             "prompt_logprobs",
                                             "bad_words",
                                             "allowed_token_ids",
                                             "structured_outputs",
                                             "guided_json",
                                             "guided_regex",
                                             "guided_choice",
                                             "guided_grammar",
                                             "json_schema",
                                             "grammar",
                                             "logprob_token_ids",
                                             "truncate_prompt_tokens",
                                             "best_of",
                                             "echo",
                                             "response_format",
                                             "request_id",
                                             "priority",
                                             "metadata",
                                             "store",
                                             "service_tier",
                                             "length_penalty",
                                             "cache_salt",
                                             "return_token_ids",
                                             "bootstrap_host",
                                             "bootstrap_port",
                                             "bootstrap_room"};
  return keys;
}

const std::set<std::string>& CompletionKeys() {
  static const std::set<std::string> keys = {"prompt", "suffix", "prompt_embeds"};
  return keys;
}

const std::set<std::string>& ChatKeys() {
  static const std::set<std::string> keys = {"messages",
                                             "max_completion_tokens",
                                             "top_logprobs",
                                             "tools",
                                             "tool_choice",
                                             "parallel_tool_calls",
                                             "chat_template_kwargs",
                                             "add_generation_prompt",
                                             "continue_final_message",
                                             "documents",
                                             "chat_template",
                                             "reasoning_effort",
                                             "include_reasoning",
                                             "modalities",
                                             "functions",
                                             "function_call"};
  return keys;
}

// request_id becomes the response's id; it shows in logs too.
constexpr size_t kMaxRequestIdBytes = 256;

MaybeError Unsupported(const std::string& key, const std::string& why = "") {
  return InvalidRequestError(key, key + " is not supported by this server" + why);
}

// An array whose every element satisfies `is_element` (errors name the
// element: "bad_words[2] must be a string"); *out is nullptr when absent or
// null.
MaybeError ReadArrayOf(const Json& body, const std::string& key, const char* element,
                       bool (*is_element)(const Json&), const Json** out) {
  const Json* v = Get(body, key);
  *out = v;
  if (!v) return std::nullopt;
  if (!v->is_array()) return WrongType(key, std::string("an array of ") + element + "s", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    if (!is_element((*v)[i])) return WrongType(Index(key, i), std::string("a ") + element, (*v)[i]);
  }
  return std::nullopt;
}

bool IsString(const Json& v) { return v.is_string(); }
bool IsTokenId(const Json& v) {
  int64_t id = 0;
  return v.is_number() && ToInt64(v, &id) && id >= 0 && id <= std::numeric_limits<int32_t>::max();
}

// Known fields that would change the output but that Strata does not
// implement: a 400 when set to anything but their default (null/absent,
// or the value that means "off").
MaybeError RejectUnsupported(const Json& body) {
  const Json* list = nullptr;
  RETURN_IF_API_ERROR(ReadArrayOf(body, "bad_words", "string", IsString, &list));
  if (list && !list->empty()) return Unsupported("bad_words");
  for (const char* key : {"allowed_token_ids", "logprob_token_ids"}) {
    RETURN_IF_API_ERROR(ReadArrayOf(body, key, "token id", IsTokenId, &list));
    if (list && !list->empty()) return Unsupported(key);
  }
  // Any value asks for something this server does not do.
  for (const char* key :
       {"truncate_prompt_tokens", "prompt_embeds", "chat_template", "documents"}) {
    if (Get(body, key)) return Unsupported(key);
  }
  bool beam = false;
  RETURN_IF_API_ERROR(ReadBool(body, "use_beam_search", &beam));
  if (beam) return Unsupported("use_beam_search");
  std::optional<int64_t> i;
  RETURN_IF_API_ERROR(ReadInt(body, "best_of", &i));
  if (i) {
    std::optional<int64_t> n;
    RETURN_IF_API_ERROR(ReadInt(body, "n", &n));
    if (*i != n.value_or(1)) return Unsupported("best_of", " (best_of must equal n or be omitted)");
  }
  std::optional<std::string> str;
  RETURN_IF_API_ERROR(ReadString(body, "suffix", &str));
  if (str && !str->empty())
    return Unsupported("suffix",
                       " (no fill-in-the-middle: send the text before the insertion point as "
                       "prompt, or use a model whose template writes its FIM tokens)");
  str.reset();
  RETURN_IF_API_ERROR(ReadString(body, "cache_salt", &str));
  if (str)
    return Unsupported("cache_salt",
                       " (its prefix cache is shared by all requests; omit cache_salt)");
  bool store = false;
  RETURN_IF_API_ERROR(ReadBool(body, "store", &store));
  if (store) return Unsupported("store", " (it does not store completions; send false or omit it)");
  return std::nullopt;
}

// Known fields that cannot change what this server returns: type-checked
// and accepted.
MaybeError CheckNoEffectFields(const Json& body) {
  bool b = false;
  // Only the slow (Python) HF tokenizers insert these spaces; the Rust ones
  // this tokenizer follows, like vLLM's fast detokenizer, never do.
  RETURN_IF_API_ERROR(ReadBool(body, "spaces_between_special_tokens", &b));
  // length_penalty weighs beams; use_beam_search is rejected above.
  std::optional<double> d;
  RETURN_IF_API_ERROR(ReadNumber(body, "length_penalty", &d));
  // Labels for stored completions (store is rejected above): OpenAI's shape.
  if (const Json* m = Get(body, "metadata")) {
    if (!m->is_object()) return WrongType("metadata", "an object of strings", *m);
    for (auto it = m->begin(); it != m->end(); ++it) {
      const std::string& k = it.key();
      if (!it->is_string())
        return WrongType("metadata." + (k.size() > 64 ? k.substr(0, 61) + "..." : k), "a string",
                         *it);
    }
  }
  std::optional<int64_t> priority;
  RETURN_IF_API_ERROR(ReadInt(body, "priority", &priority));
  if (priority && *priority != 0) {
    return InvalidRequestError(
        "priority",
        "priority must be 0 (or omitted): this server has no priority scheduling, "
        "got " +
            std::to_string(*priority));
  }
  std::optional<std::string> tier;
  RETURN_IF_API_ERROR(ReadString(body, "service_tier", &tier));
  if (tier && *tier != "auto" && *tier != "default") {
    return InvalidRequestError("service_tier",
                               "service_tier must be \"auto\" or \"default\" (this server has one "
                               "tier), got " +
                                   Shown(body.at("service_tier")));
  }
  return std::nullopt;
}

// The deprecated function-calling fields of the chat API and the output
// modalities.
MaybeError CheckChatOnlyFields(const Json& body) {
  if (Get(body, "functions")) {
    return InvalidRequestError(
        "functions",
        "functions is deprecated and not supported by this server; send them as "
        "tools: [{\"type\": \"function\", \"function\": {...}}]");
  }
  if (Get(body, "function_call")) {
    return InvalidRequestError("function_call",
                               "function_call is deprecated and not supported by this server; use "
                               "tool_choice (\"auto\", \"none\", \"required\" or a named "
                               "function)");
  }
  const Json* modalities = nullptr;
  RETURN_IF_API_ERROR(ReadArrayOf(body, "modalities", "string", IsString, &modalities));
  if (modalities) {
    for (size_t i = 0; i < modalities->size(); ++i) {
      if ((*modalities)[i] != "text") {
        return InvalidRequestError(
            Index("modalities", i),
            "only the \"text\" modality is supported, got " + Shown((*modalities)[i]));
      }
    }
  }
  return std::nullopt;
}

MaybeError ParseStop(const Json& body, const ProtocolLimits& limits,
                     std::vector<std::string>* out) {
  const Json* v = Get(body, "stop");
  if (!v) return std::nullopt;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty())
      return InvalidRequestError("stop", "stop must not be an empty string");
    out->push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > limits.max_stop_strings) {
      return InvalidRequestError("stop",
                                 "stop has " + std::to_string(v->size()) + " strings; at most " +
                                     std::to_string(limits.max_stop_strings) + " are allowed");
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& s = (*v)[i];
      std::string p = Index("stop", i);
      if (!s.is_string()) return WrongType(p, "a string", s);
      if (s.get_ref<const std::string&>().empty())
        return InvalidRequestError(p, p + " must not be empty");
      out->push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or an array of strings", *v);
  }
  for (size_t i = 0; i < out->size(); ++i) {
    if ((*out)[i].size() > limits.max_stop_string_bytes) {
      std::string p = v->is_array() ? Index("stop", i) : "stop";
      return InvalidRequestError(
          p, p + " is " + std::to_string((*out)[i].size()) + " bytes long; at most " +
                 std::to_string(limits.max_stop_string_bytes) + " are allowed");
    }
  }
  return std::nullopt;
}

MaybeError ParseCommon(const Json& body, bool chat, const ProtocolLimits& limits,
                       GenerationFields* out) {
  out->is_chat = chat;
  const std::set<std::string>& own = chat ? ChatKeys() : CompletionKeys();
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (!CommonKeys().count(it.key()) && !own.count(it.key()))
      out->ignored_fields.push_back(it.key());
  }
  std::sort(out->ignored_fields.begin(), out->ignored_fields.end());
  RETURN_IF_API_ERROR(RejectUnsupported(body));
  RETURN_IF_API_ERROR(CheckNoEffectFields(body));
  if (chat) RETURN_IF_API_ERROR(CheckChatOnlyFields(body));

  std::optional<std::string> s;
  RETURN_IF_API_ERROR(ReadString(body, "model", &s));
  if (s) out->model = *s;
  s.reset();
  RETURN_IF_API_ERROR(ReadString(body, "user", &s));
  if (s) out->user = *s;
  s.reset();
  RETURN_IF_API_ERROR(ReadString(body, "request_id", &s));
  if (s) {
    const bool printable =
        std::all_of(s->begin(), s->end(), [](char c) { return c > ' ' && c <= '~'; });
    if (s->empty() || s->size() > kMaxRequestIdBytes || !printable) {
      return InvalidRequestError("request_id",
                                 "request_id must be 1 to " + std::to_string(kMaxRequestIdBytes) +
                                     " printable ASCII characters without spaces, got " +
                                     Shown(body.at("request_id")));
    }
    out->request_id = *s;
  }
  RETURN_IF_API_ERROR(ReadBool(body, "return_token_ids", &out->return_token_ids));
  std::optional<int64_t> prompt_logprobs;
  RETURN_IF_API_ERROR(ReadInt(body, "prompt_logprobs", &prompt_logprobs));
  if (prompt_logprobs) {
    if (!limits.prompt_logprobs_supported)
      return Unsupported("prompt_logprobs", " (it does not compute the prompt's logprobs)");
    if (*prompt_logprobs < 0 || *prompt_logprobs > limits.max_logprobs)
      return InvalidRequestError("prompt_logprobs", "prompt_logprobs must be in [0, " +
                                                        std::to_string(limits.max_logprobs) +
                                                        "], got " +
                                                        std::to_string(*prompt_logprobs));
    if (chat && Get(body, "stream") && body.at("stream") == true)
      return InvalidRequestError("prompt_logprobs",
                                 "prompt_logprobs is returned by chat completions only without "
                                 "stream; drop one of them");
    out->prompt_logprobs = static_cast<int>(*prompt_logprobs);
  }

  // PD disaggregation: the router adds all three (SGLang's names).
  {
    std::optional<std::string> host;
    std::optional<int64_t> port, room;
    RETURN_IF_API_ERROR(ReadString(body, "bootstrap_host", &host));
    RETURN_IF_API_ERROR(ReadInt(body, "bootstrap_port", &port));
    RETURN_IF_API_ERROR(ReadInt(body, "bootstrap_room", &room));
    if (host || port || room) {
      if (!host || !port || !room)
        return InvalidRequestError(
            !host   ? "bootstrap_host"
            : !port ? "bootstrap_port"
                    : "bootstrap_room",
            "bootstrap_host, bootstrap_port and bootstrap_room come together "
            "(the router of a prefill/decode pair sets them)");
      if (host->empty() || host->size() > 255)
        return InvalidRequestError("bootstrap_host",
                                   "bootstrap_host must be a host name or address");
      if (*port < 1 || *port > 65535)
        return InvalidRequestError(
            "bootstrap_port", "bootstrap_port must be in [1, 65535], got " + std::to_string(*port));
      if (*room < 0)
        return InvalidRequestError("bootstrap_room",
                                   "bootstrap_room must be >= 0, got " + std::to_string(*room));
      out->bootstrap =
          BootstrapFields{*host, static_cast<int>(*port), static_cast<uint64_t>(*room)};
    }
  }

  std::optional<int64_t> n;
  RETURN_IF_API_ERROR(ReadInt(body, "n", &n));
  if (n) {
    if (*n < 1 || *n > limits.max_n) {
      return InvalidRequestError(
          "n", "n must be in [1, " + std::to_string(limits.max_n) + "], got " + std::to_string(*n));
    }
    out->n = static_cast<int>(*n);
  }

  RETURN_IF_API_ERROR(ReadBool(body, "stream", &out->stream));
  if (const Json* so = Get(body, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    if (!so->empty() && !out->stream) {
      return InvalidRequestError("stream_options",
                                 "stream_options can only be set when stream is true");
    }
    for (const char* key : {"include_usage", "continuous_usage_stats"}) {
      const Json* f = Get(*so, key);
      if (f && !f->is_boolean())
        return WrongType(std::string("stream_options.") + key, "a boolean", *f);
    }
    ReadBool(*so, "include_usage", &out->stream_options.include_usage);
    ReadBool(*so, "continuous_usage_stats", &out->stream_options.continuous_usage_stats);
  }

  RETURN_IF_API_ERROR(ParseStop(body, limits, &out->stop));
  if (const Json* ids = Get(body, "stop_token_ids")) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of token ids", *ids);
    RETURN_IF_API_ERROR(
        ReadTokenIds(*ids, "stop_token_ids", limits, &out->sampling.stop_token_ids));
  }
  RETURN_IF_API_ERROR(
      ReadBool(body, "include_stop_str_in_output", &out->include_stop_str_in_output));
  RETURN_IF_API_ERROR(ReadBool(body, "skip_special_tokens", &out->skip_special_tokens));
  RETURN_IF_API_ERROR(
      ReadBool(body, "return_tokens_as_token_ids", &out->return_tokens_as_token_ids));
  out->add_special_tokens = !chat;
  RETURN_IF_API_ERROR(ReadBool(body, "add_special_tokens", &out->add_special_tokens));
  RETURN_IF_API_ERROR(ReadBool(body, "ignore_eos", &out->sampling.ignore_eos));

  SamplingParams& sp = out->sampling;
  RETURN_IF_API_ERROR(ReadRangedFloat(body, "temperature", 0, 2, false, "[0, 2]", &sp.temperature));
  RETURN_IF_API_ERROR(ReadRangedFloat(body, "top_p", 0, 1, true, "(0, 1]", &sp.top_p));
  RETURN_IF_API_ERROR(ReadRangedFloat(body, "min_p", 0, 1, false, "[0, 1]", &sp.min_p));
  RETURN_IF_API_ERROR(
      ReadRangedFloat(body, "frequency_penalty", -2, 2, false, "[-2, 2]", &sp.frequency_penalty));
  RETURN_IF_API_ERROR(
      ReadRangedFloat(body, "presence_penalty", -2, 2, false, "[-2, 2]", &sp.presence_penalty));
  std::optional<double> rep;
  RETURN_IF_API_ERROR(ReadNumber(body, "repetition_penalty", &rep));
  if (rep) {
    if (!(*rep > 0) || *rep > 3.4e38) {
      return InvalidRequestError(
          "repetition_penalty",
          "repetition_penalty must be > 0 (1 is off), got " + Shown(body.at("repetition_penalty")));
    }
    sp.repetition_penalty = static_cast<float>(*rep);
  }
  std::optional<int64_t> top_k;
  RETURN_IF_API_ERROR(ReadInt(body, "top_k", &top_k));
  if (top_k) {
    if (*top_k < -1) {
      return InvalidRequestError(
          "top_k", "top_k must be -1 or 0 (off) or at least 1, got " + std::to_string(*top_k));
    }
    sp.top_k = *top_k == 0
                   ? -1
                   : static_cast<int>(std::min<int64_t>(*top_k, std::numeric_limits<int>::max()));
  }
  // logit_bias: {"token id": bias}, OpenAI's shape and range.
  if (const Json* lb = Get(body, "logit_bias")) {
    if (!lb->is_object())
      return WrongType("logit_bias", "an object mapping token ids to biases", *lb);
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string p = "logit_bias." + it.key().substr(0, 32);
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(it.key(), &used);
        if (used != it.key().size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      const int64_t bound =
          limits.vocab_size > 0 ? limits.vocab_size : std::numeric_limits<int32_t>::max();
      if (id < 0 || id >= bound)
        return InvalidRequestError(p, "logit_bias keys must be token ids in [0, " +
                                          std::to_string(bound) + "), got " +
                                          Shown(Json(it.key())));
      if (!it->is_number()) return WrongType(p, "a number", *it);
      RETURN_IF_API_ERROR(CheckRange(p, it->get<double>(), -100, 100, false, "[-100, 100]", *it));
      sp.logit_bias.emplace_back(static_cast<int32_t>(id), it->get<float>());
    }
  }
  std::optional<int64_t> min_tokens;
  RETURN_IF_API_ERROR(ReadInt(body, "min_tokens", &min_tokens));
  if (min_tokens) {
    if (*min_tokens < 0 || *min_tokens > std::numeric_limits<int32_t>::max())
      return InvalidRequestError("min_tokens", "min_tokens must be in [0, 2147483647], got " +
                                                   std::to_string(*min_tokens));
    sp.min_tokens = static_cast<int>(*min_tokens);
  }
  {
    auto so = ParseStructuredOutput(body);
    if (!so.ok()) return so.error();
    out->structured = std::move(so.value());
  }
  if (const Json* seed = Get(body, "seed")) {
    int64_t v = 0;
    if (!seed->is_number() || !ToInt64(*seed, &v)) {
      if (seed->is_number()) {
        return InvalidRequestError(
            "seed", "seed must be an integer in [-2^63, 2^63 - 1], got " + Shown(*seed));
      }
      return WrongType("seed", "an integer", *seed);
    }
    if (v != -1) sp.seed = static_cast<uint64_t>(v);  // -1: no seed (vLLM)
  }
  return std::nullopt;
}

// max_tokens-like field: an integer in [min, INT32_MAX].
MaybeError ReadMaxTokens(const Json& body, const std::string& key, int64_t min,
                         std::optional<int64_t>* out) {
  RETURN_IF_API_ERROR(ReadInt(body, key, out));
  if (*out && (**out < min || **out > std::numeric_limits<int32_t>::max())) {
    std::string range = "[" + std::to_string(min) + ", 2147483647]";
    return InvalidRequestError(key,
                               key + " must be in " + range + ", got " + std::to_string(**out));
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// /v1/completions

MaybeError ParsePrompt(const Json& body, const ProtocolLimits& limits,
                       std::vector<PromptInput>* out) {
  const Json* p = Get(body, "prompt");
  if (!p) return InvalidRequestError("prompt", "prompt is required");
  const char* kShapes =
      "a string, an array of strings, an array of token ids or an array of arrays of token ids";
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty())
      return InvalidRequestError("prompt", "prompt must not be empty");
    out->push_back({false, p->get<std::string>(), {}});
    return std::nullopt;
  }
  if (!p->is_array()) return WrongType("prompt", kShapes, *p);
  if (p->empty()) return InvalidRequestError("prompt", "prompt must not be an empty array");
  const Json& first = (*p)[0];
  if (first.is_number()) {  // one prompt of token ids
    PromptInput in;
    in.is_tokens = true;
    RETURN_IF_API_ERROR(ReadTokenIds(*p, "prompt", limits, &in.token_ids));
    out->push_back(std::move(in));
    return std::nullopt;
  }
  if (p->size() > limits.max_prompts) {
    return InvalidRequestError("prompt",
                               "prompt has " + std::to_string(p->size()) + " prompts; at most " +
                                   std::to_string(limits.max_prompts) + " are allowed per request");
  }
  const bool strings = first.is_string();
  for (size_t i = 0; i < p->size(); ++i) {
    const Json& e = (*p)[i];
    std::string param = Index("prompt", i);
    if (strings) {
      if (!e.is_string()) return WrongType(param, "a string like the other prompts", e);
      if (e.get_ref<const std::string&>().empty())
        return InvalidRequestError(param, param + " must not be empty");
      out->push_back({false, e.get<std::string>(), {}});
    } else {
      if (!e.is_array()) return WrongType(i == 0 ? "prompt" : param, kShapes, i == 0 ? *p : e);
      if (e.empty()) return InvalidRequestError(param, param + " must not be an empty array");
      PromptInput in;
      in.is_tokens = true;
      RETURN_IF_API_ERROR(ReadTokenIds(e, param, limits, &in.token_ids));
      out->push_back(std::move(in));
    }
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// /v1/chat/completions

MaybeError ParseTools(const Json& body, ChatCompletionRequest* out) {
  if (const Json* tools = Get(body, "tools")) {
    if (!tools->is_array()) return WrongType("tools", "an array", *tools);
    if (tools->empty()) {
      return InvalidRequestError(
          "tools", "tools must not be an empty array; omit it when there are no tools");
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string p = Index("tools", i);
      const Json& t = (*tools)[i];
      if (!t.is_object()) return WrongType(p, "an object", t);
      if (const Json* type = Get(t, "type"); type && *type != "function") {
        return InvalidRequestError(p + ".type",
                                   p + ".type must be \"function\", got " + Shown(*type));
      }
      const Json* fn = Get(t, "function");
      if (!fn || !fn->is_object())
        return InvalidRequestError(p + ".function", p + ".function must be an object");
      const Json* name = Get(*fn, "name");
      if (!name || !name->is_string()) {
        return InvalidRequestError(p + ".function.name",
                                   p + ".function.name is required and must be a string");
      }
    }
    out->tools = *tools;
  }
  if (const Json* choice = Get(body, "tool_choice")) {
    const bool has_tools = out->tools.is_array() && !out->tools.empty();
    if (*choice == "none" || *choice == "auto" || *choice == "required") {
      out->tool_choice = choice->get<std::string>();
      if (out->tool_choice == "required" && !has_tools)
        return InvalidRequestError("tool_choice",
                                   "tool_choice \"required\" needs tools to call; send tools");
      return std::nullopt;
    }
    if (choice->is_object()) {
      // {"type": "function", "function": {"name": "f"}}: exactly that call.
      const Json* fn = Get(*choice, "function");
      const Json* name = fn && fn->is_object() ? Get(*fn, "name") : nullptr;
      if (const Json* type = Get(*choice, "type");
          (type && *type != "function") || !name || !name->is_string()) {
        return InvalidRequestError("tool_choice",
                                   "tool_choice must be \"none\", \"auto\", \"required\" or "
                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}, got " +
                                       Shown(*choice));
      }
      const std::string n = name->get<std::string>();
      bool found = false;
      if (has_tools)
        for (const Json& t : out->tools) found = found || t["function"]["name"] == n;
      if (!found)
        return InvalidRequestError("tool_choice.function.name",
                                   "tool_choice names the function " + Shown(*name) +
                                       ", which is not among the request's tools");
      out->tool_choice = "function";
      out->tool_choice_function = n;
      return std::nullopt;
    }
    if (choice->is_string())
      return InvalidRequestError("tool_choice",
                                 "tool_choice must be \"none\", \"auto\", "
                                 "\"required\" or a named function, got " +
                                     Shown(*choice));
    return WrongType("tool_choice", "a string or an object", *choice);
  }
  return std::nullopt;
}

MaybeError ParseChatFields(const Json& body, const ProtocolLimits& limits,
                           ChatCompletionRequest* out) {
  const Json* messages = Get(body, "messages");
  if (!messages) return InvalidRequestError("messages", "messages is required");
  if (!messages->is_array()) return WrongType("messages", "an array of messages", *messages);
  if (messages->empty()) return InvalidRequestError("messages", "messages must not be empty");
  RETURN_IF_API_ERROR(NormalizeMessages(*messages, limits, &out->messages));

  std::optional<int64_t> max_tokens, max_completion_tokens;
  RETURN_IF_API_ERROR(ReadMaxTokens(body, "max_tokens", 1, &max_tokens));
  RETURN_IF_API_ERROR(ReadMaxTokens(body, "max_completion_tokens", 1, &max_completion_tokens));
  out->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (out->max_tokens) out->sampling.max_tokens = static_cast<int>(*out->max_tokens);

  RETURN_IF_API_ERROR(ReadBool(body, "logprobs", &out->logprobs));
  std::optional<int64_t> top;
  RETURN_IF_API_ERROR(ReadInt(body, "top_logprobs", &top));
  if (top) {
    if (*top < 0 || *top > limits.max_logprobs) {
      return InvalidRequestError("top_logprobs", "top_logprobs must be in [0, " +
                                                     std::to_string(limits.max_logprobs) +
                                                     "], got " + std::to_string(*top));
    }
    if (*top > 0 && !out->logprobs) {
      return InvalidRequestError("top_logprobs", "top_logprobs requires logprobs to be true");
    }
    out->top_logprobs = static_cast<int>(*top);
  }
  out->sampling.logprobs = out->logprobs ? out->top_logprobs : -1;

  RETURN_IF_API_ERROR(ParseTools(body, out));
  RETURN_IF_API_ERROR(ReadBool(body, "parallel_tool_calls", &out->parallel_tool_calls));
  RETURN_IF_API_ERROR(ReadBool(body, "include_reasoning", &out->include_reasoning));
  if (const Json* kwargs = Get(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (kwargs->contains(reserved)) {
        std::string p = std::string("chat_template_kwargs.") + reserved;
        return InvalidRequestError(
            p, p + " may not be set here; use the request's own " + reserved + " field");
      }
    }
    out->chat_template_kwargs = *kwargs;
    if (const Json* thinking = Get(*kwargs, "enable_thinking")) {
      if (!thinking->is_boolean() && !thinking->is_null())
        return WrongType("chat_template_kwargs.enable_thinking", "a boolean", *thinking);
      if (thinking->is_boolean()) out->enable_thinking = thinking->get<bool>();
    }
  }
  std::optional<std::string> effort;
  RETURN_IF_API_ERROR(ReadString(body, "reasoning_effort", &effort));
  if (effort) {
    static const std::set<std::string> kEfforts = {"none", "minimal", "low", "medium", "high"};
    if (!kEfforts.count(*effort)) {
      return InvalidRequestError("reasoning_effort",
                                 "reasoning_effort must be one of none, minimal, low, medium, "
                                 "high; got " +
                                     Shown(body.at("reasoning_effort")));
    }
    // A template variable, read by the templates that support it (gpt-oss's);
    // chat_template_kwargs.reasoning_effort, when sent, wins.
    if (!out->chat_template_kwargs.contains("reasoning_effort"))
      out->chat_template_kwargs["reasoning_effort"] = *effort;
  }
  bool echo = false;
  RETURN_IF_API_ERROR(ReadBool(body, "echo", &echo));
  if (echo) return InvalidRequestError("echo", "echo is not supported for chat completions");

  const bool generation_prompt_set = Get(body, "add_generation_prompt") != nullptr;
  RETURN_IF_API_ERROR(ReadBool(body, "add_generation_prompt", &out->add_generation_prompt));
  RETURN_IF_API_ERROR(ReadBool(body, "continue_final_message", &out->continue_final_message));
  if (out->continue_final_message) {
    if (generation_prompt_set && out->add_generation_prompt) {
      return InvalidRequestError(
          "continue_final_message",
          "continue_final_message and add_generation_prompt cannot both be true");
    }
    out->add_generation_prompt = false;
    const Json& last = out->messages.back();
    if (last["content"].get_ref<const std::string&>().empty()) {
      return InvalidRequestError(
          Index("messages", out->messages.size() - 1) + ".content",
          "continue_final_message needs a final message with non-empty text content");
    }
  }
  if (!out->add_generation_prompt)
    out->response_role = out->messages.back()["role"].get<std::string>();
  return std::nullopt;
}

template <typename Request, typename Fn>
ApiOr<Request> ParseGuarded(std::string_view body, const ProtocolLimits& limits, Fn&& fill) {
  // Nothing below should throw; this keeps a bug from escaping the module
  // as an exception (the fuzz target treats a 500 from here as a failure).
  try {
    ApiOr<Json> json = ParseJsonBody(body, limits.max_json_depth);
    if (!json.ok()) return json.error();
    if (!json.value().is_object()) {
      return InvalidRequestError(
          "", "the request body must be a JSON object, got " + TypeName(json.value()));
    }
    Request req;
    if (MaybeError e = fill(json.value(), &req)) return std::move(*e);
    return req;
  } catch (const std::exception& e) {
    ApiError err;
    err.http_status = 500;
    err.type = "server_error";
    err.message = std::string("internal error while parsing the request: ") + e.what();
    return err;
  }
}

}  // namespace

ApiOr<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                const ProtocolLimits& limits) {
  return ParseGuarded<CompletionRequest>(
      body, limits, [&](const Json& j, CompletionRequest* req) -> MaybeError {
        RETURN_IF_API_ERROR(ParseCommon(j, /*chat=*/false, limits, req));
        RETURN_IF_API_ERROR(ParsePrompt(j, limits, &req->prompts));
        RETURN_IF_API_ERROR(ReadBool(j, "echo", &req->echo));
        std::optional<int64_t> logprobs;
        RETURN_IF_API_ERROR(ReadInt(j, "logprobs", &logprobs));
        if (logprobs) {
          if (*logprobs < 0 || *logprobs > limits.max_logprobs) {
            return InvalidRequestError("logprobs", "logprobs must be in [0, " +
                                                       std::to_string(limits.max_logprobs) +
                                                       "], got " + std::to_string(*logprobs));
          }
          if (req->echo && !limits.prompt_logprobs_supported) {
            return InvalidRequestError(
                "logprobs",
                "logprobs with echo needs the prompt's logprobs, which this server does not "
                "compute; drop echo or logprobs");
          }
          req->logprobs = static_cast<int>(*logprobs);
          req->sampling.logprobs = *req->logprobs;
        }
        std::optional<int64_t> max_tokens;
        RETURN_IF_API_ERROR(ReadMaxTokens(j, "max_tokens", 0, &max_tokens));
        req->max_tokens = max_tokens.value_or(16);
        if (*req->max_tokens == 0) {
          if (!req->echo) {
            return InvalidRequestError(
                "max_tokens", "max_tokens must be at least 1, got 0 (0 is allowed only with echo)");
          }
          req->echo_only = true;
        }
        req->sampling.max_tokens = static_cast<int>(std::max<int64_t>(*req->max_tokens, 1));
        return std::nullopt;
      });
}

ApiOr<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body,
                                                        const ProtocolLimits& limits) {
  return ParseGuarded<ChatCompletionRequest>(
      body, limits, [&](const Json& j, ChatCompletionRequest* req) -> MaybeError {
        RETURN_IF_API_ERROR(ParseCommon(j, /*chat=*/true, limits, req));
        return ParseChatFields(j, limits, req);
      });
}

std::vector<std::string> KnownRequestFields(bool chat) {
  std::vector<std::string> keys(CommonKeys().begin(), CommonKeys().end());
  const std::set<std::string>& own = chat ? ChatKeys() : CompletionKeys();
  keys.insert(keys.end(), own.begin(), own.end());
  std::sort(keys.begin(), keys.end());
  return keys;
}

ApiOr<int> ResolveMaxTokens(const GenerationFields& request, int64_t prompt_tokens,
                            int64_t context_length) {
  const std::string param = request.is_chat ? "messages" : "prompt";
  const std::string where = request.is_chat ? "in the messages" : "in the prompt";
  auto exceeded = [&](std::string message) {
    ApiError e = InvalidRequestError(param, std::move(message));
    e.code = "context_length_exceeded";
    return e;
  };
  const std::string head =
      "This model's maximum context length is " + std::to_string(context_length) + " tokens. ";
  if (prompt_tokens >= context_length) {
    return exceeded(head + "However, your request has " + std::to_string(prompt_tokens) +
                    " input tokens (" + where +
                    "), which leaves no room for the completion. Please reduce the length of the " +
                    (request.is_chat ? "messages." : "prompt."));
  }
  const int64_t room = context_length - prompt_tokens;
  if (!request.max_tokens)
    return static_cast<int>(std::min<int64_t>(room, std::numeric_limits<int32_t>::max()));
  const int64_t asked = std::max<int64_t>(*request.max_tokens, 1);  // 0: echo only
  if (asked > room) {
    return exceeded(head + "However, you requested " + std::to_string(prompt_tokens + asked) +
                    " tokens (" + std::to_string(prompt_tokens) + " " + where + ", " +
                    std::to_string(asked) +
                    " in the completion). Please reduce the length of the " +
                    (request.is_chat ? "messages" : "prompt") + " or completion.");
  }
  return static_cast<int>(asked);
}

}  // namespace strata
