// Builtins of the Jinja engine: jinja2's filters and tests, the Python
// str/dict methods templates call (message.content.startswith(...)), and
// transformers' globals (raise_exception, strftime_now, namespace, range).
// Filter and test names are checked at parse time through HasFilter/HasTest.
// Filters are in jinja_filters.cc, str methods in jinja_pystr.cc.
// Thread-safety: stateless; functions may throw RenderError.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/jinja/jinja_value.h"

namespace strata::jinja {

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;

  // Argument `i` (positional) or `name` (keyword), else `fallback`.
  Value Get(size_t i, std::string_view name, Value fallback = Value::MakeNone()) const;
};

bool HasFilter(std::string_view name);
bool HasTest(std::string_view name);

// `args.pos` excludes the filtered / tested value.
Value ApplyFilter(const std::string& name, const Value& v, CallArgs& args, Interpreter& interp);
bool ApplyTest(const std::string& name, const Value& v, CallArgs& args, Interpreter& interp);

// obj.name: dict keys and dict/str/list methods (bound to obj), namespace
// attributes; Undefined when missing. Throws when obj is undefined.
Value GetAttr(const Value& obj, const std::string& name);
// obj[key], with Python's negative indices; falls back to GetAttr for
// string keys, as jinja2 does.
Value GetItem(const Value& obj, const Value& key);
// jinja2's environment.getattr for dotted paths ("function.name", "0"), as
// selectattr, map and sort(attribute=) use them.
Value AttrPath(const Value& item, const std::string& path);
// obj[start:stop:step] on lists and strings (nulls are omitted bounds).
Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// The globals transformers' environment provides, plus jinja2's defaults.
// The interpreter resolves names here after its scopes.
Value LookupGlobal(const std::string& name);

}  // namespace strata::jinja
