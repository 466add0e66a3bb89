// Values of the Jinja engine behind ChatTemplate, with Python semantics:
// what str(), ==, <, truthiness and json.dumps do to them is what jinja2 (on
// CPython) does, because chat templates are written against that and the
// rendered prompt must match transformers byte for byte.
//
// Lists and dicts are shared and immutable once built (the template sandbox
// is jinja2's ImmutableSandboxedEnvironment); only namespace() objects are
// mutable, through `{% set ns.attr = ... %}`. Dicts keep insertion order.
// Thread-safety: values are not synchronized; the shared payloads are never
// written after construction except namespaces, which live in one Render.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace strata::jinja {

class Value;
struct CallArgs;
class Interpreter;

using List = std::vector<Value>;

// Insertion-ordered string-keyed map (Python dict with str keys).
// Lookups stay O(1) however large the dict (a request's JSON can hold
// 100,000s of keys): past a few keys, a hash index covers items[0, indexed_).
// Appending to `items` directly is allowed (Find scans what the index does
// not cover; call Index() when done); any other edit goes through Set.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value v);
  // Extends the index over items appended directly (the first of equal keys wins).
  void Index();

 private:
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  static constexpr size_t kIndexFrom = 16;      // smaller dicts are searched linearly
  size_t Position(std::string_view key) const;  // items.size() when absent
  std::unordered_map<std::string, size_t, KeyHash, std::equal_to<>> index_;
  size_t indexed_ = 0;
};

// A builtin function, bound method or macro. `fn` may throw RenderError.
struct Callable {
  std::string name;
  std::function<Value(CallArgs&, Interpreter&)> fn;
};

struct Undefined {
  std::string hint;  // what was looked up, for the error when it is used
};
struct None {};

// Thrown inside the jinja module only (the evaluator and builtins); the
// ChatTemplate boundary turns it into a Status.
struct RenderError {
  std::string message;
  bool raised_by_template = false;  // raise_exception(...) in the template
};
[[noreturn]] void Fail(std::string message);

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() : v_(Undefined{}) {}
  static Value MakeUndefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value MakeNone() { return Value(None{}); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(double d) : v_(d) {}
  // Strings are shared: contents can be long and templates copy values freely.
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : v_(std::make_shared<const std::string>(s)) {}
  Value(List l) : v_(std::make_shared<const List>(std::move(l))) {}
  Value(Dict d) : v_(std::make_shared<const Dict>(std::move(d))) {}
  static Value MakeNamespace(Dict d);
  // A Python tuple: a list that prints as (a, b) (items(), tuple literals).
  static Value MakeTuple(List l);
  Value(Callable c) : v_(std::make_shared<const Callable>(std::move(c))) {}

  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const {
    return is_bool() || is_int() || is_float();
  }  // Python: bool is a Number
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }  // lists and tuples
  bool is_tuple() const { return tuple_; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Numeric value of a bool/int/float.
  double ToDouble() const;
  const std::string& as_string() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(v_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(v_); }
  Dict& namespace_dict() const { return *std::get<std::shared_ptr<Dict>>(v_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  // Python truthiness (undefined is false).
  bool Truthy() const;
  // str(x) as jinja2 prints it ("" for undefined, "None", "True", repr of
  // containers).
  std::string Str() const;
  // repr(x).
  std::string Repr() const;
  // Python type name for messages: "str", "dict object", ...
  std::string TypeName() const;
  // Python ==.
  bool Equals(const Value& other) const;
  // Python <; throws RenderError for unorderable types.
  bool Less(const Value& other) const;
  // Items to iterate: list items, dict keys, string characters; undefined
  // iterates as empty. Throws for other kinds.
  List Iterate() const;
  // len(): code points of a string, items of a list/dict.
  int64_t Length() const;

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(None n) : v_(n) {}

  std::variant<Undefined, None, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Dict>,
               std::shared_ptr<const Callable>>
      v_;
  bool tuple_ = false;
};

// Python float.__repr__ ("1.0", "0.1", "1e+16", "inf", "nan").
std::string PyFloatRepr(double d);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys). `indent` is
// null (compact), an int or a string; `separators` null or a 2-item list.
// Fails (RenderError) once the text passes max_bytes (indent=10**6 on a
// nested value would otherwise build gigabytes).
std::string JsonDumps(const Value& v, bool ensure_ascii, const Value& indent,
                      const Value& separators, bool sort_keys, size_t max_bytes = SIZE_MAX);

// UTF-8 helpers with Python str semantics (indices count code points).
std::vector<uint32_t> DecodeUtf8(std::string_view s);
std::string EncodeUtf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void AppendUtf8(std::string& out, uint32_t cp);
bool IsPyWhitespace(uint32_t cp);
// str.strip()/lstrip()/rstrip() with `chars` (null: whitespace).
std::string PyStrip(const std::string& s, const Value& chars, bool left, bool right);

}  // namespace strata::jinja
