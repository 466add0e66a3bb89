#include "model/jinja/chat_template.h"

#include "model/jinja/jinja_interp.h"
#include "model/jinja/jinja_parser.h"

namespace strata {

class ChatTemplateImpl {
 public:
  std::shared_ptr<const jinja::Program> program;
};

ChatTemplate::ChatTemplate() : impl_(std::make_unique<ChatTemplateImpl>()) {}
ChatTemplate::~ChatTemplate() = default;

StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::Parse(const std::string& source) {
  auto program = jinja::ParseTemplate(source);
  if (!program.ok())
    return Status(program.status().code(),
                  program.status().message() +
                      " (the chat template must be valid jinja2 within what Strata supports)");
  std::shared_ptr<ChatTemplate> t(new ChatTemplate());
  t->impl_->program = *std::move(program);
  return std::shared_ptr<const ChatTemplate>(std::move(t));
}

StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& in) const {
  if (!in.messages.is_array())
    return InvalidArgument("chat template: messages must be a JSON array");
  if (!in.extra.is_null() && !in.extra.is_object())
    return InvalidArgument(
        "chat template: extra variables (chat_template_kwargs) must be a JSON object");

  // What transformers passes: messages, tools, documents, add_generation_prompt
  // and the tokenizer's special tokens, then chat_template_kwargs.
  jinja::Dict ctx;
  ctx.Set("messages", jinja::Value::FromJson(in.messages));
  ctx.Set("tools", jinja::Value::FromJson(in.tools));
  ctx.Set("documents", jinja::Value::MakeNone());
  ctx.Set("add_generation_prompt", jinja::Value(in.add_generation_prompt));
  if (!in.bos_token.empty()) ctx.Set("bos_token", jinja::Value(in.bos_token));
  if (!in.eos_token.empty()) ctx.Set("eos_token", jinja::Value(in.eos_token));
  if (in.extra.is_object()) {
    for (auto it = in.extra.begin(); it != in.extra.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
        return InvalidArgument("chat_template_kwargs may not set '" + k +
                               "'; pass it as its own request field");
      ctx.Set(k, jinja::Value::FromJson(it.value()));
    }
  }

  std::tm now{};
  if (in.now) {
    now = *in.now;
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &now);
  }
  try {
    jinja::Interpreter interp(*impl_->program, ctx, now, in.limits);
    return interp.Render();
  } catch (const jinja::RenderError& e) {
    if (e.raised_by_template) return InvalidArgument(e.message);
    return InvalidArgument("chat template: " + e.message);
  }
}

}  // namespace strata
