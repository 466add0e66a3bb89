// jinja2's filters (trim, tojson, selectattr, map, ...) for the Jinja engine;
// transformers overrides tojson with json.dumps(ensure_ascii=False, ...).

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <unordered_map>

#include "model/jinja/jinja_builtins.h"
#include "model/jinja/jinja_interp.h"
#include "model/jinja/jinja_pystr.h"

namespace strata::jinja {
namespace {

using FilterFn = std::function<Value(const Value&, CallArgs&, Interpreter&)>;

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
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value IntFilter(const Value& v, CallArgs& a) {
  Value dflt = a.Get(0, "default", Value(0));
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(static_cast<int64_t>(v.as_bool()));
  if (v.is_float())
    return std::isfinite(v.as_float()) ? Value(static_cast<int64_t>(v.as_float())) : dflt;
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
    // jinja2 compares [key] lists: equal keys never reach '<' (so [none, none] sorts).
    Value kx = key(x), ky = key(y);
    if (kx.Equals(ky)) return false;
    return reverse ? ky.Less(kx) : kx.Less(ky);
  });
  return items;
}

const std::unordered_map<std::string, FilterFn>& Filters() {
  static const auto* kFilters = new std::unordered_map<std::string, FilterFn>{
      {"trim", [](const Value& v, CallArgs& a,
                  Interpreter&) { return Value(PyStrip(v.Str(), a.Get(0, "chars"), true, true)); }},
      {"length", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Length()); }},
      {"count", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Length()); }},
      {"upper",
       [](const Value& v, CallArgs&, Interpreter&) { return Value(MapString(v.Str(), 1)); }},
      {"lower",
       [](const Value& v, CallArgs&, Interpreter&) { return Value(MapString(v.Str(), 0)); }},
      {"capitalize",
       [](const Value& v, CallArgs&, Interpreter&) { return Value(PyCapitalize(v.Str())); }},
      {"title", [](const Value& v, CallArgs&, Interpreter&) { return Value(JinjaTitle(v.Str())); }},
      {"string", [](const Value& v, CallArgs&, Interpreter&) { return Value(v.Str()); }},
      {"safe", [](const Value& v, CallArgs&, Interpreter&) { return v; }},
      {"escape",
       [](const Value& v, CallArgs&, Interpreter&) { return Value(HtmlEscape(v.Str())); }},
      {"e", [](const Value& v, CallArgs&, Interpreter&) { return Value(HtmlEscape(v.Str())); }},
      {"int", [](const Value& v, CallArgs& a, Interpreter&) { return IntFilter(v, a); }},
      {"float", [](const Value& v, CallArgs& a, Interpreter&) { return FloatFilter(v, a); }},
      {"abs",
       [](const Value& v, CallArgs&, Interpreter&) {
         if (v.is_float()) return Value(std::fabs(v.as_float()));
         int64_t i = ToInt(v, "abs");
         if (i == INT64_MIN) Fail("integer overflow in abs (results must fit in 64 bits)");
         return Value(i < 0 ? -i : i);
       }},
      {"tojson",
       // transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
       // sort_keys=False)
       [](const Value& v, CallArgs& a, Interpreter& in) {
         return Value(JsonDumps(v, a.Get(0, "ensure_ascii", Value(false)).Truthy(),
                                a.Get(1, "indent"), a.Get(2, "separators"),
                                a.Get(3, "sort_keys", Value(false)).Truthy(),
                                in.max_output_bytes()));
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
      {"default",
       [](const Value& v, CallArgs& a, Interpreter&) {
         bool boolean = a.Get(1, "boolean", Value(false)).Truthy();
         if (v.is_undefined() || (boolean && !v.Truthy()))
           return a.Get(0, "default_value", Value(""));
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
         for (const auto& [k, x] : v.as_dict().items)
           out.push_back(Value::MakeTuple(List{Value(k), x}));
         return Value(std::move(out));
       }},
      {"dictsort",
       [](const Value& v, CallArgs& a, Interpreter&) {
         if (!v.is_dict()) Fail("dictsort expects a mapping, got " + v.TypeName());
         bool case_sensitive = a.Get(0, "case_sensitive", Value(false)).Truthy();
         std::string by = a.Get(1, "by", Value("key")).Str();
         bool reverse = a.Get(2, "reverse", Value(false)).Truthy();
         List items;
         for (const auto& [k, x] : v.as_dict().items)
           items.push_back(Value::MakeTuple(List{Value(k), x}));
         return Value(
             SortedItems(std::move(items), reverse, case_sensitive, by == "value" ? "1" : "0"));
       }},
      {"replace",
       [](const Value& v, CallArgs& a, Interpreter& in) {
         return Value(Replace(v.Str(), a.Get(0, "old").Str(), a.Get(1, "new").Str(),
                              ToInt(a.Get(2, "count", Value(-1)), "count"), in.max_output_bytes()));
       }},
      {"selectattr", [](const Value& v, CallArgs& a,
                        Interpreter& i) { return Value(SelectOrReject(v, a, i, true, true)); }},
      {"rejectattr", [](const Value& v, CallArgs& a,
                        Interpreter& i) { return Value(SelectOrReject(v, a, i, true, false)); }},
      {"select", [](const Value& v, CallArgs& a,
                    Interpreter& i) { return Value(SelectOrReject(v, a, i, false, true)); }},
      {"reject", [](const Value& v, CallArgs& a,
                    Interpreter& i) { return Value(SelectOrReject(v, a, i, false, false)); }},
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
         for (const Value& item : v.Iterate())
           out.push_back(ApplyFilter(filter, item, fargs, interp));
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
           for (const Value& y : out)
             seen |= (x.is_string() && y.is_string())
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
           if (!total.is_number() || !y.is_number())
             Fail("sum expects numbers, got " + y.TypeName());
           total = (total.is_float() || y.is_float())
                       ? Value(total.ToDouble() + y.ToDouble())
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
         for (const Value& x : items)
           if (x.Less(best)) best = x;
         return best;
       }},
      {"max",
       [](const Value& v, CallArgs&, Interpreter&) {
         List items = v.Iterate();
         if (items.empty()) return Value::MakeUndefined("No aggregated item, sequence was empty.");
         Value best = items[0];
         for (const Value& x : items)
           if (best.Less(x)) best = x;
         return best;
       }},
      {"round",
       [](const Value& v, CallArgs& a, Interpreter&) {
         int64_t prec = ToInt(a.Get(0, "precision", Value(0)), "round precision");
         std::string method = a.Get(1, "method", Value("common")).Str();
         if (method == "common") {  // Python round(): exact value, ties to even
           if (!v.is_float())
             return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool()))
                                : Value(ToInt(v, "round"));
           if (prec <= 0 || !std::isfinite(v.as_float())) {
             double scale = std::pow(10.0, static_cast<double>(-prec));
             return Value(std::nearbyint(v.as_float() / scale) * scale);
           }
           char buf[512];
           std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(prec, 300)),
                         v.as_float());
           return Value(std::strtod(buf, nullptr));
         }
         if (method != "ceil" && method != "floor") Fail("method must be common, ceil or floor");
         double scale = std::pow(10.0, static_cast<double>(prec));
         double x = v.ToDouble() * scale;
         return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
       }},
      {"indent",
       [](const Value& v, CallArgs& a, Interpreter& in) {
         Value w = a.Get(0, "width", Value(4));
         std::string pad;
         if (w.is_string()) {
           pad = w.as_string();
         } else {  // like Python's ' ' * width: negative is empty
           const int64_t width = std::max<int64_t>(0, ToInt(w, "indent"));
           in.CheckSize(static_cast<uint64_t>(width));
           pad.assign(static_cast<size_t>(width), ' ');
         }
         bool first = a.Get(1, "first", Value(false)).Truthy();
         bool blank = a.Get(2, "blank", Value(false)).Truthy();
         std::string s = v.Str(), out;
         size_t b = 0;
         bool is_first = true;
         while (true) {
           size_t nl = s.find('\n', b);
           std::string line = s.substr(b, nl == std::string::npos ? std::string::npos : nl - b);
           bool add =
               is_first ? first : (blank || !line.empty());  // whitespace-only lines count as text
           if (add) out += pad;
           out += line;
           in.CheckSize(out.size());
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

bool HasFilter(std::string_view name) { return Filters().count(std::string(name)) || name == "d"; }

Value ApplyFilter(const std::string& name, const Value& v, CallArgs& args, Interpreter& interp) {
  auto it = Filters().find(name == "d" ? std::string("default") : name);
  if (it == Filters().end()) Fail("no filter named '" + name + "'");
  return it->second(v, args, interp);
}

}  // namespace strata::jinja
