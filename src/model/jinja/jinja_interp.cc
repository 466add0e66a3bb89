#include "model/jinja/jinja_interp.h"

#include <cmath>

namespace strata::jinja {
namespace {

constexpr int kMaxCallDepth = 200;  // macro recursion guard

[[noreturn]] void FailAt(int line, const std::string& what) {
  Fail("template line " + std::to_string(line) + ": " + what);
}

[[noreturn]] void FailUndefined(const Value& v) {
  Fail(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t AsIntLike(const Value& v) { return v.is_bool() ? v.as_bool() : v.as_int(); }

// Python ints are unbounded; ours are int64, so a result outside it is an
// error rather than (undefined) wraparound.
[[noreturn]] void FailOverflow(const std::string& op) {
  Fail("integer overflow in '" + op + "' (results must fit in 64 bits)");
}
int64_t CheckedInt(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  bool overflow = op == "+"   ? __builtin_add_overflow(a, b, &r)
                  : op == "-" ? __builtin_sub_overflow(a, b, &r)
                              : __builtin_mul_overflow(a, b, &r);
  if (overflow) FailOverflow(op);
  return r;
}

}  // namespace

Interpreter::Interpreter(const Program& program, const Dict& context, const std::tm& now,
                         const RenderLimits& limits)
    : program_(program), now_(now), limits_(limits), root_(std::make_shared<Frame>()) {
  for (const auto& [k, v] : context.items) root_->vars[k] = v;
}

std::string Interpreter::Render() {
  std::string out;
  Exec(program_.body, root_, out);
  return out;
}

void Interpreter::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    Fail("the template builds a string of " + std::to_string(bytes) + " bytes, over the " +
         std::to_string(limits_.max_output_bytes) + "-byte limit");
}

void Interpreter::Step(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps)
    Fail("the template runs more than " + std::to_string(limits_.max_steps) +
         " loop iterations and macro calls");
}

// Exec and Eval recurse once per nesting level: bounded by the parser's
// kMaxNestingDepth within one macro, and by this across macro calls.
class Interpreter::DepthGuard {
 public:
  explicit DepthGuard(int* depth) : depth_(depth) {
    if (++*depth_ > kMaxRenderDepth) {
      --*depth_;
      Fail("the template recurses more than " + std::to_string(kMaxRenderDepth) + " levels deep");
    }
  }
  ~DepthGuard() { --*depth_; }

 private:
  int* depth_;
};

Interpreter::Flow Interpreter::Exec(const Body& body, const FramePtr& frame, std::string& out) {
  DepthGuard guard(&render_depth_);
  for (const StmtPtr& sp : body) {
    const Stmt& s = *sp;
    switch (s.kind) {
      case StmtKind::kText:
        out += s.text;
        break;
      case StmtKind::kPrint:
        out += Eval(*s.expr, frame).Str();
        break;
      case StmtKind::kIf: {
        bool done = false;
        for (size_t i = 0; i < s.conds.size() && !done; ++i) {
          if (Eval(*s.conds[i], frame).Truthy()) {
            done = true;
            Flow f = Exec(s.bodies[i], frame, out);
            if (f != Flow::kNormal) return f;
          }
        }
        if (!done) {
          Flow f = Exec(s.else_body, frame, out);
          if (f != Flow::kNormal) return f;
        }
        break;
      }
      case StmtKind::kFor: {
        Flow f = ExecFor(s, frame, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kSet:
        Assign(s.targets, Eval(*s.expr, frame), frame, s.line);
        break;
      case StmtKind::kSetBlock: {
        std::string captured;
        Exec(s.body, frame, captured);
        Assign(s.targets, ApplyFilters(s.filters, Value(std::move(captured)), frame), frame,
               s.line);
        break;
      }
      case StmtKind::kMacro:
        frame->vars[s.name] = DefineMacro(s, frame);
        break;
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kFilterBlock: {
        std::string captured;
        Flow f = Exec(s.body, frame, captured);
        out += ApplyFilters(s.filters, Value(std::move(captured)), frame).Str();
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kCallBlock: {
        const Expr& call = *s.expr;
        Value callee = Eval(*call.args[0], frame);
        CallArgs a = EvalArgs(call, 1, frame);
        a.kw.emplace_back("caller", DefineMacro(s, frame));
        out += Call(callee, a).Str();
        break;
      }
      case StmtKind::kPassBody: {
        Flow f = Exec(s.body, frame, out);
        if (f != Flow::kNormal) return f;
        break;
      }
    }
    CheckSize(out.size());
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::ExecFor(const Stmt& s, const FramePtr& frame, std::string& out) {
  Value iterable = Eval(*s.expr, frame);
  if (iterable.is_none() || iterable.is_bool() || iterable.is_int() || iterable.is_float() ||
      iterable.is_namespace() || iterable.is_callable())
    FailAt(s.line, "'" + iterable.TypeName() + "' object is not iterable");
  List items = iterable.Iterate();
  if (s.cond) {  // {% for x in xs if cond %}: filter first; loop.* counts what is left
    List kept;
    for (const Value& item : items) {
      Step(1);
      auto probe = std::make_shared<Frame>();
      probe->parent = frame;
      Assign(s.targets, item, probe, s.line);
      if (Eval(*s.cond, probe).Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Step(1);
    auto iter = std::make_shared<Frame>();
    iter->parent = frame;
    Assign(s.targets, items[static_cast<size_t>(i)], iter, s.line);
    Dict loop;
    loop.items = {
        {"index0", Value(i)},       {"index", Value(i + 1)},  {"revindex0", Value(n - i - 1)},
        {"revindex", Value(n - i)}, {"first", Value(i == 0)}, {"last", Value(i == n - 1)},
        {"length", Value(n)},       {"depth", Value(1)},      {"depth0", Value(0)}};
    if (i > 0) loop.items.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.items.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
    loop.items.emplace_back("cycle",
                            Value(Callable{"loop.cycle", [i](CallArgs& a, Interpreter&) {
                                             if (a.pos.empty()) Fail("no items for cycling given");
                                             return a.pos[static_cast<size_t>(i) % a.pos.size()];
                                           }}));
    iter->vars["loop"] = Value(std::move(loop));
    Flow f = Exec(s.body, iter, out);
    if (f == Flow::kBreak) break;
  }
  if (n == 0) return Exec(s.else_body, frame, out);
  return Flow::kNormal;
}

void Interpreter::Assign(const std::vector<std::string>& targets, const Value& v,
                         const FramePtr& frame, int line) {
  if (targets.size() == 1) {
    const std::string& t = targets[0];
    size_t dot = t.find('.');
    if (dot == std::string::npos) {
      frame->vars[t] = v;
      return;
    }
    Value ns = Lookup(t.substr(0, dot), frame);
    if (!ns.is_namespace())
      FailAt(line, "cannot assign attribute on non-namespace object '" + t.substr(0, dot) + "'");
    ns.namespace_dict().Set(t.substr(dot + 1), v);
    return;
  }
  if (v.is_none() || v.is_bool() || v.is_int() || v.is_float() || v.is_undefined())
    FailAt(line, "cannot unpack non-iterable " + v.TypeName() + " object");
  List items = v.Iterate();
  if (items.size() != targets.size())
    FailAt(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(targets.size()) + " names");
  for (size_t i = 0; i < targets.size(); ++i) frame->vars[targets[i]] = items[i];
}

// A macro, or the body of a {% call %} block as `caller`: binds `def.params`
// from the call's arguments (defaults evaluated in the new scope), renders
// def.body in a scope whose parent is where it was defined.
Value Interpreter::DefineMacro(const Stmt& s, const FramePtr& frame) {
  const Stmt* def = &s;
  FramePtr defining = frame;
  std::string name = s.kind == StmtKind::kMacro ? s.name : "caller";
  return Value(Callable{name, [this, def, defining, name](CallArgs& args, Interpreter&) -> Value {
                          Step(1);
                          if (++call_depth_ > kMaxCallDepth)
                            Fail("macro recursion too deep in '" + name + "'");
                          auto f = std::make_shared<Frame>();
                          f->parent = defining;
                          if (args.pos.size() > def->params.size())
                            Fail("macro '" + name + "' takes not more than " +
                                 std::to_string(def->params.size()) + " argument(s)");
                          for (const auto& [k, v] : args.kw) {
                            bool known = k == "caller";
                            for (const auto& p : def->params) known |= p.name == k;
                            if (!known)
                              Fail("macro '" + name + "' takes no keyword argument '" + k + "'");
                            if (k == "caller") f->vars["caller"] = v;
                          }
                          for (size_t i = 0; i < def->params.size(); ++i) {
                            const MacroParam& p = def->params[i];
                            Value v =
                                Value::MakeUndefined("parameter '" + p.name + "' was not provided");
                            if (i < args.pos.size()) {
                              v = args.pos[i];
                            } else {
                              bool found = false;
                              for (const auto& [k, kv] : args.kw)
                                if (k == p.name) {
                                  v = kv;
                                  found = true;
                                }
                              if (!found && p.default_value) v = Eval(*p.default_value, f);
                            }
                            f->vars[p.name] = v;
                          }
                          std::string out;
                          Exec(def->body, f, out);
                          --call_depth_;
                          return Value(std::move(out));
                        }});
}

Value Interpreter::Lookup(const std::string& name, const FramePtr& frame) const {
  for (const Frame* f = frame.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  Value g = LookupGlobal(name);
  if (!g.is_undefined()) return g;
  return Value::MakeUndefined("'" + name + "' is undefined");
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) FailUndefined(callee);
  if (!callee.is_callable()) Fail("'" + callee.TypeName() + "' object is not callable");
  return callee.as_callable().fn(args, *this);
}

CallArgs Interpreter::EvalArgs(const Expr& e, size_t first, const FramePtr& frame) {
  CallArgs a;
  for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(Eval(*e.args[i], frame));
  if (e.star_args) {
    Value xs = Eval(*e.star_args, frame);
    if (!xs.is_list() && !xs.is_string() && !xs.is_dict())
      Fail("argument after * must be iterable, not " + xs.TypeName());
    for (Value& v : xs.Iterate()) a.pos.push_back(std::move(v));
  }
  for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, Eval(*x, frame));
  if (e.star_kwargs) {
    Value d = Eval(*e.star_kwargs, frame);
    if (!d.is_dict()) Fail("argument after ** must be a mapping, not " + d.TypeName());
    for (const auto& [k, v] : d.as_dict().items) a.kw.emplace_back(k, v);
  }
  return a;
}

Value Interpreter::ApplyFilters(const std::vector<ExprPtr>& filters, Value v,
                                const FramePtr& frame) {
  for (const ExprPtr& f : filters) {
    CallArgs a = EvalArgs(*f, 1, frame);
    v = ApplyFilter(f->name, v, a, *this);
  }
  return v;
}

Value Interpreter::Eval(const Expr& e, const FramePtr& frame) {
  DepthGuard guard(&render_depth_);
  try {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.value;
      case ExprKind::kName:
        return Lookup(e.name, frame);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        List l;
        for (const auto& a : e.args) l.push_back(Eval(*a, frame));
        return e.kind == ExprKind::kTuple ? Value::MakeTuple(std::move(l)) : Value(std::move(l));
      }
      case ExprKind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = Eval(*e.args[i], frame);
          if (!k.is_string()) Fail("dict literal keys must be strings, got " + k.TypeName());
          d.Set(k.as_string(), Eval(*e.args[i + 1], frame));
        }
        return Value(std::move(d));
      }
      case ExprKind::kGetAttr:
        return GetAttr(Eval(*e.args[0], frame), e.name);
      case ExprKind::kGetItem:
        return GetItem(Eval(*e.args[0], frame), Eval(*e.args[1], frame));
      case ExprKind::kSlice: {
        auto opt = [&](size_t i) {
          return e.args[i] ? Eval(*e.args[i], frame) : Value::MakeNone();
        };
        return Slice(Eval(*e.args[0], frame), opt(1), opt(2), opt(3));
      }
      case ExprKind::kCall: {
        Value callee = Eval(*e.args[0], frame);
        CallArgs a = EvalArgs(e, 1, frame);
        return Call(callee, a);
      }
      case ExprKind::kFilter: {
        Value v = Eval(*e.args[0], frame);
        CallArgs a = EvalArgs(e, 1, frame);
        return ApplyFilter(e.name, v, a, *this);
      }
      case ExprKind::kTest: {
        Value v = Eval(*e.args[0], frame);
        CallArgs a = EvalArgs(e, 1, frame);
        return Value(ApplyTest(e.name, v, a, *this) != e.negated);
      }
      case ExprKind::kNot:
        return Value(!Eval(*e.args[0], frame).Truthy());
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        Value v = Eval(*e.args[0], frame);
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number())
          Fail("bad operand type for unary " + std::string(e.kind == ExprKind::kNeg ? "-" : "+") +
               ": '" + v.TypeName() + "'");
        if (e.kind == ExprKind::kPos) return v.is_bool() ? Value(AsIntLike(v)) : v;
        if (v.is_float()) return Value(-v.as_float());
        return Value(CheckedInt("-", 0, AsIntLike(v)));
      }
      case ExprKind::kBinary:
        return Binary(e.name, Eval(*e.args[0], frame), Eval(*e.args[1], frame));
      case ExprKind::kConcat: {
        std::string s;
        for (const auto& a : e.args) {
          s += Eval(*a, frame).Str();
          CheckSize(s.size());
        }
        return Value(std::move(s));
      }
      case ExprKind::kCompare: {
        Value left = Eval(*e.args[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.args[i + 1], frame);
          const std::string& op = e.ops[i];
          bool r;
          if (op == "==")
            r = left.Equals(right);
          else if (op == "!=")
            r = !left.Equals(right);
          else if (op == "<")
            r = left.Less(right);
          else if (op == ">")
            r = right.Less(left);
          else if (op == "<=")
            r = left.Less(right) || left.Equals(right);
          else if (op == ">=")
            r = right.Less(left) || left.Equals(right);
          else {  // in / notin
            CallArgs a;
            a.pos.push_back(right);
            r = ApplyTest("in", left, a, *this);
            if (op == "notin") r = !r;
          }
          if (!r) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::kAnd: {
        Value a = Eval(*e.args[0], frame);
        return a.Truthy() ? Eval(*e.args[1], frame) : a;
      }
      case ExprKind::kOr: {
        Value a = Eval(*e.args[0], frame);
        return a.Truthy() ? a : Eval(*e.args[1], frame);
      }
      case ExprKind::kCondExpr:
        if (Eval(*e.args[0], frame).Truthy()) return Eval(*e.args[1], frame);
        if (e.args[2]) return Eval(*e.args[2], frame);
        return Value::MakeUndefined("the inline if-expression had no else branch");
    }
  } catch (RenderError& err) {
    // Name the first (innermost) line that failed, once.
    if (!err.raised_by_template && err.message.rfind("template line ", 0) != 0)
      err.message = "template line " + std::to_string(e.line) + ": " + err.message;
    throw;
  }
  return Value();
}

Value Interpreter::Binary(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  auto type_error = [&]() -> Value {
    Fail("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" + b.TypeName() +
         "'");
  };
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value(CheckedInt(op, AsIntLike(a), AsIntLike(b)));
    if (nums) return Value(a.ToDouble() + b.ToDouble());
    if (a.is_string() && b.is_string()) {
      CheckSize(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      Step(static_cast<int64_t>(b.as_list().size()));
      List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(l));
    }
    if (a.is_string() || b.is_string())
      Fail("can only concatenate str (not \"" + (a.is_string() ? b : a).TypeName() + "\") to str");
    return type_error();
  }
  if (op == "-") {
    if (ints) return Value(CheckedInt(op, AsIntLike(a), AsIntLike(b)));
    if (nums) return Value(a.ToDouble() - b.ToDouble());
    return type_error();
  }
  if (op == "*") {
    if (ints) return Value(CheckedInt(op, AsIntLike(a), AsIntLike(b)));
    if (nums) return Value(a.ToDouble() * b.ToDouble());
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* cnt = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (cnt->is_int() || cnt->is_bool())) {
      int64_t n = AsIntLike(*cnt);
      const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
      if (n > 0 && unit > 0) {  // the result's size, checked before it is built
        if (static_cast<uint64_t>(n) > limits_.max_output_bytes / unit + 1)
          CheckSize(limits_.max_output_bytes + 1);
        if (seq->is_string())
          CheckSize(static_cast<size_t>(n) * unit);
        else
          Step(n * static_cast<int64_t>(unit));
      }
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->as_string();
        return Value(std::move(s));
      }
      List l;
      for (int64_t i = 0; i < n; ++i)
        l.insert(l.end(), seq->as_list().begin(), seq->as_list().end());
      return Value(std::move(l));
    }
    return type_error();
  }
  if (op == "/") {
    if (!nums) return type_error();
    if (b.ToDouble() == 0) Fail("division by zero");
    return Value(a.ToDouble() / b.ToDouble());
  }
  if (op == "//") {
    if (!nums) return type_error();
    if (b.ToDouble() == 0) Fail("integer division or modulo by zero");
    if (ints) {
      if (AsIntLike(a) == INT64_MIN && AsIntLike(b) == -1) FailOverflow(op);
      return Value(FloorDiv(AsIntLike(a), AsIntLike(b)));
    }
    return Value(std::floor(a.ToDouble() / b.ToDouble()));
  }
  if (op == "%") {
    if (a.is_string())
      Fail("printf-style '%' string formatting is not supported; use ~ or the format filter");
    if (!nums) return type_error();
    if (b.ToDouble() == 0) Fail("integer division or modulo by zero");
    if (ints) {
      int64_t x = AsIntLike(a), y = AsIntLike(b);
      if (y == -1) return Value(int64_t{0});  // INT64_MIN // -1 overflows; the rest is 0
      return Value(x - FloorDiv(x, y) * y);
    }
    double x = a.ToDouble(), y = b.ToDouble();
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  if (op == "**") {
    if (ints && AsIntLike(b) >= 0) {
      // Square-and-multiply: at most 63 steps, and any overflow is caught.
      int64_t r = 1, base = AsIntLike(a);
      for (int64_t e = AsIntLike(b); e > 0; e >>= 1) {
        if (e & 1) r = CheckedInt("**", r, base);
        // Squared only when a higher bit needs it, so this overflows only
        // when the result would.
        if (e > 1) base = CheckedInt("**", base, base);
      }
      return Value(r);
    }
    if (nums) return Value(std::pow(a.ToDouble(), b.ToDouble()));
    return type_error();
  }
  Fail("unknown operator " + op);
}

}  // namespace strata::jinja
