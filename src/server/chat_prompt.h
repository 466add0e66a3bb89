// Chat requests to prompt text: the template inputs of a parsed
// ChatCompletionRequest and the rendered prompt (continue_final_message cut
// the way transformers does).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <string>

#include "model/jinja/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "server/openai_protocol.h"

namespace strata {

// What the chat template sees for this request (bos/eos from the tokenizer).
ChatTemplateInputs MakeChatTemplateInputs(const ChatCompletionRequest& request, const Tokenizer& tokenizer);

// The prompt text for a chat request. With continue_final_message the text
// ends right after the final message's content, as transformers' does (the
// template renders without a generation prompt and the end-of-turn tokens
// after that content are cut). Template errors are a 400 on "messages".
ApiOr<std::string> RenderChatPrompt(const ChatTemplate& chat_template, const ChatCompletionRequest& request,
                                    const Tokenizer& tokenizer);

}  // namespace strata
