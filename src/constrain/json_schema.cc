#include "constrain/json_schema.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "constrain/regex.h"

namespace strata::constrain {
namespace {

using Node = GrammarBuilder::Node;
using Json = nlohmann::ordered_json;

constexpr int kMaxIntDigits = 16;
constexpr int kMaxFracDigits = 16;
constexpr int kMaxExpDigits = 2;                          // 9999999999999999e99 still fits a double
constexpr int64_t kMaxMagnitude = 9'999'999'999'999'999;  // kMaxIntDigits nines

const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",    "description", "default",       "examples",
                                          "$schema",  "$id",         "$comment",      "deprecated",
                                          "readOnly", "writeOnly",   "discriminator", "$anchor"};
  return k;
}

const std::set<std::string>& Keywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "enum",
                                          "const",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "anyOf",
                                          "allOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "nullable",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "uniqueItems"};
  return k;
}

// The regex each supported string format is generated from (a subset of
// what the format allows: days 01-28, so every month has them).
const std::map<std::string, std::string>& Formats() {
  static const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8]))";
  static const std::string time =
      R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  static const std::map<std::string, std::string> k = {
      {"date", date},
      {"time", time},
      {"date-time", date + "T" + time},
      {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
      {"ipv4", R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
      {"email", R"([a-z0-9][a-z0-9._+-]{0,31}@[a-z0-9]{1,32}(\.[a-z0-9]{1,16}){0,2}\.[a-z]{2,8})"},
  };
  return k;
}

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& b, const Json& root) : b_(b), root_(root) {}

  StatusOr<Node> Compile(const Json& s, const std::string& path) {
    if (++depth_ > 64) return Error(path, "the schema nests deeper than 64 levels");
    StatusOr<Node> n = CompileInner(s, path);
    --depth_;
    return n;
  }

  Node AnyValue() {
    if (any_ >= 0) return b_.Ref(any_);
    any_ = b_.NewRule("json_value");
    const GrammarBuilder::Rule obj = b_.NewRule("json_object");
    const GrammarBuilder::Rule arr = b_.NewRule("json_array");
    const Node value = b_.Ref(any_);
    const Node member = b_.Seq({String(0, GrammarBuilder::kUnbounded), b_.Byte(':'), Ws(), value});
    b_.Define(obj, b_.Seq({b_.Byte('{'), b_.Optional(List(member, 1, GrammarBuilder::kUnbounded)),
                           b_.Byte('}')}));
    b_.Define(arr, b_.Seq({b_.Byte('['), b_.Optional(List(value, 1, GrammarBuilder::kUnbounded)),
                           b_.Byte(']')}));
    b_.Define(any_,
              b_.Alt({b_.Ref(obj), b_.Ref(arr), String(0, GrammarBuilder::kUnbounded),
                      Number(false), b_.Literal("true"), b_.Literal("false"), b_.Literal("null")}));
    any_object_ = obj;
    return b_.Ref(any_);
  }
  Node AnyObject() {
    AnyValue();
    return b_.Ref(any_object_);
  }

 private:
  static Status Error(const std::string& path, const std::string& msg) {
    return InvalidArgument("json schema" + (path.empty() ? "" : " at " + path) + ": " + msg);
  }
  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  Node Ws() { return b_.Optional(b_.Byte(' ')); }
  // item ("," ws item){min-1, max-1}. REQUIRES: min >= 1.
  Node List(Node item, int min, int max) {
    const Node more = b_.Seq({b_.Byte(','), Ws(), item});
    return b_.Seq(
        {item, b_.Repeat(more, min - 1, max == GrammarBuilder::kUnbounded ? max : max - 1)});
  }
  Node Char() {
    if (char_ < 0) {
      char_ = b_.NewRule("json_char");
      // Also \/ and \uXXXX escapes (not of a surrogate), which parsers take.
      ByteSet hex, hex_not_d, low;
      hex.AddRange('0', '9');
      hex.AddRange('a', 'f');
      hex.AddRange('A', 'F');
      hex_not_d = hex;
      for (char c : {'d', 'D'})
        hex_not_d.bits[static_cast<uint8_t>(c) >> 6] &= ~(uint64_t{1} << (c & 63));
      low.AddRange('0', '7');
      const Node h = b_.Bytes(hex);
      const Node u =
          b_.Seq({b_.Literal("\\u"),
                  b_.Alt({b_.Seq({b_.Bytes(hex_not_d), h}),
                          b_.Seq({b_.Alt({b_.Byte('d'), b_.Byte('D')}), b_.Bytes(low)})}),
                  h, h});
      b_.Define(char_, b_.Alt({JsonStringCodepoints(b_, {{0, 0x10FFFF}}), b_.Literal("\\/"), u}));
    }
    return b_.Ref(char_);
  }
  // A string of min..max characters, as a rule of its own per bounds: with
  // both quotes inside one rule, a string body's masks do not depend on
  // where the string stands, so the automaton shares them across places
  // and schemas (automaton.h, "Fragments").
  Node String(int min, int max) {
    auto [it, fresh] = strings_.emplace(std::pair{min, max}, -1);
    if (fresh) {
      it->second = b_.NewRule("json_string_" + std::to_string(min) + "_" +
                              (max == GrammarBuilder::kUnbounded ? "inf" : std::to_string(max)));
      b_.Define(it->second, b_.Seq({b_.Byte('"'), b_.Repeat(Char(), min, max), b_.Byte('"')}));
    }
    return b_.Ref(it->second);
  }
  Node Digits(int min, int max) {
    ByteSet d;
    d.AddRange('0', '9');
    return b_.Repeat(b_.Bytes(d), min, max);
  }
  Node Number(bool non_negative) {
    ByteSet nz, e, sign;
    nz.AddRange('1', '9');
    e.Add('e');
    e.Add('E');
    sign.Add('+');
    sign.Add('-');
    const Node integer =
        b_.Alt({b_.Byte('0'), b_.Seq({b_.Bytes(nz), Digits(0, kMaxIntDigits - 1)})});
    const Node frac = b_.Optional(b_.Seq({b_.Byte('.'), Digits(1, kMaxFracDigits)}));
    const Node exp =
        b_.Optional(b_.Seq({b_.Bytes(e), b_.Optional(b_.Bytes(sign)), Digits(1, kMaxExpDigits)}));
    std::vector<Node> parts;
    if (!non_negative) parts.push_back(b_.Optional(b_.Byte('-')));
    parts.insert(parts.end(), {integer, frac, exp});
    return b_.Seq(std::move(parts));
  }
  // Digit strings of one length from a to b (a <= b).
  Node SameLength(const std::string& a, const std::string& bnd) {
    if (a.empty()) return b_.Empty();
    if (a == bnd) return b_.Literal(a);
    const size_t rest = a.size() - 1;
    if (a[0] == bnd[0]) return b_.Seq({b_.Byte(a[0]), SameLength(a.substr(1), bnd.substr(1))});
    const std::string zeros(rest, '0'), nines(rest, '9');
    if (a.substr(1) == zeros && bnd.substr(1) == nines) {
      ByteSet s;
      s.AddRange(a[0], bnd[0]);
      return b_.Seq({b_.Bytes(s), Digits(static_cast<int>(rest), static_cast<int>(rest))});
    }
    std::vector<Node> options = {b_.Seq({b_.Byte(a[0]), SameLength(a.substr(1), nines)})};
    if (bnd[0] - a[0] >= 2) {
      ByteSet s;
      s.AddRange(a[0] + 1, bnd[0] - 1);
      options.push_back(
          b_.Seq({b_.Bytes(s), Digits(static_cast<int>(rest), static_cast<int>(rest))}));
    }
    options.push_back(b_.Seq({b_.Byte(bnd[0]), SameLength(zeros, bnd.substr(1))}));
    return b_.Alt(std::move(options));
  }
  // Decimal integers in [lo, hi], 0 <= lo <= hi, without leading zeros.
  Node NonNegativeRange(int64_t lo, int64_t hi) {
    std::vector<Node> options;
    int64_t low = 0, high = 9;
    for (int n = 1; n <= kMaxIntDigits; ++n, low = high + 1, high = high * 10 + 9) {
      const int64_t a = std::max(lo, low), z = std::min(hi, high);
      if (a <= z) options.push_back(SameLength(std::to_string(a), std::to_string(z)));
    }
    return b_.Alt(std::move(options));
  }
  Node IntegerRange(int64_t lo, int64_t hi) {
    std::vector<Node> options;
    if (hi >= 0) options.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
    if (lo < 0)
      options.push_back(b_.Seq(
          {b_.Byte('-'), NonNegativeRange(std::max<int64_t>(1, -std::min<int64_t>(hi, -1)), -lo)}));
    return b_.Alt(std::move(options));
  }

  StatusOr<Node> Ref(const std::string& ref, const std::string& path) {
    auto it = refs_.find(ref);
    if (it != refs_.end()) return b_.Ref(it->second);
    const Json* target = nullptr;
    if (ref == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (ref.compare(0, p.size(), p) != 0) continue;
        const std::string section = p.substr(2, p.size() - 3), name = ref.substr(p.size());
        if (root_.contains(section) && root_[section].is_object() && root_[section].contains(name))
          target = &root_[section][name];
      }
    }
    if (!target)
      return Error(path, "$ref " + ref +
                             " does not resolve; only local references (#, #/$defs/name, "
                             "#/definitions/name) are supported");
    const GrammarBuilder::Rule r = b_.NewRule("ref " + ref);
    refs_.emplace(ref, r);
    ASSIGN_OR_RETURN(Node body, Compile(*target, ref));
    b_.Define(r, body);
    return b_.Ref(r);
  }

  StatusOr<Node> CompileInner(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValue();
      return Error(path, "the schema false allows no value");
    }
    if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!Keywords().count(it.key()) && !Annotations().count(it.key()))
        return Error(Join(path, it.key()),
                     "the keyword '" + it.key() +
                         "' is not supported by this server's constrained decoding (see "
                         "docs/architecture/constrain.md for the supported subset)");
    }
    auto structural = [&](const std::set<std::string>& allowed) -> Status {
      for (auto it = s.begin(); it != s.end(); ++it) {
        if (Keywords().count(it.key()) && !allowed.count(it.key()) && it.key() != "$defs" &&
            it.key() != "definitions")
          return Error(Join(path, it.key()),
                       "'" + it.key() + "' cannot be combined with " + *allowed.begin() + " here");
      }
      return OkStatus();
    };
    if (s.contains("$ref")) {
      RETURN_IF_ERROR(structural({"$ref"}));
      if (!s["$ref"].is_string()) return Error(Join(path, "$ref"), "$ref must be a string");
      return Ref(s["$ref"].get<std::string>(), path);
    }
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean())
        return Error(Join(path, "nullable"), "nullable must be a boolean");
      if (s["nullable"].get<bool>()) {
        Json inner = s;
        inner.erase("nullable");
        ASSIGN_OR_RETURN(Node n, Compile(inner, path));
        return b_.Alt({n, b_.Literal("null")});
      }
    }
    if (s.contains("const")) return b_.Literal(s["const"].dump());
    if (s.contains("enum")) {
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty())
        return Error(Join(path, "enum"), "enum must be a non-empty array");
      std::vector<Node> options;
      for (const Json& v : e) options.push_back(b_.Literal(v.dump()));
      return b_.Alt(std::move(options));
    }
    if (s.contains("anyOf")) {
      RETURN_IF_ERROR(structural({"anyOf"}));
      const Json& a = s["anyOf"];
      if (!a.is_array() || a.empty())
        return Error(Join(path, "anyOf"), "anyOf must be a non-empty array of schemas");
      std::vector<Node> options;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSIGN_OR_RETURN(Node n, Compile(a[i], Join(path, "anyOf[" + std::to_string(i) + "]")));
        options.push_back(n);
      }
      return b_.Alt(std::move(options));
    }
    if (s.contains("allOf")) {
      RETURN_IF_ERROR(structural({"allOf"}));
      const Json& a = s["allOf"];
      if (!a.is_array() || a.size() != 1)
        return Error(Join(path, "allOf"),
                     "allOf is supported with exactly one schema (merge the schemas into one)");
      return Compile(a[0], Join(path, "allOf[0]"));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Error(Join(path, "type"), "type entries must be strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Error(Join(path, "type"), "type must be a string or a non-empty array of strings");
      }
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
               s.contains("maxLength")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return AnyValue();
    }
    std::vector<Node> options;
    for (const std::string& t : types) {
      ASSIGN_OR_RETURN(Node n, Typed(t, s, path));
      options.push_back(n);
    }
    return b_.Alt(std::move(options));
  }

  // An optional non-negative integer keyword.
  StatusOr<int> Count(const Json& s, const char* key, const std::string& path, int dflt) {
    if (!s.contains(key)) return dflt;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return Error(Join(path, key), std::string(key) + " must be a non-negative integer");
    if (v.get<int64_t>() > 100000)
      return Error(Join(path, key), std::string(key) + " above 100000 is not supported");
    return static_cast<int>(v.get<int64_t>());
  }

  StatusOr<Node> Typed(const std::string& t, const Json& s, const std::string& path) {
    if (t == "null") return b_.Literal("null");
    if (t == "boolean") return b_.Alt({b_.Literal("true"), b_.Literal("false")});
    if (t == "string") return StringSchema(s, path);
    if (t == "integer") return IntegerSchema(s, path);
    if (t == "number") {
      for (const char* k : {"maximum", "exclusiveMaximum"}) {
        if (s.contains(k))
          return Error(Join(path, k), std::string(k) +
                                          " is supported for integers only (a number's bound "
                                          "is not supported; use type integer, or minimum 0)");
      }
      bool non_negative = false;
      if (s.contains("minimum")) {
        if (!s["minimum"].is_number() || s["minimum"].get<double>() != 0)
          return Error(Join(path, "minimum"),
                       "a number's minimum is supported only as 0 (use type integer for other "
                       "bounds)");
        non_negative = true;
      }
      if (s.contains("exclusiveMinimum"))
        return Error(Join(path, "exclusiveMinimum"),
                     "exclusiveMinimum is supported for integers only");
      return Number(non_negative);
    }
    if (t == "object") return ObjectSchema(s, path);
    if (t == "array") return ArraySchema(s, path);
    return Error(
        Join(path, "type"),
        "unknown type '" + t + "' (string, number, integer, boolean, object, array, null)");
  }

  StatusOr<Node> StringSchema(const Json& s, const std::string& path) {
    ASSIGN_OR_RETURN(int min, Count(s, "minLength", path, 0));
    ASSIGN_OR_RETURN(int max, Count(s, "maxLength", path, GrammarBuilder::kUnbounded));
    if (max != GrammarBuilder::kUnbounded && max < min)
      return Error(Join(path, "maxLength"), "maxLength is below minLength");
    const bool lengths = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    std::string which;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string())
        return Error(Join(path, "pattern"), "pattern must be a string");
      pattern = s["pattern"].get<std::string>();
      which = "pattern";
    } else if (s.contains("format")) {
      if (!s["format"].is_string()) return Error(Join(path, "format"), "format must be a string");
      const std::string f = s["format"].get<std::string>();
      auto it = Formats().find(f);
      if (it == Formats().end())
        return Error(Join(path, "format"), "the string format '" + f +
                                               "' is not supported (date, time, date-time, uuid, "
                                               "ipv4, email are)");
      pattern = it->second;
      which = "format";
    }
    if (which.empty()) return String(min, max);
    if (lengths)
      return Error(Join(path, which),
                   which +
                       " together with minLength/maxLength is not supported (put the length "
                       "into the pattern)");
    auto n = CompileRegex(b_, pattern, JsonStringCodepoints);
    if (!n.ok()) return Error(Join(path, which), n.status().message());
    return b_.Seq({b_.Byte('"'), n.value(), b_.Byte('"')});
  }

  StatusOr<Node> IntegerSchema(const Json& s, const std::string& path) {
    int64_t lo = -kMaxMagnitude, hi = kMaxMagnitude;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const Json& v = s[k];
      if (!v.is_number()) return Error(Join(path, k), std::string(k) + " must be a number");
      const double d = v.get<double>();
      const std::string key = k;
      const bool lower = key == "minimum" || key == "exclusiveMinimum";
      const bool exclusive = key.rfind("exclusive", 0) == 0;
      double bound = lower ? std::ceil(d) : std::floor(d);
      if (exclusive && bound == d) bound += lower ? 1 : -1;
      const double clamped =
          std::max<double>(-kMaxMagnitude, std::min<double>(kMaxMagnitude, bound));
      if (lower)
        lo = std::max(lo, static_cast<int64_t>(clamped));
      else
        hi = std::min(hi, static_cast<int64_t>(clamped));
    }
    if (lo > hi) return Error(path, "the integer bounds allow no value");
    return IntegerRange(lo, hi);
  }

  StatusOr<Node> ObjectSchema(const Json& s, const std::string& path) {
    static const Json kEmpty = Json::object();
    const Json& props = s.contains("properties") ? s["properties"] : kEmpty;
    if (!props.is_object()) return Error(Join(path, "properties"), "properties must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      const Json& r = s["required"];
      if (!r.is_array()) return Error(Join(path, "required"), "required must be an array");
      for (const Json& name : r) {
        if (!name.is_string())
          return Error(Join(path, "required"), "required names must be strings");
        if (!props.contains(name.get<std::string>()))
          return Error(Join(path, "required"), "the required property '" + name.get<std::string>() +
                                                   "' is not in properties (add its schema there)");
        required.insert(name.get<std::string>());
      }
    }
    const Json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && !extra->is_boolean() && !extra->is_object())
      return Error(Join(path, "additionalProperties"),
                   "additionalProperties must be a boolean or a schema");
    if (props.empty()) {
      if (extra && extra->is_boolean() && !extra->get<bool>()) return b_.Literal("{}");
      if (!extra || extra->is_boolean()) return AnyObject();
      ASSIGN_OR_RETURN(Node value, Compile(*extra, Join(path, "additionalProperties")));
      const Node member =
          b_.Seq({String(0, GrammarBuilder::kUnbounded), b_.Byte(':'), Ws(), value});
      return b_.Seq(
          {b_.Byte('{'), b_.Optional(List(member, 1, GrammarBuilder::kUnbounded)), b_.Byte('}')});
    }
    // Properties in the schema's order; tail(i, comma): the members from i
    // on, comma: whether one was written before.
    std::vector<Node> kv;
    std::vector<bool> is_required;
    for (auto it = props.begin(); it != props.end(); ++it) {
      ASSIGN_OR_RETURN(Node value, Compile(*it, Join(path, "properties." + it.key())));
      kv.push_back(b_.Seq({b_.Literal(Json(it.key()).dump()), b_.Byte(':'), Ws(), value}));
      is_required.push_back(required.count(it.key()) > 0);
    }
    const size_t n = kv.size();
    std::vector<std::array<GrammarBuilder::Rule, 2>> tail(n + 1);
    for (size_t i = 0; i <= n; ++i)
      for (int c = 0; c < 2; ++c) tail[i][c] = b_.NewRule("object tail");
    for (size_t i = n + 1; i-- > 0;) {
      for (int c = 0; c < 2; ++c) {
        if (i == n) {
          b_.Define(tail[i][c], b_.Empty());
          continue;
        }
        const Node comma = c ? b_.Seq({b_.Byte(','), Ws()}) : b_.Empty();
        const Node take = b_.Seq({comma, kv[i], b_.Ref(tail[i + 1][1])});
        b_.Define(tail[i][c], is_required[i] ? take : b_.Alt({take, b_.Ref(tail[i + 1][c])}));
      }
    }
    return b_.Seq({b_.Byte('{'), b_.Ref(tail[0][0]), b_.Byte('}')});
  }

  StatusOr<Node> ArraySchema(const Json& s, const std::string& path) {
    if (s.contains("uniqueItems") &&
        !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()))
      return Error(Join(path, "uniqueItems"), "uniqueItems true is not supported");
    ASSIGN_OR_RETURN(int min, Count(s, "minItems", path, 0));
    ASSIGN_OR_RETURN(int max, Count(s, "maxItems", path, GrammarBuilder::kUnbounded));
    if (max != GrammarBuilder::kUnbounded && max < min)
      return Error(Join(path, "maxItems"), "maxItems is below minItems");
    std::vector<Node> prefix;
    if (s.contains("prefixItems")) {
      const Json& p = s["prefixItems"];
      if (!p.is_array()) return Error(Join(path, "prefixItems"), "prefixItems must be an array");
      if (s.contains("minItems") || s.contains("maxItems"))
        return Error(Join(path, "prefixItems"),
                     "prefixItems together with minItems/maxItems is not supported");
      for (size_t i = 0; i < p.size(); ++i) {
        ASSIGN_OR_RETURN(Node n,
                         Compile(p[i], Join(path, "prefixItems[" + std::to_string(i) + "]")));
        prefix.push_back(n);
      }
    }
    bool more = true;
    Node item = -1;
    if (s.contains("items")) {
      const Json& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        more = false;
      } else {
        ASSIGN_OR_RETURN(item, Compile(it, Join(path, "items")));
      }
    } else {
      item = AnyValue();
    }
    if (!prefix.empty()) {
      std::vector<Node> parts = {b_.Byte('['), prefix[0]};
      for (size_t i = 1; i < prefix.size(); ++i)
        parts.insert(parts.end(), {b_.Byte(','), Ws(), prefix[i]});
      if (more)
        parts.push_back(
            b_.Repeat(b_.Seq({b_.Byte(','), Ws(), item}), 0, GrammarBuilder::kUnbounded));
      parts.push_back(b_.Byte(']'));
      return b_.Seq(std::move(parts));
    }
    if (!more || max == 0) {
      if (min > 0) return Error(Join(path, "minItems"), "minItems > 0 with no items allowed");
      return b_.Literal("[]");
    }
    const Node list = List(item, std::max(min, 1), max);
    return b_.Seq({b_.Byte('['), min == 0 ? b_.Optional(list) : list, b_.Byte(']')});
  }

  GrammarBuilder& b_;
  const Json& root_;
  std::map<std::string, GrammarBuilder::Rule> refs_;
  GrammarBuilder::Rule any_ = -1, any_object_ = -1, char_ = -1;
  std::map<std::pair<int, int>, GrammarBuilder::Rule> strings_;  // (min, max) -> String rule
  int depth_ = 0;
};

}  // namespace

StatusOr<GrammarBuilder::Node> CompileJsonSchema(GrammarBuilder& b,
                                                 const nlohmann::ordered_json& schema) {
  SchemaCompiler c(b, schema);
  return c.Compile(schema, "");
}

GrammarBuilder::Node AnyJsonObject(GrammarBuilder& b) {
  static const Json kNone = Json::object();
  SchemaCompiler c(b, kNone);
  return c.AnyObject();
}

}  // namespace strata::constrain
