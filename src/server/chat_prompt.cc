#include "server/chat_prompt.h"

namespace strata {

ChatTemplateInputs MakeChatTemplateInputs(const ChatCompletionRequest& request, const Tokenizer& tokenizer) {
  ChatTemplateInputs in;
  in.messages = request.messages;
  in.add_generation_prompt = request.add_generation_prompt;
  in.tools = request.tools;
  in.extra = request.chat_template_kwargs;
  in.bos_token = tokenizer.bos_token();
  in.eos_token = tokenizer.eos_token();
  return in;
}

ApiOr<std::string> RenderChatPrompt(const ChatTemplate& chat_template, const ChatCompletionRequest& request,
                                    const Tokenizer& tokenizer) {
  StatusOr<std::string> rendered = chat_template.Render(MakeChatTemplateInputs(request, tokenizer));
  if (!rendered.ok()) {
    ApiError e = ApiErrorFromStatus(rendered.status());
    if (e.http_status == 400) {
      e.param = "messages";
      e.message = "the chat template rejected the messages: " + e.message;
    }
    return e;
  }
  std::string text = std::move(rendered).value();
  if (!request.continue_final_message) return text;
  // transformers: cut after the last occurrence of the final message's
  // content (stripped, for templates that trim it).
  std::string final_text = request.messages.back()["content"].get<std::string>();
  size_t pos = text.rfind(final_text);
  if (pos == std::string::npos) {
    size_t b = final_text.find_first_not_of(" \t\n\r\f\v");
    size_t e = final_text.find_last_not_of(" \t\n\r\f\v");
    final_text = b == std::string::npos ? std::string() : final_text.substr(b, e - b + 1);
    pos = final_text.empty() ? std::string::npos : text.rfind(final_text);
  }
  if (pos == std::string::npos) {
    return InvalidRequestError("messages", "continue_final_message is set but the final message's content does not "
                                           "appear in the prompt the chat template rendered");
  }
  text.resize(pos + final_text.size());
  return text;
}

}  // namespace strata
