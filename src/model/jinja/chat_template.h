// Renders a model's Jinja chat template exactly as transformers'
// apply_chat_template does (jinja2 sandbox with trim_blocks and lstrip_blocks,
// raise_exception, strftime_now, tojson, ...).
//
// The template is parsed once at model load: syntax the engine does not
// support is a Status error then, never at request time. Render() errors
// (e.g. raise_exception in the template, a bad message list) are
// InvalidArgument with the template's own message.
// Thread-safety: a parsed ChatTemplate is immutable; Render is reentrant.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/jinja/jinja_limits.h"
#include "util/status.h"

namespace strata {

class ChatTemplateImpl;

// Everything a template sees. JSON values are ordered_json so dict key order
// survives into tojson output exactly as the request sent it (transformers
// keeps Python dict order; a sorted std::map would reorder tool schemas).
struct ChatTemplateInputs {
  // [{"role": ..., "content": ...}, ...] as the request sent them (content
  // may be a string, null or a list of parts; extra keys such as tool_calls
  // and reasoning_content pass through).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = true;
  // The request's tools list; null when absent (the template still sees
  // `tools` defined, as none, like transformers passes it).
  nlohmann::ordered_json tools;
  // Extra variables (chat_template_kwargs), e.g. {"enable_thinking": false}.
  // They may not redefine messages, tools, documents or add_generation_prompt.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  std::string bos_token;  // "" = the tokenizer has none (undefined in the template)
  std::string eos_token;  // likewise
  // Local time strftime_now() formats; unset = the system clock. Tests pin it.
  std::optional<std::tm> now;
  // Output size and step budget; a render past them is InvalidArgument.
  jinja::RenderLimits limits;
};

class ChatTemplate {
 public:
  // Parses `source` (jinja2 syntax). InvalidArgument naming the line for
  // syntax errors and for anything the engine does not support (unknown
  // tags, filters or tests), so a model with such a template fails to load.
  static StatusOr<std::shared_ptr<const ChatTemplate>> Parse(const std::string& source);
  ~ChatTemplate();
  // The prompt text apply_chat_template(tokenize=False) would produce.
  // InvalidArgument for raise_exception() (its message verbatim) and for
  // runtime errors (undefined used as an object, type errors), which come
  // from the request's messages not fitting the template.
  StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

 private:
  ChatTemplate();
  std::unique_ptr<ChatTemplateImpl> impl_;
  friend class ChatTemplateImpl;
};

}  // namespace strata
