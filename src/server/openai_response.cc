#include "server/openai_response.h"

#include <chrono>
#include <cmath>
#include <random>

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

// OpenAI and vLLM send -9999.0 where the logprob is -inf (or not a number).
double ClampLogprob(float lp) {
  if (!std::isfinite(lp) || lp < -9999.f) return -9999.0;
  return static_cast<double>(lp);
}

Json StopReasonJson(const StopReason& reason) {
  if (const auto* s = std::get_if<std::string>(&reason)) return *s;
  if (const auto* id = std::get_if<int32_t>(&reason)) return *id;
  return nullptr;
}

Json FinishReasonJson(FinishReason reason, bool made_tool_calls = false) {
  // vLLM: "tool_calls" whenever calls were parsed, even when cut by length.
  if (made_tool_calls && (reason == FinishReason::kStop || reason == FinishReason::kLength))
    return "tool_calls";
  const char* name = FinishReasonName(reason);
  return name ? Json(name) : Json(nullptr);
}

Json ToolCallJson(const ToolCall& call, int index) {
  return Json{{"id", call.id},
              {"type", "function"},
              {"function", Json{{"name", call.name}, {"arguments", call.arguments}}},
              {"index", index}};
}

// OpenAI's "bytes": the token's own bytes, so that a text's tokens' bytes
// concatenate to the text even where a token ends inside a character (its
// decoded text would be U+FFFD there).
Json Bytes(int32_t id, const std::string& text, const LogprobOptions& options) {
  const std::string raw = options.tokenizer ? options.tokenizer->TokenBytes(id) : text;
  Json bytes = Json::array();
  for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
  return bytes;
}

Json TokenIdsJson(const std::optional<std::vector<int32_t>>& ids) {
  return ids ? Json(*ids) : Json(nullptr);
}

Json TokenIdsOf(std::span<const GeneratedToken> tokens) {
  Json ids = Json::array();
  for (const GeneratedToken& t : tokens) ids.push_back(t.id);
  return ids;
}

}  // namespace

ResponseMeta NewResponseMeta(std::string_view prefix, std::string model) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kHex[] = "0123456789abcdef";
  ResponseMeta meta;
  meta.id.assign(prefix);
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = rng();
    for (int i = 0; i < 16; ++i, bits >>= 4) meta.id += kHex[bits & 15];
  }
  meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  meta.model = std::move(model);
  return meta;
}

LogprobOptions LogprobOptionsFor(const CompletionRequest& request, const Tokenizer* tokenizer) {
  LogprobOptions o;
  o.enabled = request.logprobs.has_value();
  o.top = request.logprobs.value_or(0);
  o.tokens_as_ids = request.return_tokens_as_token_ids;
  o.tokenizer = tokenizer;
  return o;
}

LogprobOptions LogprobOptionsFor(const ChatCompletionRequest& request, const Tokenizer* tokenizer) {
  LogprobOptions o;
  o.enabled = request.logprobs;
  o.top = request.top_logprobs;
  o.tokens_as_ids = request.return_tokens_as_token_ids;
  o.tokenizer = tokenizer;
  return o;
}

std::string TokenText(int32_t id, const LogprobOptions& options) {
  if (options.tokens_as_ids || options.tokenizer == nullptr)
    return "token_id:" + std::to_string(id);
  return options.tokenizer->Decode({id}, /*skip_special_tokens=*/false);
}

int64_t CodePointCount(std::string_view utf8) {
  int64_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}

nlohmann::ordered_json UsageJson(const Usage& usage) {
  Json u = Json::object();
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  if (usage.cached_tokens)
    u["prompt_tokens_details"] = Json{{"cached_tokens", *usage.cached_tokens}};
  return u;
}

nlohmann::ordered_json CompletionLogprobsJson(std::span<const GeneratedToken> tokens,
                                              const LogprobOptions& options, int64_t initial_offset,
                                              size_t null_logprobs) {
  Json out_tokens = Json::array(), out_logprobs = Json::array(), out_top = Json::array(),
       offsets = Json::array();
  int64_t offset = initial_offset;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const GeneratedToken& t = tokens[k];
    std::string text = TokenText(t.id, options);
    if (k < null_logprobs) {
      out_logprobs.push_back(nullptr);
      out_top.push_back(nullptr);
      offsets.push_back(offset);
      offset += CodePointCount(text);
      out_tokens.push_back(std::move(text));
      continue;
    }
    // The sampled token first, then the top N: up to N + 1 entries, as the
    // OpenAI spec says (a token in both appears once).
    Json top = Json::object();
    top[text] = ClampLogprob(t.logprob);
    for (size_t i = 0; i < t.top.size() && static_cast<int>(i) < options.top; ++i) {
      top[TokenText(t.top[i].token_id, options)] = ClampLogprob(t.top[i].logprob);
    }
    out_logprobs.push_back(ClampLogprob(t.logprob));
    out_top.push_back(std::move(top));
    offsets.push_back(offset);
    offset += CodePointCount(text);
    out_tokens.push_back(std::move(text));
  }
  Json lp = Json::object();
  lp["text_offset"] = std::move(offsets);
  lp["token_logprobs"] = std::move(out_logprobs);
  lp["tokens"] = std::move(out_tokens);
  lp["top_logprobs"] = std::move(out_top);
  return lp;
}

nlohmann::ordered_json ChatLogprobsJson(std::span<const GeneratedToken> tokens,
                                        const LogprobOptions& options) {
  Json content = Json::array();
  for (const GeneratedToken& t : tokens) {
    std::string text = TokenText(t.id, options);
    Json entry = Json::object();
    entry["token"] = text;
    entry["logprob"] = ClampLogprob(t.logprob);
    entry["bytes"] = Bytes(t.id, text, options);
    Json top = Json::array();
    for (size_t i = 0; i < t.top.size() && static_cast<int>(i) < options.top; ++i) {
      std::string top_text = TokenText(t.top[i].token_id, options);
      Json e = Json::object();
      e["token"] = top_text;
      e["logprob"] = ClampLogprob(t.top[i].logprob);
      e["bytes"] = Bytes(t.top[i].token_id, top_text, options);
      top.push_back(std::move(e));
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return Json{{"content", std::move(content)}};
}

nlohmann::ordered_json PromptLogprobsJson(std::span<const PromptLogprob> logprobs,
                                          const LogprobOptions& options) {
  Json out = Json::array({nullptr});  // the first token has nothing before it
  for (const PromptLogprob& p : logprobs) {
    Json entry = Json::object();
    entry[std::to_string(p.id)] = Json{{"logprob", ClampLogprob(p.logprob)},
                                       {"rank", p.rank},
                                       {"decoded_token", TokenText(p.id, options)}};
    for (size_t i = 0; i < p.top.size(); ++i) {
      const std::string key = std::to_string(p.top[i].token_id);
      if (entry.contains(key)) continue;  // the prompt's own token, already there
      entry[key] = Json{{"logprob", ClampLogprob(p.top[i].logprob)},
                        {"rank", static_cast<int64_t>(i) + 1},
                        {"decoded_token", TokenText(p.top[i].token_id, options)}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

nlohmann::ordered_json CompletionResponseJson(const ResponseMeta& meta,
                                              const std::vector<ChoiceOutput>& choices,
                                              const Usage& usage, const LogprobOptions& logprobs) {
  Json out = Json::object();
  out["id"] = meta.id;
  out["object"] = "text_completion";
  out["created"] = meta.created;
  out["model"] = meta.model;
  Json cs = Json::array();
  for (const ChoiceOutput& c : choices) {
    Json choice = Json::object();
    choice["index"] = c.index;
    choice["text"] = c.text;
    choice["logprobs"] =
        logprobs.enabled
            ? CompletionLogprobsJson(c.tokens, logprobs, c.echo_offset, c.leading_null_logprobs)
            : Json(nullptr);
    choice["finish_reason"] = FinishReasonJson(c.finish_reason);
    choice["stop_reason"] = StopReasonJson(c.stop_reason);
    choice["token_ids"] = TokenIdsJson(c.token_ids);
    choice["prompt_logprobs"] =
        c.prompt_logprobs ? PromptLogprobsJson(*c.prompt_logprobs, logprobs) : Json(nullptr);
    choice["prompt_token_ids"] = TokenIdsJson(c.prompt_token_ids);
    cs.push_back(std::move(choice));
  }
  out["choices"] = std::move(cs);
  out["usage"] = UsageJson(usage);
  return out;
}

nlohmann::ordered_json ChatCompletionResponseJson(const ResponseMeta& meta,
                                                  const std::vector<ChoiceOutput>& choices,
                                                  const Usage& usage,
                                                  const LogprobOptions& logprobs,
                                                  std::string_view role) {
  Json out = Json::object();
  out["id"] = meta.id;
  out["object"] = "chat.completion";
  out["created"] = meta.created;
  out["model"] = meta.model;
  Json cs = Json::array();
  for (const ChoiceOutput& c : choices) {
    Json message = Json::object();
    message["role"] = role;
    message["content"] = c.text.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.text);
    message["refusal"] = nullptr;
    if (c.reasoning_content) message["reasoning_content"] = *c.reasoning_content;
    if (!c.tool_calls.empty()) {
      Json calls = Json::array();
      for (size_t i = 0; i < c.tool_calls.size(); ++i)
        calls.push_back(ToolCallJson(c.tool_calls[i], static_cast<int>(i)));
      message["tool_calls"] = std::move(calls);
    }
    Json choice = Json::object();
    choice["index"] = c.index;
    choice["message"] = std::move(message);
    choice["logprobs"] = logprobs.enabled ? ChatLogprobsJson(c.tokens, logprobs) : Json(nullptr);
    choice["finish_reason"] = FinishReasonJson(c.finish_reason, !c.tool_calls.empty());
    choice["stop_reason"] = StopReasonJson(c.stop_reason);
    choice["token_ids"] = TokenIdsJson(c.token_ids);
    cs.push_back(std::move(choice));
  }
  out["choices"] = std::move(cs);
  out["usage"] = UsageJson(usage);
  // vLLM's shape: the prompt's logprobs and, with return_token_ids, its
  // token ids, once for all choices.
  out["prompt_logprobs"] = choices.empty() || !choices[0].prompt_logprobs
                               ? Json(nullptr)
                               : PromptLogprobsJson(*choices[0].prompt_logprobs, logprobs);
  out["prompt_token_ids"] =
      choices.empty() ? Json(nullptr) : TokenIdsJson(choices[0].prompt_token_ids);
  return out;
}

nlohmann::ordered_json ErrorJson(const ApiError& error) {
  Json e = Json::object();
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  e["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return Json{{"error", std::move(e)}};
}

std::string DumpJson(const nlohmann::ordered_json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string SseEvent(const nlohmann::ordered_json& json) {
  return "data: " + DumpJson(json) + "\n\n";
}

// ---------------------------------------------------------------------------
// StreamEncoder

StreamEncoder::StreamEncoder(Kind kind, ResponseMeta meta, StreamSettings settings)
    : kind_(kind), meta_(std::move(meta)), settings_(std::move(settings)) {}

nlohmann::ordered_json StreamEncoder::Chunk() const {
  Json c = Json::object();
  c["id"] = meta_.id;
  c["object"] = kind_ == Kind::kChat ? "chat.completion.chunk" : "text_completion";
  c["created"] = meta_.created;
  c["model"] = meta_.model;
  return c;
}

int64_t StreamEncoder::completion_tokens(int index) const {
  auto it = tokens_.find(index);
  return it == tokens_.end() ? 0 : it->second;
}

bool StreamEncoder::UsageOnChunks() const { return settings_.options.include_usage; }

nlohmann::ordered_json StreamEncoder::UsageFor(int index) const {
  // vLLM: continuous usage stats only together with include_usage.
  if (settings_.options.include_usage && settings_.options.continuous_usage_stats) {
    Usage u;
    u.prompt_tokens = settings_.prompt_tokens;
    u.completion_tokens = completion_tokens(index);
    return UsageJson(u);
  }
  return nullptr;  // OpenAI: null on every chunk but the last
}

nlohmann::ordered_json StreamEncoder::PromptTokenIds(int index) const {
  const auto& ids = settings_.prompt_token_ids;
  return index >= 0 && static_cast<size_t>(index) < ids.size() ? Json(ids[index]) : Json::array();
}

std::string StreamEncoder::Start() {
  if (kind_ != Kind::kChat) return "";
  std::string out;
  for (int i = 0; i < settings_.num_choices; ++i) {
    Json delta = Json::object();
    delta["role"] = settings_.role;
    delta["content"] = "";
    Json choice = Json::object();
    choice["index"] = i;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = nullptr;
    Json chunk = Chunk();
    chunk["choices"] = Json::array({std::move(choice)});
    // return_token_ids: the prompt's ids once, on the first chunk (vLLM).
    if (i == 0 && settings_.return_token_ids) chunk["prompt_token_ids"] = PromptTokenIds(0);
    if (UsageOnChunks()) chunk["usage"] = UsageFor(i);
    out += SseEvent(chunk);
  }
  return out;
}

std::string StreamEncoder::Delta(const StreamDelta& d) {
  tokens_[d.index] += static_cast<int64_t>(d.tokens.size());
  const bool with_logprobs = settings_.logprobs.enabled && !d.tokens.empty();
  const bool with_token_ids = settings_.return_token_ids && !d.tokens.empty();
  if (d.text.empty() && !d.reasoning_content && d.tool_calls.empty() && !with_logprobs &&
      !with_token_ids && d.finish_reason == FinishReason::kNone) {
    return "";
  }
  Json choice = Json::object();
  choice["index"] = d.index;
  if (kind_ == Kind::kChat) {
    // The text (and reasoning) first, then one chunk per tool-call event;
    // logprobs and token ids ride on the first chunk, the finish reason on
    // the last.
    std::vector<Json> deltas;
    Json text = Json::object();
    if (d.reasoning_content) text["reasoning_content"] = *d.reasoning_content;
    if (!d.text.empty() || (!d.reasoning_content && d.tool_calls.empty())) text["content"] = d.text;
    if (!text.empty() || with_logprobs || with_token_ids) deltas.push_back(std::move(text));
    for (const ToolCallEvent& e : d.tool_calls) {
      Json call = Json::object();
      call["index"] = e.index;
      if (e.kind == ToolCallEvent::Kind::kStart) {
        call["id"] = e.id;
        call["type"] = "function";
        call["function"] = Json{{"name", e.name}, {"arguments", ""}};
      } else if (e.kind == ToolCallEvent::Kind::kArguments) {
        call["function"] = Json{{"arguments", e.arguments}};
      } else {
        continue;  // the end of a call has no wire form
      }
      deltas.push_back(Json{{"tool_calls", Json::array({std::move(call)})}});
    }
    if (deltas.empty()) deltas.push_back(Json{{"content", ""}});  // a bare finish
    std::string out;
    for (size_t i = 0; i < deltas.size(); ++i) {
      const bool first = i == 0, last = i + 1 == deltas.size();
      Json ch = Json::object();
      ch["index"] = d.index;
      ch["delta"] = std::move(deltas[i]);
      ch["logprobs"] =
          first && with_logprobs ? ChatLogprobsJson(d.tokens, settings_.logprobs) : Json(nullptr);
      ch["finish_reason"] =
          last ? FinishReasonJson(d.finish_reason, d.made_tool_calls) : Json(nullptr);
      if (last && d.finish_reason != FinishReason::kNone)
        ch["stop_reason"] = StopReasonJson(d.stop_reason);
      if (settings_.return_token_ids)
        ch["token_ids"] = first ? TokenIdsOf(d.tokens) : Json::array();
      Json chunk = Chunk();
      chunk["choices"] = Json::array({std::move(ch)});
      if (UsageOnChunks()) chunk["usage"] = UsageFor(d.index);
      out += SseEvent(chunk);
    }
    return out;
  } else {
    int64_t& offset = text_offset_[d.index];
    choice["text"] = d.text;
    choice["logprobs"] = with_logprobs ? CompletionLogprobsJson(d.tokens, settings_.logprobs,
                                                                offset, d.leading_null_logprobs)
                                       : Json(nullptr);
    if (d.prompt_logprobs)
      choice["prompt_logprobs"] = PromptLogprobsJson(*d.prompt_logprobs, settings_.logprobs);
    choice["finish_reason"] = FinishReasonJson(d.finish_reason);
    choice["stop_reason"] = StopReasonJson(d.stop_reason);
    if (settings_.return_token_ids) {
      // Each choice's first chunk carries its prompt's ids (vLLM).
      if (prompt_ids_sent_.insert(d.index).second)
        choice["prompt_token_ids"] = PromptTokenIds(d.index);
      choice["token_ids"] = TokenIdsOf(d.tokens);
    }
    offset += CodePointCount(d.text);
  }
  Json chunk = Chunk();
  chunk["choices"] = Json::array({std::move(choice)});
  if (UsageOnChunks()) chunk["usage"] = UsageFor(d.index);
  return SseEvent(chunk);
}

std::string StreamEncoder::Finish(const Usage& usage) {
  std::string out;
  if (settings_.options.include_usage) {
    Json chunk = Chunk();
    chunk["choices"] = Json::array();
    chunk["usage"] = UsageJson(usage);
    out += SseEvent(chunk);
  }
  out += kSseDone;
  return out;
}

std::string StreamEncoder::Error(const ApiError& error) { return SseEvent(ErrorJson(error)); }

}  // namespace strata
