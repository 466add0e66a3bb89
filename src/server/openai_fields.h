// Reading fields of an OpenAI request body with OpenAI-style errors: the
// helpers openai_protocol.cc builds its parsers from. Internal to the server
// module. Absent and null both mean "not given": readers leave *out alone.
// Errors name the field in ApiError::param and say what was expected and
// what came ("temperature must be a number, got a string").
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_protocol.h"

namespace strata::openai_fields {

using Json = nlohmann::ordered_json;
using MaybeError = std::optional<ApiError>;

// Returns the ApiError of `expr` (a MaybeError) from the enclosing function
// (which returns MaybeError or ApiOr<T>) when there is one.
#define RETURN_IF_API_ERROR(expr)    \
  do {                               \
    if (auto api_error_ = (expr)) {  \
      return std::move(*api_error_); \
    }                                \
  } while (0)

// obj[key], or nullptr when absent or null. REQUIRES: obj is an object.
const Json* Get(const Json& obj, const std::string& key);
// "a string", "an integer", "a number", "an object", ...
std::string TypeName(const Json& v);
// The value as the client wrote it, cut to 80 characters, for messages.
std::string Shown(const Json& v);
// "<param> must be <expected>, got <type>".
ApiError WrongType(const std::string& param, const std::string& expected, const Json& got);
// Integers, and floats with an integral value (pydantic accepts 5.0 for an
// int); false for anything else or outside int64.
bool ToInt64(const Json& v, int64_t* out);
// "param[i]".
std::string Index(const std::string& param, size_t i);

MaybeError ReadBool(const Json& obj, const std::string& key, bool* out);
MaybeError ReadInt(const Json& obj, const std::string& key, std::optional<int64_t>* out);
MaybeError ReadNumber(const Json& obj, const std::string& key, std::optional<double>* out);
MaybeError ReadString(const Json& obj, const std::string& key, std::optional<std::string>* out);
// "<param> must be in <range_text>, got <raw>" unless lo <(=) value <= hi.
MaybeError CheckRange(const std::string& param, double value, double lo, double hi, bool lo_open,
                      const char* range_text, const Json& raw);
// A number field within a range, stored as float.
MaybeError ReadRangedFloat(const Json& obj, const std::string& key, double lo, double hi, bool lo_open,
                           const char* range_text, float* out);
// An array of token ids: integers in [0, vocab_size) (int32 when the
// vocabulary is unknown); errors name the element ("prompt[1][3]").
MaybeError ReadTokenIds(const Json& arr, const std::string& param, const ProtocolLimits& limits,
                        std::vector<int32_t>* out);

}  // namespace strata::openai_fields
