// Chat messages as the chat template expects them: roles checked, content
// parts joined, tool-call arguments parsed into objects (transformers'
// convention). Internal to the server module (openai_protocol.cc).
//
// Thread-safety: pure functions.
#pragma once

#include "server/openai_fields.h"

namespace strata::openai_fields {

// Normalizes `messages` (an array) into *out, naming the offending
// "messages[i]..." field on error.
MaybeError NormalizeMessages(const Json& messages, const ProtocolLimits& limits, Json* out);
// An assistant message's tool_calls, arguments parsed to objects.
MaybeError NormalizeToolCalls(const Json& calls, const std::string& param, const ProtocolLimits& limits, Json* out);

}  // namespace strata::openai_fields
