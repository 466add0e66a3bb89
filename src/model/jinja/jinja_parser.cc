#include "model/jinja/jinja_parser.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "model/jinja/jinja_builtins.h"
#include "model/jinja/jinja_lexer.h"
#include "model/jinja/jinja_pystr.h"

namespace strata::jinja {
namespace {

struct ParseError {
  std::string message;
};

// Deepest expression tree under e (1 for a leaf), stopping once past
// kMaxNestingDepth; iterative, since e may be arbitrarily deep.
int ExprDepth(const Expr& root) {
  int deepest = 0;
  std::vector<std::pair<const Expr*, int>> stack = {{&root, 1}};
  while (!stack.empty()) {
    auto [e, d] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, d);
    if (deepest > kMaxNestingDepth) break;
    for (const ExprPtr& a : e->args)
      if (a) stack.push_back({a.get(), d + 1});
    for (const auto& kv : e->kwargs)
      if (kv.second) stack.push_back({kv.second.get(), d + 1});
    if (e->star_args) stack.push_back({e->star_args.get(), d + 1});
    if (e->star_kwargs) stack.push_back({e->star_kwargs.get(), d + 1});
  }
  return deepest;
}

// Counts the parser's recursion (blocks inside blocks, brackets inside
// brackets, `not not ...`, `- - ...`; one level of brackets passes three
// guards) and fails past about kMaxNestingDepth levels.
class DepthGuard {
 public:
  DepthGuard(int* depth, int line) : depth_(depth) {
    if (++*depth_ > 3 * kMaxNestingDepth) {
      --*depth_;
      throw ParseError{"template line " + std::to_string(line) +
                       ": blocks or expressions nest more than " +
                       std::to_string(kMaxNestingDepth) + " levels deep"};
    }
  }
  ~DepthGuard() { --*depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int* depth_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::shared_ptr<Program> Run() {
    auto prog = std::make_shared<Program>();
    prog->body = Subparse({});
    return prog;
  }

 private:
  // ---- token helpers ----
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void Next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool IsOp(const char* op) const {
    return Cur().type == TokenType::kOperator && Cur().value == op;
  }
  bool IsName(const char* name) const {
    return Cur().type == TokenType::kName && Cur().value == name;
  }
  [[noreturn]] void Fail(const std::string& what, int line = -1) const {
    throw ParseError{"template line " + std::to_string(line < 0 ? Cur().line : line) + ": " + what};
  }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kText:
        return "template text";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "'}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "'%}'";
      case TokenType::kEof:
        return "end of template";
      case TokenType::kString:
        return "string literal";
      default:
        return "'" + t.value + "'";
    }
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(std::string("expected '") + op + "', got " + Describe(Cur()));
    Next();
  }
  void ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd)
      Fail("expected end of statement '%}', got " + Describe(Cur()));
    Next();
  }
  std::string ExpectName() {
    if (Cur().type != TokenType::kName) Fail("expected a name, got " + Describe(Cur()));
    std::string n = Cur().value;
    Next();
    return n;
  }
  ExprPtr Make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `ends`; leaves the cursor on
  // that name. With empty `ends`, parses to the end of the template.
  Body Subparse(const std::set<std::string>& ends) {
    DepthGuard guard(&depth_, Cur().line);
    Body body;
    while (true) {
      const Token& tok = Cur();
      if (tok.type == TokenType::kEof) {
        if (!ends.empty()) {
          std::string names;
          for (const auto& e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
          Fail("unexpected end of template: expected " + names +
               " to close a block opened earlier");
        }
        return body;
      }
      if (tok.type == TokenType::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = tok.line;
        s->text = tok.value;
        body.push_back(std::move(s));
        Next();
      } else if (tok.type == TokenType::kVarBegin) {
        int line = tok.line;
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = line;
        s->expr = ParseTuple(true);
        if (Cur().type != TokenType::kVarEnd) Fail("expected '}}', got " + Describe(Cur()));
        Next();
        body.push_back(std::move(s));
      } else if (tok.type == TokenType::kBlockBegin) {
        Next();
        if (Cur().type != TokenType::kName)
          Fail("expected a tag name after '{%', got " + Describe(Cur()));
        if (ends.count(Cur().value)) return body;
        body.push_back(ParseStatement());
      } else {
        Fail("unexpected " + Describe(tok));
      }
    }
  }

  StmtPtr ParseStatement() {
    const std::string tag = Cur().value;
    int line = Cur().line;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    Next();
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      s->conds.push_back(ParseTuple(false));
      ExpectBlockEnd();
      while (true) {
        s->bodies.push_back(Subparse({"elif", "else", "endif"}));
        std::string t = ExpectName();
        if (t == "elif") {
          s->conds.push_back(ParseTuple(false));
          ExpectBlockEnd();
        } else if (t == "else") {
          ExpectBlockEnd();
          s->else_body = Subparse({"endif"});
          Next();
          ExpectBlockEnd();
          break;
        } else {
          ExpectBlockEnd();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = StmtKind::kFor;
      s->targets = ParseTargets(false);
      if (!IsName("in")) Fail("expected 'in' in a for loop, got " + Describe(Cur()));
      Next();
      s->expr = ParseTuple(false, /*stop_at_if=*/true);
      if (IsName("if")) {
        Next();
        s->cond = ParseExpression();
      }
      if (IsName("recursive")) Fail("recursive for loops are not supported");
      ExpectBlockEnd();
      ++loop_depth_;
      s->body = Subparse({"endfor", "else"});
      --loop_depth_;
      if (ExpectName() == "else") {
        ExpectBlockEnd();
        s->else_body = Subparse({"endfor"});
        Next();
      }
      ExpectBlockEnd();
    } else if (tag == "set") {
      s->targets = ParseTargets(true);
      if (IsOp("=")) {
        Next();
        s->kind = StmtKind::kSet;
        s->expr = ParseTuple(true);
        ExpectBlockEnd();
      } else {
        s->kind = StmtKind::kSetBlock;
        if (s->targets.size() != 1 || s->targets[0].find('.') != std::string::npos)
          Fail("a block set ({% set x %}...{% endset %}) takes one plain name");
        s->filters = ParseFilterChain();
        ExpectBlockEnd();
        s->body = Subparse({"endset"});
        Next();
        ExpectBlockEnd();
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      s->name = ExpectName();
      s->params = ParseParams();
      ExpectBlockEnd();
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = Subparse({"endmacro"});
      loop_depth_ = saved;
      Next();
      ExpectBlockEnd();
    } else if (tag == "call") {
      s->kind = StmtKind::kCallBlock;
      if (IsOp("(")) s->params = ParseParams();
      s->expr = ParseExpression();
      if (s->expr->kind != ExprKind::kCall)
        Fail("{% call %} needs a macro call, e.g. {% call m(x) %}", line);
      ExpectBlockEnd();
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = Subparse({"endcall"});
      loop_depth_ = saved;
      Next();
      ExpectBlockEnd();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Fail("'" + tag + "' outside of a for loop");
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      ExpectBlockEnd();
    } else if (tag == "filter") {
      s->kind = StmtKind::kFilterBlock;
      // The first filter has no leading '|'.
      int fl = Cur().line;
      s->filters.push_back(ParseFilterCall(fl));
      auto more = ParseFilterChain();
      for (auto& f : more) s->filters.push_back(std::move(f));
      ExpectBlockEnd();
      s->body = Subparse({"endfilter"});
      Next();
      ExpectBlockEnd();
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: marks assistant text for
      // return_assistant_tokens_mask; renders its body unchanged.
      s->kind = StmtKind::kPassBody;
      ExpectBlockEnd();
      s->body = Subparse({"endgeneration"});
      Next();
      ExpectBlockEnd();
    } else {
      static const std::set<std::string> kEnds = {"endif",    "endfor",    "endset",
                                                  "endmacro", "endfilter", "endcall",
                                                  "elif",     "else",      "endgeneration"};
      if (kEnds.count(tag)) Fail("unexpected '" + tag + "' (no open block it could close)", line);
      Fail("unsupported tag '" + tag +
               "' (Strata's chat template engine supports if, for, set, macro, "
               "call, filter, break, continue, raw, generation)",
           line);
    }
    return s;
  }

  // '(' name [= default], ... ')' of a macro or a call block's caller.
  std::vector<MacroParam> ParseParams() {
    std::vector<MacroParam> params;
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      MacroParam p;
      p.name = ExpectName();
      if (IsOp("=")) {
        Next();
        p.default_value = ParseExpression();
      }
      params.push_back(std::move(p));
    }
    Next();
    return params;
  }

  // Assignment targets: `a`, `a, b`, `(a, b)`, and with `ns` allowed, `ns.attr`.
  std::vector<std::string> ParseTargets(bool allow_attr) {
    std::vector<std::string> names;
    bool paren = IsOp("(");
    if (paren) Next();
    while (true) {
      std::string n = ExpectName();
      if (allow_attr && IsOp(".")) {
        Next();
        n += "." + ExpectName();
      }
      names.push_back(n);
      if (!IsOp(",")) break;
      Next();
      if (paren && IsOp(")")) break;
    }
    if (paren) ExpectOp(")");
    for (const auto& n : names)
      if (n.find('.') != std::string::npos && names.size() > 1)
        Fail("cannot unpack into a namespace attribute");
    return names;
  }

  // `| f(args) | g ...` after a block set name.
  std::vector<ExprPtr> ParseFilterChain() {
    std::vector<ExprPtr> out;
    while (IsOp("|")) {
      int line = Cur().line;
      Next();
      out.push_back(ParseFilterCall(line));
    }
    return out;
  }

  // name[.name](args) with a null operand in args[0].
  ExprPtr ParseFilterCall(int line) {
    auto f = Make(ExprKind::kFilter, line);
    f->name = ExpectName();
    while (IsOp(".")) {
      Next();
      f->name += "." + ExpectName();
    }
    if (!HasFilter(f->name)) Fail("unknown filter '" + f->name + "'", line);
    f->args.push_back(nullptr);
    if (IsOp("(")) ParseCallArgs(*f);
    return f;
  }

  // ---- expressions ----

  // A comma-separated tuple (as a list) or a single expression.
  ExprPtr ParseTuple(bool with_condexpr, bool stop_at_if = false) {
    int line = Cur().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!IsOp(",")) break;
        Next();
        comma = true;
        if (Cur().type == TokenType::kVarEnd || Cur().type == TokenType::kBlockEnd || IsOp("=") ||
            IsOp(")") || (stop_at_if && IsName("if")))
          break;
      }
      items.push_back(with_condexpr ? ParseExpression() : ParseOr());
    }
    if (!comma) return std::move(items[0]);
    auto e = Make(ExprKind::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr ParseExpression() {
    DepthGuard guard(&depth_, Cur().line);
    ExprPtr e = ParseOr();
    while (IsName("if")) {
      int line = Cur().line;
      Next();
      auto c = Make(ExprKind::kCondExpr, line);
      ExprPtr cond = ParseOr();
      ExprPtr other;
      if (IsName("else")) {
        Next();
        other = ParseExpression();
      }
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr Binary(ExprKind k, ExprPtr a, ExprPtr b, int line, std::string op = "") {
    auto e = Make(k, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      int line = Cur().line;
      Next();
      e = Binary(ExprKind::kOr, std::move(e), ParseAnd(), line);
    }
    return e;
  }

  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      int line = Cur().line;
      Next();
      e = Binary(ExprKind::kAnd, std::move(e), ParseNot(), line);
    }
    return e;
  }

  ExprPtr ParseNot() {
    DepthGuard guard(&depth_, Cur().line);
    if (IsName("not")) {
      int line = Cur().line;
      Next();
      auto e = Make(ExprKind::kNot, line);
      e->args.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    int line = Cur().line;
    ExprPtr first = ParseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" || Cur().value == ">" ||
           Cur().value == "<=" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(ExprKind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      std::string op = Cur().value;
      int line = Cur().line;
      Next();
      e = Binary(ExprKind::kBinary, std::move(e), ParseConcat(), line, op);
    }
    return e;
  }

  ExprPtr ParseConcat() {
    int line = Cur().line;
    ExprPtr e = ParseMath2();
    if (!IsOp("~")) return e;
    auto c = Make(ExprKind::kConcat, line);
    c->args.push_back(std::move(e));
    while (IsOp("~")) {
      Next();
      c->args.push_back(ParseMath2());
    }
    return c;
  }

  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Cur().value;
      int line = Cur().line;
      if (op == "%" && e->kind == ExprKind::kLiteral && e->value.is_string())
        Fail("printf-style string formatting ('...' % x) is not supported; use ~ to concatenate",
             line);
      Next();
      e = Binary(ExprKind::kBinary, std::move(e), ParsePow(), line, op);
    }
    return e;
  }

  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      int line = Cur().line;
      Next();
      e = Binary(ExprKind::kBinary, std::move(e), ParseUnary(true), line, "**");
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    int line = Cur().line;
    DepthGuard guard(&depth_, line);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      bool neg = IsOp("-");
      Next();
      e = Make(neg ? ExprKind::kNeg : ExprKind::kPos, line);
      e->args.push_back(ParseUnary(false));
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    if (with_filter) e = ParseFilterExpr(std::move(e));
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& tok = Cur();
    int line = tok.line;
    switch (tok.type) {
      case TokenType::kName: {
        std::string n = tok.value;
        Next();
        auto lit = [&](Value v) {
          auto e = Make(ExprKind::kLiteral, line);
          e->value = std::move(v);
          return e;
        };
        if (n == "true" || n == "True") return lit(Value(true));
        if (n == "false" || n == "False") return lit(Value(false));
        if (n == "none" || n == "None") return lit(Value::MakeNone());
        auto e = Make(ExprKind::kName, line);
        e->name = n;
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().value;
          Next();
        }
        auto e = Make(ExprKind::kLiteral, line);
        e->value = Value(std::move(s));
        return e;
      }
      case TokenType::kInt: {
        auto e = Make(ExprKind::kLiteral, line);
        try {
          e->value = Value(static_cast<int64_t>(std::stoll(tok.value)));
        } catch (...) {
          Fail("integer literal out of range: " + tok.value);
        }
        Next();
        return e;
      }
      case TokenType::kFloat: {
        auto e = Make(ExprKind::kLiteral, line);
        // Like Python's float(): 1e999 is inf (std::stod would throw).
        e->value = Value(std::strtod(tok.value.c_str(), nullptr));
        Next();
        return e;
      }
      case TokenType::kOperator:
        if (tok.value == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return Make(ExprKind::kTuple, line);  // ()
          }
          ExprPtr e = ParseTuple(true);
          ExpectOp(")");
          return e;
        }
        if (tok.value == "[") {
          Next();
          auto e = Make(ExprKind::kList, line);
          while (!IsOp("]")) {
            if (!e->args.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            e->args.push_back(ParseExpression());
          }
          Next();
          return e;
        }
        if (tok.value == "{") {
          Next();
          auto e = Make(ExprKind::kDict, line);
          while (!IsOp("}")) {
            if (!e->args.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            e->args.push_back(ParseExpression());
            ExpectOp(":");
            e->args.push_back(ParseExpression());
          }
          Next();
          return e;
        }
        [[fallthrough]];
      default:
        Fail("unexpected " + Describe(tok) + " in an expression");
    }
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().type == TokenType::kName) {
          auto a = Make(ExprKind::kGetAttr, line);
          a->name = Cur().value;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (Cur().type == TokenType::kInt) {
          auto a = Make(ExprKind::kGetItem, line);
          auto idx = Make(ExprKind::kLiteral, line);
          try {
            idx->value = Value(static_cast<int64_t>(std::stoll(Cur().value)));
          } catch (...) {
            Fail("integer literal out of range: " + Cur().value);
          }
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
          e = std::move(a);
        } else {
          Fail("expected an attribute name after '.', got " + Describe(Cur()));
        }
        Next();
      } else if (IsOp("[")) {
        Next();
        e = ParseSubscript(std::move(e), line);
      } else if (IsOp("(")) {
        e = MakeCall(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  ExprPtr MakeCall(ExprPtr callee, int line) {
    if (callee->kind == ExprKind::kGetAttr && IsUnsupportedPyMethod(callee->name))
      Fail("the Python method '" + callee->name + "()' is not supported in chat templates", line);
    auto c = Make(ExprKind::kCall, line);
    c->args.push_back(std::move(callee));
    ParseCallArgs(*c);
    return c;
  }

  // After '[': an index or a slice, then ']'.
  ExprPtr ParseSubscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!IsOp(":") && !IsOp("]")) parts[k] = ParseExpression();
      if (k < 2 && IsOp(":")) {
        is_slice = true;
        Next();
      } else {
        break;
      }
    }
    ExpectOp("]");
    if (!is_slice) {
      if (!parts[0]) Fail("empty subscript '[]'", line);
      auto g = Make(ExprKind::kGetItem, line);
      g->args.push_back(std::move(obj));
      g->args.push_back(std::move(parts[0]));
      return g;
    }
    auto s = Make(ExprKind::kSlice, line);
    s->args.push_back(std::move(obj));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // '(' args ')' appended to e.args / e.kwargs.
  void ParseCallArgs(Expr& e) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) {
        bool kw = IsOp("**");
        Next();
        (kw ? e.star_kwargs : e.star_args) = ParseExpression();
        continue;
      }
      if (e.star_args || e.star_kwargs) Fail("arguments after *args / **kwargs are not supported");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOperator &&
          Peek().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        e.kwargs.emplace_back(key, ParseExpression());
      } else {
        if (!e.kwargs.empty()) Fail("positional argument after a keyword argument");
        e.args.push_back(ParseExpression());
      }
    }
    Next();
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      int line = Cur().line;
      if (IsOp("|")) {
        Next();
        ExprPtr f = ParseFilterCall(line);
        f->args[0] = std::move(e);
        e = std::move(f);
      } else if (IsName("is")) {
        Next();
        auto t = Make(ExprKind::kTest, line);
        if (IsName("not")) {
          t->negated = true;
          Next();
        }
        t->name = ExpectName();
        while (IsOp(".")) {
          Next();
          t->name += "." + ExpectName();
        }
        if (!HasTest(t->name)) Fail("unknown test '" + t->name + "'", line);
        t->args.push_back(std::move(e));
        const Token& c = Cur();
        if (IsOp("(")) {
          ParseCallArgs(*t);
        } else if ((c.type == TokenType::kName || c.type == TokenType::kString ||
                    c.type == TokenType::kInt || c.type == TokenType::kFloat || IsOp("[") ||
                    IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) Fail("tests cannot be chained with 'is'");
          t->args.push_back(ParsePostfix(ParsePrimary()));
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        e = MakeCall(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;  // DepthGuard
};

// Refuses expression trees deeper than kMaxNestingDepth, which the loops
// for left-associative operators and postfix chains (a.b.c..., x|f|f...)
// build without recursing. Statement nesting is bounded by DepthGuard.
void CheckDepth(const Body& body) {
  auto check = [](const ExprPtr& e) {
    if (e && ExprDepth(*e) > kMaxNestingDepth)
      throw ParseError{"template line " + std::to_string(e->line) +
                       ": an expression nests more than " + std::to_string(kMaxNestingDepth) +
                       " levels deep"};
  };
  for (const StmtPtr& s : body) {
    check(s->expr);
    check(s->cond);
    for (const ExprPtr& c : s->conds) check(c);
    for (const ExprPtr& f : s->filters) check(f);
    for (const MacroParam& p : s->params) check(p.default_value);
    for (const Body& b : s->bodies) CheckDepth(b);
    CheckDepth(s->body);
    CheckDepth(s->else_body);
  }
}

}  // namespace

Expr::~Expr() {
  std::vector<ExprPtr> pending;
  auto adopt = [&pending](Expr& e) {
    for (ExprPtr& a : e.args)
      if (a) pending.push_back(std::move(a));
    for (auto& kv : e.kwargs)
      if (kv.second) pending.push_back(std::move(kv.second));
    if (e.star_args) pending.push_back(std::move(e.star_args));
    if (e.star_kwargs) pending.push_back(std::move(e.star_kwargs));
  };
  adopt(*this);
  while (!pending.empty()) {
    ExprPtr e = std::move(pending.back());
    pending.pop_back();
    adopt(*e);
  }  // each e is destroyed here with no children left
}

StatusOr<std::shared_ptr<const Program>> ParseTemplate(const std::string& source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  try {
    std::shared_ptr<Program> program = Parser(std::move(tokens)).Run();
    CheckDepth(program->body);
    return std::shared_ptr<const Program>(std::move(program));
  } catch (const ParseError& e) {
    return InvalidArgument(e.message);
  }
}

}  // namespace strata::jinja
