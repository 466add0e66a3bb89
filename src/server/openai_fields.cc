#include "server/openai_fields.h"

#include <cmath>
#include <limits>

namespace strata::openai_fields {

const Json* Get(const Json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    default:
      return "an unsupported value";
  }
}

// The value as the client wrote it, for messages ("3.5", "\"abc\"").
std::string Shown(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

ApiError WrongType(const std::string& param, const std::string& expected, const Json& got) {
  return InvalidRequestError(param, param + " must be " + expected + ", got " + TypeName(got));
}

// Integers, and floats with an integral value (pydantic accepts 5.0 for int).
bool ToInt64(const Json& v, int64_t* out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < -9.2e18 || d > 9.2e18) return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

MaybeError ReadBool(const Json& obj, const std::string& key, bool* out) {
  const Json* v = Get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

MaybeError ReadInt(const Json& obj, const std::string& key, std::optional<int64_t>* out) {
  const Json* v = Get(obj, key);
  if (!v) return std::nullopt;
  int64_t i = 0;
  if (v->is_boolean() || !v->is_number() || !ToInt64(*v, &i)) {
    if (v->is_number()) return InvalidRequestError(key, key + " must be an integer, got " + Shown(*v));
    return WrongType(key, "an integer", *v);
  }
  *out = i;
  return std::nullopt;
}

MaybeError ReadNumber(const Json& obj, const std::string& key, std::optional<double>* out) {
  const Json* v = Get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return WrongType(key, "a number", *v);
  *out = v->get<double>();
  return std::nullopt;
}

MaybeError ReadString(const Json& obj, const std::string& key, std::optional<std::string>* out) {
  const Json* v = Get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return WrongType(key, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

// "top_p must be in (0, 1], got 0".
MaybeError CheckRange(const std::string& param, double value, double lo, double hi, bool lo_open,
                      const char* range_text, const Json& raw) {
  bool ok = (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return std::nullopt;
  return InvalidRequestError(param, param + " must be in " + range_text + ", got " + Shown(raw));
}

// A float field in a range; unset keeps *out.
MaybeError ReadRangedFloat(const Json& obj, const std::string& key, double lo, double hi, bool lo_open,
                           const char* range_text, float* out) {
  std::optional<double> v;
  RETURN_IF_API_ERROR(ReadNumber(obj, key, &v));
  if (!v) return std::nullopt;
  RETURN_IF_API_ERROR(CheckRange(key, *v, lo, hi, lo_open, range_text, obj.at(key)));
  *out = static_cast<float>(*v);
  return std::nullopt;
}

// A token id list: non-negative int32 ids, below vocab_size when known.
MaybeError ReadTokenIds(const Json& arr, const std::string& param, const ProtocolLimits& limits,
                        std::vector<int32_t>* out) {
  out->reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    std::string p = param + "[" + std::to_string(i) + "]";
    int64_t id = 0;
    if (!arr[i].is_number() || !ToInt64(arr[i], &id)) return WrongType(p, "a token id (integer)", arr[i]);
    int64_t hi = limits.vocab_size > 0 ? limits.vocab_size - 1 : std::numeric_limits<int32_t>::max();
    if (id < 0 || id > hi) {
      return InvalidRequestError(p, p + " must be a token id in [0, " + std::to_string(hi) + "], got " +
                                        std::to_string(id));
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

std::string Index(const std::string& param, size_t i) { return param + "[" + std::to_string(i) + "]"; }

}  // namespace strata::openai_fields
