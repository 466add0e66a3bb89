#include "model/jinja/jinja_value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace strata::jinja {

void Fail(std::string message) { throw RenderError{std::move(message), false}; }

size_t Dict::Position(std::string_view key) const {
  if (indexed_ > 0) {
    auto it = index_.find(key);
    if (it != index_.end()) return it->second;
  }
  for (size_t i = indexed_; i < items.size(); ++i)
    if (items[i].first == key) return i;
  return items.size();
}

const Value* Dict::Find(std::string_view key) const {
  size_t i = Position(key);
  return i < items.size() ? &items[i].second : nullptr;
}

void Dict::Set(const std::string& key, Value v) {
  if (size_t i = Position(key); i < items.size()) {
    items[i].second = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
  if (items.size() >= kIndexFrom) Index();
}

void Dict::Index() {
  if (items.size() < kIndexFrom) return;
  for (; indexed_ < items.size(); ++indexed_) index_.emplace(items[indexed_].first, indexed_);
}

Value Value::MakeNamespace(Dict d) {
  Value v;
  v.v_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::MakeTuple(List l) {
  Value v(std::move(l));
  v.tuple_ = true;
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return MakeNone();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(FromJson(e));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(it.key(), FromJson(it.value()));
      d.Index();
      return Value(std::move(d));
    }
    default:
      return MakeNone();  // binary / discarded: not produced by JSON text
  }
}

double Value::ToDouble() const {
  switch (kind()) {
    case Kind::kBool:
      return as_bool() ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(as_int());
    case Kind::kFloat:
      return as_float();
    default:
      Fail("expected a number, got " + TypeName());
  }
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().empty();
    case Kind::kDict:
      return !as_dict().items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

// ---- UTF-8 ----------------------------------------------------------------

std::vector<uint32_t> DecodeUtf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                          static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // invalid byte: keep it as U+FFFD, as Python's "replace" would
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(static_cast<uint32_t>(cp));
    i += static_cast<size_t>(n);
  }
  return out;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(out, cps[i]);
  return out;
}

bool IsPyWhitespace(uint32_t c) {
  // str.isspace(): bidi class WS/B/S or category Zs.
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  bool use_set = !(chars.is_none() || chars.is_undefined());
  if (use_set) {
    if (!chars.is_string()) Fail("strip arg must be None or str, not " + chars.TypeName());
    set = DecodeUtf8(chars.as_string());
  }
  auto strip_it = [&](uint32_t c) {
    return use_set ? std::find(set.begin(), set.end(), c) != set.end() : IsPyWhitespace(c);
  };
  // Decode only at the two ends: contents can be long.
  auto decode_at = [&](size_t i, size_t* len) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                          static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      *len = 1;
      return uint32_t{0xFFFD};
    }
    *len = static_cast<size_t>(n);
    return static_cast<uint32_t>(cp);
  };
  size_t b = 0, e = s.size(), n = 0;
  if (left)
    while (b < e && strip_it(decode_at(b, &n))) b += n;
  if (right) {
    while (e > b) {
      size_t p = e - 1;
      while (p > b && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
      if (!strip_it(decode_at(p, &n)) || p + n != e) break;
      e = p;
    }
  }
  return s.substr(b, e - b);
}

// ---- printing ---------------------------------------------------------------

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+02", shortest round-trip
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." +
             digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

namespace {

bool IsPrintable(uint32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string PyStrRepr(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  bool has_single = false, has_double = false;
  for (uint32_t c : cps) {
    has_single |= c == '\'';
    has_double |= c == '"';
  }
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t c : cps) {
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x7F ? c < 0x20 : !IsPrintable(c)) {
      char b[16];
      if (c <= 0xFF)
        std::snprintf(b, sizeof(b), "\\x%02x", c);
      else if (c <= 0xFFFF)
        std::snprintf(b, sizeof(b), "\\u%04x", c);
      else
        std::snprintf(b, sizeof(b), "\\U%08x", c);
      out += b;
    } else {
      AppendUtf8(out, c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return PyFloatRepr(as_float());
    case Kind::kString:
      return PyStrRepr(as_string());
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      bool first = true;
      for (const Value& v : as_list()) {
        if (!first) out += ", ";
        first = false;
        out += v.Repr();
      }
      if (tuple_ && as_list().size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      const Dict& d = is_dict() ? as_dict() : namespace_dict();
      std::string out = is_dict() ? "{" : "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : d.items) {
        if (!first) out += ", ";
        first = false;
        out += PyStrRepr(k) + ": " + v.Repr();
      }
      return out + (is_dict() ? "}" : "}>");
    }
    case Kind::kCallable:
      return "<function " + as_callable().name + ">";
  }
  return "";
}

// ---- comparison --------------------------------------------------------------

bool Value::Equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (!is_float() && !o.is_float()) {
      int64_t a = is_bool() ? as_bool() : as_int();
      int64_t b = o.is_bool() ? o.as_bool() : o.as_int();
      return a == b;
    }
    return ToDouble() == o.ToDouble();
  }
  if (kind() != o.kind()) return false;
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return as_string() == o.as_string();
    case Kind::kList: {
      if (tuple_ != o.tuple_) return false;  // Python: (1,) != [1]
      const List &a = as_list(), &b = o.as_list();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!a[i].Equals(b[i])) return false;
      return true;
    }
    case Kind::kDict: {
      const Dict &a = as_dict(), &b = o.as_dict();
      if (a.items.size() != b.items.size()) return false;
      for (const auto& [k, v] : a.items) {
        const Value* w = b.Find(k);
        if (!w || !v.Equals(*w)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &namespace_dict() == &o.namespace_dict();
    case Kind::kCallable:
      return &as_callable() == &o.as_callable();
    default:
      return false;
  }
}

bool Value::Less(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (!is_float() && !o.is_float()) {
      int64_t a = is_bool() ? as_bool() : as_int();
      int64_t b = o.is_bool() ? o.as_bool() : o.as_int();
      return a < b;
    }
    return ToDouble() < o.ToDouble();
  }
  if (is_string() && o.is_string())
    return as_string() < o.as_string();  // UTF-8 order = code point order
  if (is_list() && o.is_list()) {
    const List &a = as_list(), &b = o.as_list();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!a[i].Equals(b[i])) return a[i].Less(b[i]);
    }
    return a.size() < b.size();
  }
  Fail("'<' not supported between instances of '" + TypeName() + "' and '" + o.TypeName() + "'");
}

List Value::Iterate() const {
  switch (kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return as_list();
    case Kind::kDict: {
      List keys;
      for (const auto& kv : as_dict().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      List chars;
      std::vector<uint32_t> cps = DecodeUtf8(as_string());
      for (size_t i = 0; i < cps.size(); ++i) chars.emplace_back(EncodeUtf8(cps, i, i + 1));
      return chars;
    }
    default:
      Fail("'" + TypeName() + "' object is not iterable");
  }
}

int64_t Value::Length() const {
  switch (kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString: {
      int64_t n = 0;
      for (unsigned char c : as_string()) n += (c & 0xC0) != 0x80;
      return n;
    }
    case Kind::kList:
      return static_cast<int64_t>(as_list().size());
    case Kind::kDict:
      return static_cast<int64_t>(as_dict().items.size());
    default:
      Fail("object of type '" + TypeName() + "' has no len()");
  }
}

// ---- json.dumps ---------------------------------------------------------------

namespace {

void JsonString(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (uint32_t c : DecodeUtf8(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char b[16];
        if (c < 0x20) {
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else if (ensure_ascii && c > 0x7E) {
          if (c >= 0x10000) {
            uint32_t v = c - 0x10000;
            std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(b, sizeof(b), "\\u%04x", c);
          }
          out += b;
        } else {
          AppendUtf8(out, c);
        }
      }
    }
  }
  out += '"';
}

struct JsonWriter {
  bool ensure_ascii;
  bool sort_keys;
  bool pretty;
  std::string indent_unit;
  std::string item_sep;
  std::string key_sep;
  std::string out;
  size_t max_bytes = SIZE_MAX;

  void Newline(int depth) {
    out += '\n';
    for (int i = 0; i < depth; ++i) out += indent_unit;
    if (out.size() > max_bytes)
      Fail("tojson builds text over the " + std::to_string(max_bytes) + "-byte limit");
  }

  void Write(const Value& v, int depth) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat: {
        double d = v.as_float();
        if (std::isnan(d))
          out += "NaN";
        else if (std::isinf(d))
          out += d < 0 ? "-Infinity" : "Infinity";
        else
          out += PyFloatRepr(d);
        return;
      }
      case Value::Kind::kString:
        JsonString(out, v.as_string(), ensure_ascii);
        return;
      case Value::Kind::kList: {
        const List& l = v.as_list();
        if (l.empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < l.size(); ++i) {
          if (i) out += item_sep;
          if (pretty) Newline(depth + 1);
          Write(l[i], depth + 1);
        }
        if (pretty) Newline(depth);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& kv : v.as_dict().items) items.push_back(&kv);
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(),
                           [](auto* a, auto* b) { return a->first < b->first; });
        if (items.empty()) {
          out += "{}";
          return;
        }
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          if (pretty) Newline(depth + 1);
          JsonString(out, items[i]->first, ensure_ascii);
          out += key_sep;
          Write(items[i]->second, depth + 1);
        }
        if (pretty) Newline(depth);
        out += '}';
        return;
      }
      default:
        Fail("Object of type " + v.TypeName() + " is not JSON serializable");
    }
  }
};

}  // namespace

std::string JsonDumps(const Value& v, bool ensure_ascii, const Value& indent,
                      const Value& separators, bool sort_keys, size_t max_bytes) {
  JsonWriter w;
  w.max_bytes = max_bytes;
  w.ensure_ascii = ensure_ascii;
  w.sort_keys = sort_keys;
  w.pretty = !(indent.is_none() || indent.is_undefined());
  if (w.pretty) {
    if (indent.is_int() || indent.is_bool()) {
      const int64_t width =
          std::max<int64_t>(0, indent.is_bool() ? indent.as_bool() : indent.as_int());
      if (static_cast<uint64_t>(width) > max_bytes)
        Fail("tojson: indent " + std::to_string(width) + " is over the " +
             std::to_string(max_bytes) + "-byte limit");
      w.indent_unit = std::string(static_cast<size_t>(width), ' ');
    } else if (indent.is_string())
      w.indent_unit = indent.as_string();
    else
      Fail("tojson: indent must be an int or a string, not " + indent.TypeName());
  }
  w.item_sep = w.pretty ? "," : ", ";
  w.key_sep = ": ";
  if (!(separators.is_none() || separators.is_undefined())) {
    if (!separators.is_list() || separators.as_list().size() != 2 ||
        !separators.as_list()[0].is_string() || !separators.as_list()[1].is_string())
      Fail("tojson: separators must be a pair of strings");
    w.item_sep = separators.as_list()[0].as_string();
    w.key_sep = separators.as_list()[1].as_string();
  }
  w.Write(v, 0);
  return std::move(w.out);
}

}  // namespace strata::jinja
