// The request fields that ask for structured output, read into one
// constrain::ConstraintSpec (src/constrain/constraint.h compiles it):
//
//   response_format    {"type": "text"} (nothing), {"type": "json_object"},
//                      {"type": "json_schema", "json_schema": {"name",
//                      "schema", "strict"}} (strict or not, the schema is
//                      enforced: Strata has no best-effort mode)
//   structured_outputs vLLM's object: one of json, regex, choice, grammar,
//                      json_object (true)
//   guided_json, guided_regex, guided_choice, guided_grammar
//                      vLLM's older top-level fields, the same meaning
//   json_schema, grammar
//                      llama.cpp server's top-level fields (a schema; GBNF)
// At most one may be set (a 400 naming the second otherwise). Compile
// errors (an unsupported keyword, a bad regex) are 400s naming the field
// the spec came from (StructuredOutput::param).
//
// Forced tool calls (tool_choice "required" or a named function) become a
// kToolCalls spec in the --tool-call-parser's syntax: ToolCallSpec.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "constrain/constraint.h"
#include "server/api_error.h"

namespace strata {

struct StructuredOutput {
  constrain::ConstraintSpec spec;
  std::string param;  // the request field it came from, for errors
};

// The top-level fields ParseStructuredOutput reads.
const std::vector<std::string>& StructuredOutputFields();

// The structured output `body` asks for; nullopt when none. A 400 for a
// field of the wrong shape or two fields at once.
ApiOr<std::optional<StructuredOutput>> ParseStructuredOutput(const nlohmann::ordered_json& body);

// response_format alone (also the Responses API's text.format, whose
// json_schema fields sit in the object itself): param names it in errors.
ApiOr<std::optional<StructuredOutput>> ParseResponseFormat(const nlohmann::ordered_json& format,
                                                           const std::string& param,
                                                           bool flat_json_schema = false);

// A spec forcing one or more calls (parallel) in `format`'s syntax
// ("hermes", "llama3", "mistral", "deepseekv3": ToolCallFormatName) to the
// chat request's tools (`only`: that function alone, one call).
StructuredOutput ToolCallSpec(const nlohmann::ordered_json& tools, const std::string& format,
                              const std::string& only, bool parallel);

}  // namespace strata
