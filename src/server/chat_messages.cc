#include "server/chat_messages.h"

#include <set>

#include "server/json_body.h"

namespace strata::openai_fields {

MaybeError NormalizeToolCalls(const Json& calls, const std::string& param, const ProtocolLimits& limits,
                              Json* out) {
  if (!calls.is_array()) return WrongType(param, "an array", calls);
  *out = Json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    std::string p = Index(param, j);
    const Json& call = calls[j];
    if (!call.is_object()) return WrongType(p, "an object", call);
    const Json* fn = Get(call, "function");
    if (!fn) return InvalidRequestError(p + ".function", p + ".function is required");
    if (!fn->is_object()) return WrongType(p + ".function", "an object", *fn);
    const Json* name = Get(*fn, "name");
    if (!name || !name->is_string()) {
      return InvalidRequestError(p + ".function.name", p + ".function.name is required and must be a string");
    }
    Json normalized = call;
    Json& args = normalized["function"]["arguments"];
    // Templates expect arguments as a mapping (transformers' convention;
    // vLLM parses the OpenAI JSON string the same way).
    if (args.is_null() || (args.is_string() && args.get_ref<const std::string&>().empty())) {
      args = Json::object();
    } else if (args.is_string()) {
      ApiOr<Json> parsed = ParseJsonBody(args.get_ref<const std::string&>(), limits.max_json_depth);
      if (!parsed.ok()) {
        return InvalidRequestError(p + ".function.arguments", p + ".function.arguments must be a JSON string: " +
                                                                  parsed.error().message);
      }
      args = std::move(parsed).value();
    } else if (!args.is_object()) {
      return WrongType(p + ".function.arguments", "a JSON string or an object", args);
    }
    out->push_back(std::move(normalized));
  }
  return std::nullopt;
}

MaybeError NormalizeMessages(const Json& messages, const ProtocolLimits& limits, Json* out) {
  static const std::set<std::string> kRoles = {"system", "user", "assistant", "tool", "developer"};
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string p = Index("messages", i);
    const Json& m = messages[i];
    if (!m.is_object()) return WrongType(p, "an object", m);
    const Json* role = Get(m, "role");
    if (!role) return InvalidRequestError(p + ".role", p + ".role is required");
    if (!role->is_string()) return WrongType(p + ".role", "a string", *role);
    const std::string& r = role->get_ref<const std::string&>();
    if (!kRoles.count(r)) {
      return InvalidRequestError(p + ".role", p + ".role must be one of system, user, assistant, tool, developer; got " +
                                                  Shown(*role));
    }
    Json msg = Json::object();
    msg["role"] = r;
    const Json* content = Get(m, "content");
    if (!content) {
      if (r != "assistant") {
        return InvalidRequestError(p + ".content", p + ".content is required for role '" + r + "'");
      }
      msg["content"] = "";
    } else if (content->is_string()) {
      msg["content"] = *content;
    } else if (content->is_array()) {
      std::string text;
      for (size_t j = 0; j < content->size(); ++j) {
        const std::string pp = Index(p + ".content", j);
        const Json& part = (*content)[j];
        if (!part.is_object()) return WrongType(pp, "a content part object", part);
        const Json* type = Get(part, "type");
        if (!type || !type->is_string()) {
          return InvalidRequestError(pp + ".type", pp + ".type is required and must be a string");
        }
        if (*type != "text") {
          return InvalidRequestError(pp + ".type", "only text content is supported; " + pp + " has type " +
                                                       Shown(*type));
        }
        const Json* t = Get(part, "text");
        if (!t || !t->is_string()) {
          return InvalidRequestError(pp + ".text", pp + ".text is required and must be a string");
        }
        if (j > 0) text += '\n';
        text += t->get_ref<const std::string&>();
      }
      msg["content"] = std::move(text);
    } else {
      return WrongType(p + ".content", "a string or an array of content parts", *content);
    }
    if (const Json* name = Get(m, "name")) {
      if (!name->is_string()) return WrongType(p + ".name", "a string", *name);
      msg["name"] = *name;
    }
    if (r == "assistant") {
      if (const Json* calls = Get(m, "tool_calls")) {
        Json normalized;
        RETURN_IF_API_ERROR(NormalizeToolCalls(*calls, p + ".tool_calls", limits, &normalized));
        msg["tool_calls"] = std::move(normalized);
      }
      for (const char* key : {"reasoning_content", "reasoning"}) {
        const Json* v = Get(m, key);
        if (!v) continue;
        if (!v->is_string()) return WrongType(p + "." + key, "a string", *v);
        msg["reasoning_content"] = *v;  // templates read either name (vLLM sets both)
        msg["reasoning"] = *v;
        break;
      }
    }
    if (r == "tool") {
      if (const Json* id = Get(m, "tool_call_id")) {
        if (!id->is_string()) return WrongType(p + ".tool_call_id", "a string", *id);
        msg["tool_call_id"] = *id;
      }
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

}  // namespace strata::openai_fields
