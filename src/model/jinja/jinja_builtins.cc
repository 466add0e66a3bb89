#include "model/jinja/jinja_builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <unordered_map>

#include "model/jinja/jinja_interp.h"
#include "model/jinja/jinja_pystr.h"

namespace strata::jinja {

Value CallArgs::Get(size_t i, std::string_view name, Value fallback) const {
  if (i < pos.size()) return pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  return fallback;
}

namespace {

using TestFn = std::function<bool(const Value&, CallArgs&, Interpreter&)>;

[[noreturn]] void FailUndefined(const Value& v) {
  Fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

bool IsUnsafeMutator(const Value& obj, const std::string& n) {
  static const char* kList[] = {"append", "extend", "insert", "pop",
                                "remove", "clear",  "sort",   "reverse"};
  static const char* kDict[] = {"pop", "popitem", "setdefault", "update", "clear"};
  if (obj.is_list())
    for (const char* k : kList)
      if (n == k) return true;
  if (obj.is_dict())
    for (const char* k : kDict)
      if (n == k) return true;
  return false;
}

Value Bound(const Value& self, const std::string& name,
            std::function<Value(const Value&, CallArgs&)> fn) {
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
            if (name == "items")
              out.push_back(Value::MakeTuple(List{Value(k), v}));
            else if (name == "keys")
              out.emplace_back(k);
            else
              out.push_back(v);
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
        return Bound(obj, name, [name](const Value& self, CallArgs& a) {
          return StrMethod(self.as_string(), name, a);
        });
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
      return Value::MakeUndefined("'" + obj.TypeName() + " object' has no attribute '" + name +
                                  "'");
  }
  // The sandbox refuses methods that would modify a list or dict.
  std::string msg =
      "access to attribute '" + name + "' of '" + obj.TypeName() + "' object is unsafe.";
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
                   : Value::MakeUndefined("'dict object' has no attribute '" + key.as_string() +
                                          "'");
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
        if (!NormIndex(i, static_cast<int64_t>(cps.size())))
          return Value::MakeUndefined("string index out of range");
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
  if (!obj.is_list() && !obj.is_string())
    Fail("'" + obj.TypeName() + "' object is not subscriptable");
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
      {"false",
       [](const Value& v, CallArgs&, Interpreter&) { return v.is_bool() && !v.as_bool(); }},
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
    {{"le", "<=", nullptr},
     [](const Value& a, const Value& b) { return a.Less(b) || a.Equals(b); }},
    {{"ge", ">=", nullptr},
     [](const Value& a, const Value& b) { return b.Less(a) || a.Equals(b); }},
};

const CmpTest* FindCmpTest(std::string_view name) {
  for (const CmpTest& t : kCmpTests)
    for (const char* n : t.names)
      if (n && name == n) return &t;
  return nullptr;
}

}  // namespace

bool HasTest(std::string_view name) {
  return Tests().count(std::string(name)) || FindCmpTest(name);
}

bool ApplyTest(const std::string& name, const Value& v, CallArgs& args, Interpreter& interp) {
  if (const CmpTest* t = FindCmpTest(name)) return t->fn(v, args.Get(0, "other"));
  auto it = Tests().find(name);
  if (it == Tests().end()) Fail("no test named '" + name + "'");
  return it->second(v, args, interp);
}

// environment.getattr with dotted paths ("function.name"), as selectattr/map use.
Value AttrPath(const Value& item, const std::string& path) {
  Value cur = item;
  size_t b = 0;
  while (true) {
    size_t dot = path.find('.', b);
    std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(),
                                                [](char c) { return c >= '0' && c <= '9'; });
    int64_t index = 0;
    // Past int64 no list is that long: look the digits up as a key (undefined).
    numeric =
        numeric && std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    cur = numeric ? GetItem(cur, Value(index)) : GetItem(cur, Value(part));
    if (dot == std::string::npos) return cur;
    b = dot + 1;
  }
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
                              if (!p.is_dict())
                                Fail("namespace() positional arguments must be mappings");
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
                              if (out.size() > 100000)
                                Fail("range too big (more than 100000 items)");
                            }
                            return Value(std::move(out));
                          }});
  }
  return Value();
}

}  // namespace strata::jinja
