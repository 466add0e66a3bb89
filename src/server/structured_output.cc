#include "server/structured_output.h"

#include "server/openai_fields.h"

namespace strata {
namespace {

using namespace openai_fields;  // NOLINT: the request readers
using Kind = constrain::ConstraintSpec::Kind;

StructuredOutput Make(Kind kind, std::string text, std::string param) {
  return StructuredOutput{constrain::ConstraintSpec{kind, std::move(text)}, std::move(param)};
}

// A schema given as an object/boolean, or as a string holding one (vLLM
// accepts both for guided_json).
ApiOr<std::string> SchemaText(const Json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    Json parsed = Json::parse(v.get_ref<const std::string&>(), nullptr, false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
      return InvalidRequestError(param, param +
                                            " must be a JSON schema (an object, or a string "
                                            "holding one)");
    return parsed.dump();
  }
  return WrongType(param, "a JSON schema object", v);
}

ApiOr<std::string> NonEmptyString(const Json& v, const std::string& param) {
  if (!v.is_string()) return WrongType(param, "a string", v);
  if (v.get_ref<const std::string&>().empty())
    return InvalidRequestError(param, param + " must not be empty");
  return v.get<std::string>();
}

ApiOr<std::string> Choices(const Json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) return WrongType(param, "a non-empty array of strings", v);
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty())
      return WrongType(Index(param, i), "a non-empty string", v[i]);
  }
  return v.dump();
}

ApiOr<std::optional<StructuredOutput>> ParseVllmObject(const Json& so) {
  const std::string p = "structured_outputs";
  if (!so.is_object()) return WrongType(p, "an object", so);
  std::optional<StructuredOutput> out;
  for (auto it = so.begin(); it != so.end(); ++it) {
    const std::string key = it.key(), param = p + "." + key;
    if (it->is_null()) continue;
    std::optional<StructuredOutput> one;
    if (key == "json") {
      ApiOr<std::string> t = SchemaText(*it, param);
      if (!t.ok()) return t.error();
      one = Make(Kind::kJsonSchema, t.value(), param);
    } else if (key == "regex") {
      ApiOr<std::string> t = NonEmptyString(*it, param);
      if (!t.ok()) return t.error();
      one = Make(Kind::kRegex, t.value(), param);
    } else if (key == "choice") {
      ApiOr<std::string> t = Choices(*it, param);
      if (!t.ok()) return t.error();
      one = Make(Kind::kChoice, t.value(), param);
    } else if (key == "grammar") {
      ApiOr<std::string> t = NonEmptyString(*it, param);
      if (!t.ok()) return t.error();
      one = Make(Kind::kGrammar, t.value(), param);
    } else if (key == "json_object") {
      if (!it->is_boolean()) return WrongType(param, "a boolean", *it);
      if (it->get<bool>()) one = Make(Kind::kJsonObject, "", param);
    } else if (key == "disable_any_whitespace" || key == "disable_fallback" ||
               key == "disable_additional_properties") {
      // Strata's whitespace is always bounded, it never falls back, and it
      // never writes additional properties: these ask for what it does.
      if (!it->is_boolean()) return WrongType(param, "a boolean", *it);
      continue;
    } else {
      return InvalidRequestError(param, param +
                                            " is not supported by this server (json, regex, "
                                            "choice, grammar and json_object are)");
    }
    if (one && out)
      return InvalidRequestError(param,
                                 "structured_outputs takes one of json, regex, choice, "
                                 "grammar, json_object; " +
                                     out->param + " is set too");
    if (one) out = std::move(one);
  }
  return out;
}

}  // namespace

const std::vector<std::string>& StructuredOutputFields() {
  static const std::vector<std::string> k = {
      "response_format", "structured_outputs", "guided_json", "guided_regex",
      "guided_choice",   "guided_grammar",     "json_schema", "grammar"};
  return k;
}

ApiOr<std::optional<StructuredOutput>> ParseResponseFormat(const Json& rf, const std::string& param,
                                                           bool flat_json_schema) {
  if (!rf.is_object()) return WrongType(param, "an object", rf);
  const Json* type = Get(rf, "type");
  if (!type || !type->is_string())
    return InvalidRequestError(param + ".type", param +
                                                    ".type must be \"text\", \"json_object\" or "
                                                    "\"json_schema\"");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::optional<StructuredOutput>();
  if (t == "json_object")
    return std::optional<StructuredOutput>(Make(Kind::kJsonObject, "", param));
  if (t != "json_schema")
    return InvalidRequestError(param + ".type", param + ".type " + Shown(*type) +
                                                    " is not supported (text, json_object, "
                                                    "json_schema are)");
  const Json* holder = &rf;
  std::string where = param;
  if (!flat_json_schema) {
    holder = Get(rf, "json_schema");
    where = param + ".json_schema";
    if (!holder) return InvalidRequestError(where, where + " is required with type json_schema");
    if (!holder->is_object()) return WrongType(where, "an object", *holder);
  }
  if (const Json* strict = Get(*holder, "strict"); strict && !strict->is_boolean())
    return WrongType(where + ".strict", "a boolean", *strict);
  const Json* schema = Get(*holder, "schema");
  if (!schema) {
    // No schema: any JSON value's worth of object (OpenAI requires one;
    // vLLM treats it as json_object).
    return std::optional<StructuredOutput>(Make(Kind::kJsonObject, "", where));
  }
  ApiOr<std::string> text = SchemaText(*schema, where + ".schema");
  if (!text.ok()) return text.error();
  return std::optional<StructuredOutput>(Make(Kind::kJsonSchema, text.value(), where + ".schema"));
}

ApiOr<std::optional<StructuredOutput>> ParseStructuredOutput(const Json& body) {
  std::optional<StructuredOutput> out;
  auto take = [&](std::optional<StructuredOutput> one, const std::string& field) -> MaybeError {
    if (!one) return std::nullopt;
    if (out)
      return InvalidRequestError(
          field, field + " and " + out->param + " both ask for structured output; send one");
    out = std::move(one);
    return std::nullopt;
  };
  if (const Json* rf = Get(body, "response_format")) {
    auto r = ParseResponseFormat(*rf, "response_format");
    if (!r.ok()) return r.error();
    RETURN_IF_API_ERROR(take(std::move(r.value()), "response_format"));
  }
  if (const Json* so = Get(body, "structured_outputs")) {
    auto r = ParseVllmObject(*so);
    if (!r.ok()) return r.error();
    RETURN_IF_API_ERROR(take(std::move(r.value()), "structured_outputs"));
  }
  for (const char* key : {"guided_json", "json_schema"}) {
    if (const Json* v = Get(body, key)) {
      ApiOr<std::string> t = SchemaText(*v, key);
      if (!t.ok()) return t.error();
      RETURN_IF_API_ERROR(take(Make(Kind::kJsonSchema, t.value(), key), key));
    }
  }
  for (const char* key : {"guided_regex", "guided_grammar", "grammar"}) {
    if (const Json* v = Get(body, key)) {
      ApiOr<std::string> t = NonEmptyString(*v, key);
      if (!t.ok()) return t.error();
      const Kind kind = std::string(key) == "guided_regex" ? Kind::kRegex : Kind::kGrammar;
      RETURN_IF_API_ERROR(take(Make(kind, t.value(), key), key));
    }
  }
  if (const Json* v = Get(body, "guided_choice")) {
    ApiOr<std::string> t = Choices(*v, "guided_choice");
    if (!t.ok()) return t.error();
    RETURN_IF_API_ERROR(take(Make(Kind::kChoice, t.value(), "guided_choice"), "guided_choice"));
  }
  return out;
}

StructuredOutput ToolCallSpec(const Json& tools, const std::string& format, const std::string& only,
                              bool parallel) {
  Json list = Json::array();
  for (const Json& t : tools) {
    const Json& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    Json entry = {{"name", name}};
    if (fn.contains("parameters")) entry["parameters"] = fn["parameters"];
    list.push_back(std::move(entry));
  }
  Json spec = {
      {"format", format}, {"tools", std::move(list)}, {"parallel", parallel && only.empty()}};
  return Make(Kind::kToolCalls, spec.dump(), "tools");
}

}  // namespace strata
