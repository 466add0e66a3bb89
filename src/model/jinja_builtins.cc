#include "model/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <unordered_map>

#include "model/jinja_interp.h"

namespace strata::jinja {

Value CallArgs::Get(size_t i, std::string_view name, Value fallback) const {
  if (i < pos.size()) return pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return fallback;
}

namespace {

using FilterFn = std::function<Value(const Value&, CallArgs&, Interpreter&)>;
using TestFn = std::function<bool(const Value&, CallArgs&, Interpreter&)>;

[[noreturn]] void FailUndefined(const Value& v) {
  Fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

const std::string& RequireString(const Value& v, const char* what) {
  if (!v.is_string()) Fail(std::string(what) + " expects a string, got " + v.TypeName());
  return v.as_string();
}

// ---- str helpers with Python semantics ----

uint32_t MapCase(uint32_t c, int how) {  // 0 lower, 1 upper, 2 title
  auto cp = static_cast<utf8proc_int32_t>(c);
  return static_cast<uint32_t>(how == 0 ? utf8proc_tolower(cp) : how == 1 ? utf8proc_toupper(cp) : utf8proc_totitle(cp));
}

bool IsCased(uint32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

bool IsAlpha(uint32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

std::string MapString(const std::string& s, int how) {
  std::string out;
  for (uint32_t c : DecodeUtf8(s)) AppendUtf8(out, MapCase(c, how));
  return out;
}

std::string PyCapitalize(const std::string& s) {
  std::vector<uint32_t> cps = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) AppendUtf8(out, MapCase(cps[i], i == 0 ? 2 : 0));
  return out;
}

std::string PyTitle(const std::string& s) {  // str.title()
  std::string out;
  bool prev_cased = false;
  for (uint32_t c : DecodeUtf8(s)) {
    if (IsCased(c)) {
      AppendUtf8(out, MapCase(c, prev_cased ? 0 : 2));
      prev_cased = true;
    } else {
      AppendUtf8(out, c);
      prev_cased = false;
    }
  }
  return out;
}

std::string JinjaTitle(const std::string& s) {
  // jinja2's title filter: words start after runs of [-\s(\{\[<].
  std::string out;
  bool word_start = true;
  for (uint32_t c : DecodeUtf8(s)) {
    bool sep = IsPyWhitespace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      AppendUtf8(out, c);
      word_start = true;
    } else {
      AppendUtf8(out, MapCase(c, word_start ? 1 : 0));
      word_start = false;
    }
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between every character
    std::vector<uint32_t> cps = DecodeUtf8(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (i < cps.size()) AppendUtf8(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++n;
  }
  out.append(s, pos);
  return out;
}

List Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (sep.is_none() || sep.is_undefined()) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPyWhitespace(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t b = i;
      while (i < cps.size() && !IsPyWhitespace(cps[i])) ++i;
      words.emplace_back(b, i);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        size_t b = words[static_cast<size_t>(maxsplit)].first;
        size_t e = cps.size();
        while (e > b && IsPyWhitespace(cps[e - 1])) --e;
        words.resize(static_cast<size_t>(maxsplit));
        words.emplace_back(b, e);
      } else {
        size_t keep = static_cast<size_t>(maxsplit);
        size_t e = words[words.size() - keep - 1].second;
        size_t b = 0;
        while (b < e && IsPyWhitespace(cps[b])) ++b;
        std::vector<std::pair<size_t, size_t>> w2{{b, e}};
        w2.insert(w2.end(), words.end() - static_cast<std::ptrdiff_t>(keep), words.end());
        words = std::move(w2);
      }
    }
    for (auto [b, e] : words) parts.emplace_back(EncodeUtf8(cps, b, e));
    return parts;
  }
  const std::string& d = RequireString(sep, "split");
  if (d.empty()) Fail("empty separator");
  std::vector<std::string> pieces;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    pieces.push_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  pieces.push_back(s.substr(pos));
  if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) > maxsplit + 1) {
    size_t m = static_cast<size_t>(maxsplit);
    std::vector<std::string> merged;
    if (!from_right) {
      merged.assign(pieces.begin(), pieces.begin() + static_cast<std::ptrdiff_t>(m));
      std::string rest = pieces[m];
      for (size_t i = m + 1; i < pieces.size(); ++i) rest += d + pieces[i];
      merged.push_back(rest);
    } else {
      size_t head = pieces.size() - m;
      std::string rest = pieces[0];
      for (size_t i = 1; i < head; ++i) rest += d + pieces[i];
      merged.push_back(rest);
      merged.insert(merged.end(), pieces.begin() + static_cast<std::ptrdiff_t>(head), pieces.end());
    }
    pieces = std::move(merged);
  }
  for (auto& p : pieces) parts.emplace_back(std::move(p));
  return parts;
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = RequireString(a, prefix ? "startswith" : "endswith");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

int64_t ToInt(const Value& v, const char* what) {
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  Fail(std::string(what) + " expects an integer, got " + v.TypeName());
}

Value StrMethod(const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "startswith" || name == "endswith") return Value(AffixMatch(s, a.Get(0, "prefix"), name[0] == 's'));
  if (name == "strip") return Value(PyStrip(s, a.Get(0, "chars"), true, true));
  if (name == "lstrip") return Value(PyStrip(s, a.Get(0, "chars"), true, false));
  if (name == "rstrip") return Value(PyStrip(s, a.Get(0, "chars"), false, true));
  if (name == "split" || name == "rsplit")
    return Value(Split(s, a.Get(0, "sep"), ToInt(a.Get(1, "maxsplit", Value(-1)), "maxsplit"), name[0] == 'r'));
  if (name == "upper") return Value(MapString(s, 1));
  if (name == "lower") return Value(MapString(s, 0));
  if (name == "title") return Value(PyTitle(s));
  if (name == "capitalize") return Value(PyCapitalize(s));
  if (name == "replace")
    return Value(Replace(s, RequireString(a.Get(0, "old"), "replace"), RequireString(a.Get(1, "new"), "replace"),
                         ToInt(a.Get(2, "count", Value(-1)), "count")));
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    const std::string& sub = RequireString(a.Get(0, "sub"), name.c_str());
    if (name == "count") {
      if (sub.empty()) return Value(Value(s).Length() + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") Fail("substring not found");
      return Value(-1);
    }
    return Value(Value(s.substr(0, p)).Length());
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& v : a.Get(0, "iterable").Iterate()) {
      if (!first) out += s;
      first = false;
      out += RequireString(v, "str.join");
    }
    return Value(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    size_t b = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        out.emplace_back(s.substr(b, i - b));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        b = i + 1;
      }
    }
    if (b < s.size()) out.emplace_back(s.substr(b));
    return Value(std::move(out));
  }
  auto all = [&](auto pred) {
    std::vector<uint32_t> cps = DecodeUtf8(s);
    if (cps.empty()) return Value(false);
    for (uint32_t c : cps)
      if (!pred(c)) return Value(false);
    return Value(true);
  };
  if (name == "isdigit") return all([](uint32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all(IsAlpha);
  if (name == "isalnum") return all([](uint32_t c) { return IsAlpha(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return all(IsPyWhitespace);
  if (name == "islower" || name == "isupper") {
    bool any_cased = false;
    bool want_lower = name == "islower";
    for (uint32_t c : DecodeUtf8(s)) {
      if (!IsCased(c)) continue;
      any_cased = true;
      if ((MapCase(c, want_lower ? 0 : 1) != c)) return Value(false);
    }
    return Value(any_cased);
  }
  Fail("str has no method '" + name + "'");
}

bool IsStrMethod(const std::string& n) {
  static const char* kNames[] = {"startswith", "endswith", "strip",  "lstrip",    "rstrip",  "split",   "rsplit",
                                 "upper",      "lower",    "title",  "capitalize", "replace", "find",    "rfind",
                                 "count",      "index",    "join",   "splitlines", "isdigit", "isalpha", "isalnum",
                                 "isspace",    "islower",  "isupper"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool IsUnsafeMutator(const Value& obj, const std::string& n) {
  static const char* kList[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  static const char* kDict[] = {"pop", "popitem", "setdefault", "update", "clear"};
  if (obj.is_list())
    for (const char* k : kList)
      if (n == k) return true;
  if (obj.is_dict())
    for (const char* k : kDict)
      if (n == k) return true;
  return false;
}

Value Bound(const Value& self, const std::string& name, std::function<Value(const Value&, CallArgs&)> fn) {
  return Value(Callable{name, [self, fn](CallArgs& a, Interpreter&) { return fn(self, a); }});
}

}  // namespace

// ---- attribute and item access ----

Value GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      FailUndefined(obj);
    case Value::Kind::kDict: {
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        return Bound(obj, name, [name](const Value& self, CallArgs& a) -> Value {
          const Dict& d = self.as_dict();
          if (name == "get") {
            Value key = a.Get(0, "key");
            const Value* v = key.is_string() ? d.Find(key.as_string()) : nullptr;
            return v ? *v : a.Get(1, "default");
          }
          List out;
          for (const auto& [k, v] : d.items) {
            if (name == "items") out.push_back(Value::MakeTuple(List{Value(k), v}));
            else if (name == "keys") out.emplace_back(k);
            else out.push_back(v);
          }
          return Value(std::move(out));
        });
      }
      if (IsUnsafeMutator(obj, name)) break;
      const Value* v = obj.as_dict().Find(name);
      if (v) return *v;
      return Value::MakeUndefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::kNamespace: {
      const Value* v = obj.namespace_dict().Find(name);
      if (v) return *v;
      return Value::MakeUndefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Value::Kind::kString:
      if (IsStrMethod(name))
        return Bound(obj, name, [name](const Value& self, CallArgs& a) { return StrMethod(self.as_string(), name, a); });
      return Value::MakeUndefined("'str object' has no attribute '" + name + "'");
    case Value::Kind::kList:
      if (name == "index" || name == "count") {
        return Bound(obj, name, [name](const Value& self, CallArgs& a) -> Value {
          Value x = a.Get(0, "value");
          int64_t n = 0, i = 0;
          for (const Value& v : self.as_list()) {
            if (v.Equals(x)) {
              if (name == "index") return Value(i);
              ++n;
            }
            ++i;
          }
          if (name == "index") Fail(x.Repr() + " is not in list");
          return Value(n);
        });
      }
      if (IsUnsafeMutator(obj, name)) break;
      return Value::MakeUndefined("'list object' has no attribute '" + name + "'");
    default:
      return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute '" + name + "'");
  }
  // The sandbox refuses methods that would modify a list or dict.
  std::string msg = "access to attribute '" + name + "' of '" + obj.TypeName() + "' object is unsafe.";
  return Value(Callable{name, [msg](CallArgs&, Interpreter&) -> Value { Fail(msg); }});
}

namespace {

// Python index normalization; returns false when out of range.
bool NormIndex(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

}  // namespace

Value GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      FailUndefined(obj);
    case Value::Kind::kDict:
      if (key.is_string()) {
        const Value* v = obj.as_dict().Find(key.as_string());
        if (v) return *v;
        return GetAttr(obj, key.as_string()).is_callable()
                   ? GetAttr(obj, key.as_string())
                   : Value::MakeUndefined("'dict object' has no attribute '" + key.as_string() + "'");
      }
      return Value::MakeUndefined("'dict object' has no attribute " + key.Repr());
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
        if (obj.is_list()) {
          if (!NormIndex(i, static_cast<int64_t>(obj.as_list().size())))
            return Value::MakeUndefined("list index out of range");
          return obj.as_list()[static_cast<size_t>(i)];
        }
        std::vector<uint32_t> cps = DecodeUtf8(obj.as_string());
        if (!NormIndex(i, static_cast<int64_t>(cps.size()))) return Value::MakeUndefined("string index out of range");
        return Value(EncodeUtf8(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
      }
      if (key.is_string()) return GetAttr(obj, key.as_string());
      return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute " + key.Repr());
    case Value::Kind::kNamespace:
      if (key.is_string()) return GetAttr(obj, key.as_string());
      [[fallthrough]];
    default:
      return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute " + key.Repr());
  }
}

Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (!obj.is_list() && !obj.is_string()) Fail("'" + obj.TypeName() + "' object is not subscriptable");
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = DecodeUtf8(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else {
    n = static_cast<int64_t>(obj.as_list().size());
  }
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    return ToInt(v, what);
  };
  int64_t st = opt(step, "slice step").value_or(1);
  if (st == 0) Fail("slice step cannot be zero");
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t b = adjust(opt(start, "slice start"), st < 0 ? n - 1 : 0);
  int64_t e = adjust(opt(stop, "slice stop"), st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) AppendUtf8(out, cps[static_cast<size_t>(i)]);
    return Value(std::move(out));
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.as_list()[static_cast<size_t>(i)]);
  return Value(std::move(out));
}

// ---- tests ----

namespace {

bool InTest(const Value& needle, const Value& hay) {
  switch (hay.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!needle.is_string())
        Fail("'in <string>' requires string as left operand, not " + needle.TypeName());
      return hay.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : hay.as_list())
        if (v.Equals(needle)) return true;
      return false;
    case Value::Kind::kDict:
      return needle.is_string() && hay.as_dict().Find(needle.as_string()) != nullptr;
    default:
      Fail("argument of type '" + hay.TypeName() + "' is not iterable");
  }
}

const std::unordered_map<std::string, TestFn>& Tests() {
  static const auto* kTests = new std::unordered_map<std::string, TestFn>{
      {"defined", [](const Value& v, CallArgs&, Interpreter&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&, Interpreter&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&, Interpreter&) { return v.is_none(); }},
      {"boolean", [](const Value& v, CallArgs&, Interpreter&) { return v.is_bool(); }},
      {"true", [](const Value& v, CallArgs&, Interpreter&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](const Value& v, CallArgs&, Interpreter&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](const Value& v, CallArgs&, Interpreter&) { return v.is_int(); }},
      {"float", [](const Value& v, CallArgs&, Interpreter&) { return v.is_float(); }},
      {"number", [](const Value& v, CallArgs&, Interpreter&) { return v.is_number(); }},
      {"string", [](const Value& v, CallArgs&, Interpreter&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&, Interpreter&) { return v.is_dict(); }},
      {"iterable",
       [](const Value& v, CallArgs&, Interpreter&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"sequence",
       [](const Value& v, CallArgs&, Interpreter&) {
         return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
       }},
      {"callable", [](const Value& v, CallArgs&, Interpreter&) { return v.is_callable(); }},
      {"odd", [](const Value& v, CallArgs&, Interpreter&) { return ToInt(v, "odd") % 2 != 0; }},
      {"even", [](const Value& v, CallArgs&, Interpreter&) { return ToInt(v, "even") % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, CallArgs& a, Interpreter&) {
         int64_t d = ToInt(a.Get(0, "num"), "divisibleby");
         if (d == 0) Fail("integer division or modulo by zero");
         return ToInt(v, "divisibleby") % d == 0;
       }},
      {"lower",
       [](const Value& v, CallArgs&, Interpreter&) {
         CallArgs none;
         return v.is_string() && StrMethod(v.as_string(), "islower", none).as_bool();
       }},
      {"upper",
       [](const Value& v, CallArgs&, Interpreter&) {
         CallArgs none;
         return v.is_string() && StrMethod(v.as_string(), "isupper", none).as_bool();
       }},
      {"sameas",
       [](const Value& v, CallArgs& a, Interpreter&) {
         Value o = a.Get(0, "other");
         if (v.kind() != o.kind()) return false;
         return v.Equals(o);
       }},
      {"in", [](const Value& v, CallArgs& a, Interpreter&) { return InTest(v, a.Get(0, "seq")); }},
  };
  return *kTests;
}

using CmpFn = bool (*)(const Value&, const Value&);
struct CmpTest {
  const char* names[3];
  CmpFn fn;
};
const CmpTest kCmpTests[] = {
    {{"eq", "equalto", "=="}, [](const Value& a, const Value& b) { return a.Equals(b); }},
    {{"ne", "!=", nullptr}, [](const Value& a, const Value& b) { return !a.Equals(b); }},
    {{"lt", "lessthan", "<"}, [](const Value& a, const Value& b) { return a.Less(b); }},
    {{"gt", "greaterthan", ">"}, [](const Value& a, const Value& b) { return b.Less(a); }},
    {{"le", "<=", nullptr}, [](const Value& a, const Value& b) { return a.Less(b) || a.Equals(b); }},
    {{"ge", ">=", nullptr}, [](const Value& a, const Value& b) { return b.Less(a) || a.Equals(b); }},
};

const CmpTest* FindCmpTest(std::string_view name) {
  for (const CmpTest& t : kCmpTests)
    for (const char* n : t.names)
      if (n && name == n) return &t;
  return nullptr;
}

}  // namespace

bool HasTest(std::string_view name) { return Tests().count(std::string(name)) || FindCmpTest(name); }

bool ApplyTest(const std::string& name, const Value& v, CallArgs& args, Interpreter& interp) {
  if (const CmpTest* t = FindCmpTest(name)) return t->fn(v, args.Get(0, "other"));
  auto it = Tests().find(name);
  if (it == Tests().end()) Fail("no test named '" + name + "'");
  return it->second(v, args, interp);
}

// ---- filters ----

namespace {

// environment.getattr with dotted paths ("function.name"), as selectattr/map use.
Value AttrPath(const Value& item, const std::string& path) {
  Value cur = item;
  size_t b = 0;
  while (true) {
    size_t dot = path.find('.', b);
    std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = numeric ? GetItem(cur, Value(static_cast<int64_t>(std::stoll(part)))) : GetItem(cur, Value(part));
    if (dot == std::string::npos) return cur;
    b = dot + 1;
  }
}

List SelectOrReject(const Value& seq, CallArgs& a, Interpreter& interp, bool by_attr, bool select) {
  size_t i = 0;
  std::string attr;
  if (by_attr) attr = RequireString(a.Get(i++, "attribute"), "selectattr/rejectattr attribute");
  std::string test;
  CallArgs targs;
  if (i < a.pos.size()) {
    test = RequireString(a.pos[i++], "select/reject test name");
    targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(i), a.pos.end());
    if (!HasTest(test)) Fail("no test named '" + test + "'");
  }
  List out;
  for (const Value& item : seq.Iterate()) {
    Value probe = by_attr ? AttrPath(item, attr) : item;
    bool r = test.empty() ? probe.Truthy() : ApplyTest(test, probe, targs, interp);
    if (r == select) out.push_back(item);
  }
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value IntFilter(const Value& v, CallArgs& a) {
  Value dflt = a.Get(0, "default", Value(0));
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float()) return std::isfinite(v.as_float()) ? Value(static_cast<int64_t>(v.as_float())) : dflt;
  if (v.is_string()) {
    std::string s = PyStrip(v.as_string(), Value::MakeNone(), true, true);
    std::string t;
    for (char c : s)
      if (c != '_') t += c;
    char* end = nullptr;
    errno = 0;
    long long i = std::strtoll(t.c_str(), &end, 10);
    if (!t.empty() && *end == '\0' && errno == 0) return Value(static_cast<int64_t>(i));
    double d = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(d));
  }
  return dflt;
}

Value FloatFilter(const Value& v, CallArgs& a) {
  Value dflt = a.Get(0, "default", Value(0.0));
  if (v.is_number()) return Value(v.ToDouble());
  if (v.is_string()) {
    std::string t = PyStrip(v.as_string(), Value::MakeNone(), true, true);
    char* end = nullptr;
    double d = std::strtod(t.c_str(), &end);
    if (!t.empty() && *end == '\0') return Value(d);
  }
  return dflt;
}

List SortedItems(List items, bool reverse, bool case_sensitive, const std::string& attr) {
  auto key = [&](const Value& v) {
    Value k = attr.empty() ? v : AttrPath(v, attr);
    if (!case_sensitive && k.is_string()) return Value(MapString(k.as_string(), 0));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? key(y).Less(key(x)) : key(x).Less(key(y));
  });
  return items;
}

const std::unordered_map<std::string, FilterFn>& Filters() {
  static const auto* kFilters = new std::unordered_map<std::string, FilterFn>{
      {"trim", [](const Value& v, CallArgs& a, Interpreter&) { return Value(PyStrip(v.Str(), a.Get(0, "chars"), true, true)); }},
      {"length", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Length()); }},
      {"count", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Length()); }},
      {"upper", [](const Value& v, CallArgs&, Interpreter&) { return Value(MapString(v.Str(), 1)); }},
      {"lower", [](const Value& v, CallArgs&, Interpreter&) { return Value(MapString(v.Str(), 0)); }},
      {"capitalize", [](const Value& v, CallArgs&, Interpreter&) { return Value(PyCapitalize(v.Str())); }},
      {"title", [](const Value& v, CallArgs&, Interpreter&) { return Value(JinjaTitle(v.Str())); }},
      {"string", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Str()); }},
      {"safe", [](const Value& v, CallArgs&, Interpreter&) { return v; }},
      {"escape", [](const Value& v, CallArgs&, Interpreter&) { return Value(HtmlEscape(v.Str())); }},
      {"e", [](const Value& v, CallArgs&, Interpreter&) { return Value(HtmlEscape(v.Str())); }},
      {"int", [](const Value& v, CallArgs& a, Interpreter&) { return IntFilter(v, a); }},
      {"float", [](const Value& v, CallArgs& a, Interpreter&) { return FloatFilter(v, a); }},
      {"abs",
       [](const Value& v, CallArgs&, Interpreter&) {
         if (v.is_float()) return Value(std::fabs(v.as_float()));
         int64_t i = ToInt(v, "abs");
         return Value(i < 0 ? -i : i);
       }},
      {"tojson",
       // transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
       [](const Value& v, CallArgs& a, Interpreter&) {
         return Value(JsonDumps(v, a.Get(0, "ensure_ascii", Value(false)).Truthy(), a.Get(1, "indent"),
                                a.Get(2, "separators"), a.Get(3, "sort_keys", Value(false)).Truthy()));
       }},
      {"join",
       [](const Value& v, CallArgs& a, Interpreter&) {
         std::string sep = a.Get(0, "d", Value("")).Str();
         Value attr = a.Get(1, "attribute");
         std::string out;
         bool first = true;
         for (const Value& item : v.Iterate()) {
           if (!first) out += sep;
           first = false;
           out += (attr.is_none() ? item : AttrPath(item, attr.Str())).Str();
         }
         return Value(std::move(out));
       }},
      {"default", [](const Value& v, CallArgs& a, Interpreter&) {
         bool boolean = a.Get(1, "boolean", Value(false)).Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy())) return a.Get(0, "default_value", Value(""));
         return v;
       }},
      {"first",
       [](const Value& v, CallArgs&, Interpreter&) {
         if (v.is_undefined()) return Value::MakeUndefined("No first item, sequence was empty.");
         List items = v.Iterate();
         if (items.empty()) return Value::MakeUndefined("No first item, sequence was empty.");
         return items.front();
       }},
      {"last",
       [](const Value& v, CallArgs&, Interpreter&) {
         if (v.is_undefined()) return Value::MakeUndefined("No last item, sequence was empty.");
         List items = v.Iterate();
         if (items.empty()) return Value::MakeUndefined("No last item, sequence was empty.");
         return items.back();
       }},
      {"list", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Iterate()); }},
      {"items",
       [](const Value& v, CallArgs&, Interpreter&) {
         if (v.is_undefined()) return Value(List{});
         if (!v.is_dict()) Fail("Can only get item pairs from a mapping.");
         List out;
         for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::MakeTuple(List{Value(k), x}));
         return Value(std::move(out));
       }},
      {"dictsort",
       [](const Value& v, CallArgs& a, Interpreter&) {
         if (!v.is_dict()) Fail("dictsort expects a mapping, got " + v.TypeName());
         bool case_sensitive = a.Get(0, "case_sensitive", Value(false)).Truthy();
         std::string by = a.Get(1, "by", Value("key")).Str();
         bool reverse = a.Get(2, "reverse", Value(false)).Truthy();
         List items;
         for (const auto& [k, x] : v.as_dict().items) items.push_back(Value::MakeTuple(List{Value(k), x}));
         return Value(SortedItems(std::move(items), reverse, case_sensitive, by == "value" ? "1" : "0"));
       }},
      {"replace",
       [](const Value& v, CallArgs& a, Interpreter&) {
         return Value(Replace(v.Str(), a.Get(0, "old").Str(), a.Get(1, "new").Str(),
                              ToInt(a.Get(2, "count", Value(-1)), "count")));
       }},
      {"selectattr", [](const Value& v, CallArgs& a, Interpreter& i) { return Value(SelectOrReject(v, a, i, true, true)); }},
      {"rejectattr", [](const Value& v, CallArgs& a, Interpreter& i) { return Value(SelectOrReject(v, a, i, true, false)); }},
      {"select", [](const Value& v, CallArgs& a, Interpreter& i) { return Value(SelectOrReject(v, a, i, false, true)); }},
      {"reject", [](const Value& v, CallArgs& a, Interpreter& i) { return Value(SelectOrReject(v, a, i, false, false)); }},
      {"map",
       [](const Value& v, CallArgs& a, Interpreter& interp) {
         List out;
         Value attr = a.Get(99, "attribute");
         if (!attr.is_none()) {
           Value dflt = a.Get(99, "default", Value());
           for (const Value& item : v.Iterate()) {
             Value x = AttrPath(item, attr.Str());
             out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
           }
           return Value(std::move(out));
         }
         if (a.pos.empty()) Fail("map requires a filter name or attribute=");
         std::string filter = RequireString(a.pos[0], "map filter name");
         if (!HasFilter(filter)) Fail("no filter named '" + filter + "'");
         CallArgs fargs;
         fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
         fargs.kw = a.kw;
         for (const Value& item : v.Iterate()) out.push_back(ApplyFilter(filter, item, fargs, interp));
         return Value(std::move(out));
       }},
      {"reverse",
       [](const Value& v, CallArgs&, Interpreter&) {
         if (v.is_string()) {
           std::vector<uint32_t> cps = DecodeUtf8(v.as_string());
           std::reverse(cps.begin(), cps.end());
           return Value(EncodeUtf8(cps, 0, cps.size()));
         }
         List items = v.Iterate();
         std::reverse(items.begin(), items.end());
         return Value(std::move(items));
       }},
      {"sort",
       [](const Value& v, CallArgs& a, Interpreter&) {
         Value attr = a.Get(2, "attribute");
         return Value(SortedItems(v.Iterate(), a.Get(0, "reverse", Value(false)).Truthy(),
                                  a.Get(1, "case_sensitive", Value(false)).Truthy(),
                                  attr.is_none() ? "" : attr.Str()));
       }},
      {"unique",
       [](const Value& v, CallArgs&, Interpreter&) {
         List out;
         for (const Value& x : v.Iterate()) {
           bool seen = false;
           for (const Value& y : out) seen |= (x.is_string() && y.is_string())
                                                  ? MapString(x.as_string(), 0) == MapString(y.as_string(), 0)
                                                  : x.Equals(y);
           if (!seen) out.push_back(x);
         }
         return Value(std::move(out));
       }},
      {"sum",
       [](const Value& v, CallArgs& a, Interpreter&) {
         Value attr = a.Get(0, "attribute");
         Value total = a.Get(1, "start", Value(0));
         for (const Value& x : v.Iterate()) {
           Value y = attr.is_none() ? x : AttrPath(x, attr.Str());
           if (!total.is_number() || !y.is_number()) Fail("sum expects numbers, got " + y.TypeName());
           total = (total.is_float() || y.is_float()) ? Value(total.ToDouble() + y.ToDouble())
                                                       : Value(static_cast<int64_t>(total.ToDouble()) +
                                                               static_cast<int64_t>(y.ToDouble()));
         }
         return total;
       }},
      {"min",
       [](const Value& v, CallArgs&, Interpreter&) {
         List items = v.Iterate();
         if (items.empty()) return Value::MakeUndefined("No aggregated item, sequence was empty.");
         Value best = items[0];
         for (const Value& x : items) if (x.Less(best)) best = x;
         return best;
       }},
      {"max",
       [](const Value& v, CallArgs&, Interpreter&) {
         List items = v.Iterate();
         if (items.empty()) return Value::MakeUndefined("No aggregated item, sequence was empty.");
         Value best = items[0];
         for (const Value& x : items) if (best.Less(x)) best = x;
         return best;
       }},
      {"round",
       [](const Value& v, CallArgs& a, Interpreter&) {
         int64_t prec = ToInt(a.Get(0, "precision", Value(0)), "round precision");
         std::string method = a.Get(1, "method", Value("common")).Str();
         if (method == "common") {  // Python round(): exact value, ties to even
           if (!v.is_float()) return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : Value(ToInt(v, "round"));
           if (prec <= 0 || !std::isfinite(v.as_float())) {
             double scale = std::pow(10.0, static_cast<double>(-prec));
             return Value(std::nearbyint(v.as_float() / scale) * scale);
           }
           char buf[512];
           std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(prec, 300)), v.as_float());
           return Value(std::strtod(buf, nullptr));
         }
         if (method != "ceil" && method != "floor") Fail("method must be common, ceil or floor");
         double scale = std::pow(10.0, static_cast<double>(prec));
         double x = v.ToDouble() * scale;
         return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
       }},
      {"indent",
       [](const Value& v, CallArgs& a, Interpreter&) {
         Value w = a.Get(0, "width", Value(4));
         std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(ToInt(w, "indent")), ' ');
         bool first = a.Get(1, "first", Value(false)).Truthy();
         bool blank = a.Get(2, "blank", Value(false)).Truthy();
         std::string s = v.Str(), out;
         size_t b = 0;
         bool is_first = true;
         while (true) {
           size_t nl = s.find('\n', b);
           std::string line = s.substr(b, nl == std::string::npos ? std::string::npos : nl - b);
           bool add = is_first ? first : (blank || !PyStrip(line, Value::MakeNone(), true, true).empty());
           if (add) out += pad;
           out += line;
           if (nl == std::string::npos) break;
           out += '\n';
           b = nl + 1;
           is_first = false;
         }
         return Value(std::move(out));
       }},
      {"wordcount",
       [](const Value& v, CallArgs&, Interpreter&) {
         return Value(static_cast<int64_t>(Split(v.Str(), Value::MakeNone(), -1, false).size()));
       }},
  };
  return *kFilters;
}

}  // namespace

bool HasFilter(std::string_view name) {
  return Filters().count(std::string(name)) || name == "d";
}

Value ApplyFilter(const std::string& name, const Value& v, CallArgs& args, Interpreter& interp) {
  auto it = Filters().find(name == "d" ? std::string("default") : name);
  if (it == Filters().end()) Fail("no filter named '" + name + "'");
  return it->second(v, args, interp);
}

// ---- globals ----

Value LookupGlobal(const std::string& name) {
  if (name == "raise_exception") {
    return Value(Callable{"raise_exception", [](CallArgs& a, Interpreter&) -> Value {
                            throw RenderError{a.Get(0, "message", Value("")).Str(), true};
                          }});
  }
  if (name == "strftime_now") {
    return Value(Callable{"strftime_now", [](CallArgs& a, Interpreter& interp) -> Value {
                            std::string fmt = RequireString(a.Get(0, "format"), "strftime_now");
                            if (fmt.empty()) return Value("");
                            std::tm t = interp.now();
                            std::string buf(256 + fmt.size() * 8, '\0');
                            size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
                            buf.resize(n);
                            return Value(std::move(buf));
                          }});
  }
  if (name == "namespace") {
    return Value(Callable{"namespace", [](CallArgs& a, Interpreter&) -> Value {
                            Dict d;
                            for (const Value& p : a.pos) {
                              if (!p.is_dict()) Fail("namespace() positional arguments must be mappings");
                              for (const auto& [k, v] : p.as_dict().items) d.Set(k, v);
                            }
                            for (const auto& [k, v] : a.kw) d.Set(k, v);
                            return Value::MakeNamespace(std::move(d));
                          }});
  }
  if (name == "dict") {
    return Value(Callable{"dict", [](CallArgs& a, Interpreter&) -> Value {
                            Dict d;
                            for (const auto& [k, v] : a.kw) d.Set(k, v);
                            return Value(std::move(d));
                          }});
  }
  if (name == "range") {
    return Value(Callable{"range", [](CallArgs& a, Interpreter&) -> Value {
                            int64_t start = 0, stop, step = 1;
                            if (a.pos.size() == 1) {
                              stop = ToInt(a.pos[0], "range");
                            } else if (a.pos.size() >= 2) {
                              start = ToInt(a.pos[0], "range");
                              stop = ToInt(a.pos[1], "range");
                              if (a.pos.size() > 2) step = ToInt(a.pos[2], "range");
                            } else {
                              Fail("range expected at least 1 argument, got 0");
                            }
                            if (step == 0) Fail("range() arg 3 must not be zero");
                            List out;
                            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                              out.emplace_back(i);
                              if (out.size() > 100000) Fail("range too big (more than 100000 items)");
                            }
                            return Value(std::move(out));
                          }});
  }
  return Value();
}

}  // namespace strata::jinja
