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

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace strata {

class ChatTemplateImpl;

struct ChatTemplateInputs {
  nlohmann::json messages = nlohmann::json::array();  // [{"role":..., "content":...}, ...]
  bool add_generation_prompt = true;
  nlohmann::json tools;  // null when absent
  // Extra variables (chat_template_kwargs), e.g. {"enable_thinking": false}.
  nlohmann::json extra = nlohmann::json::object();
  std::string bos_token;
  std::string eos_token;
};

class ChatTemplate {
 public:
  static StatusOr<std::shared_ptr<const ChatTemplate>> Parse(const std::string& source);
  ~ChatTemplate();
  StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

 private:
  ChatTemplate();
  std::unique_ptr<ChatTemplateImpl> impl_;
  friend class ChatTemplateImpl;
};

}  // namespace strata
