// Syntax tree of the Jinja engine: what the parser builds and the
// interpreter walks. Plain data; a parsed tree is immutable and shared by
// every Render of its template.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/jinja_value.h"

namespace strata::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kLiteral,   // value
  kName,      // name
  kList,      // args = items
  kTuple,     // args = items: (a, b) or a, b
  kDict,      // args = key0, value0, key1, value1, ...
  kGetAttr,   // args[0].name
  kGetItem,   // args[0][args[1]]
  kSlice,     // args[0][args[1]:args[2]:args[3]] (null = omitted)
  kCall,      // args[0](args[1..], kwargs)
  kFilter,    // args[0] | name(args[1..], kwargs)
  kTest,      // args[0] is [not] name(args[1..])  (negated)
  kNot,       // not args[0]
  kNeg,       // -args[0]
  kPos,       // +args[0]
  kBinary,    // args[0] op args[1]: + - * / // % **
  kConcat,    // args[0] ~ args[1] ~ ...
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...: == != < > <= >= in notin
  kAnd,       // args[0] and args[1]
  kOr,        // args[0] or args[1]
  kCondExpr,  // args[1] if args[0] else args[2] (args[2] null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;                   // kLiteral
  std::string name;              // kName, kGetAttr, kFilter, kTest, kBinary (operator)
  bool negated = false;          // kTest
  std::vector<std::string> ops;  // kCompare
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter
  ExprPtr star_args;                                    // kCall: f(*xs)  (may be null)
  ExprPtr star_kwargs;                                  // kCall: f(**d)  (may be null)

  Expr() = default;
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;
  // Iterative: `1+1+1+...` builds a left-deep tree as deep as the template
  // is long, and the default destructor would recurse once per level.
  ~Expr();
};

// How deep expressions and blocks may nest in a template. Rendering recurses
// once per level, so the parser refuses deeper templates rather than
// overflowing the stack; real chat templates nest under 20.
inline constexpr int kMaxNestingDepth = 100;

enum class StmtKind {
  kText,      // text
  kPrint,     // {{ expr }}
  kIf,        // conds[i] -> bodies[i]; else_body
  kFor,       // for targets in expr [if cond] body [else else_body]
  kSet,       // set targets = expr  (targets "ns.attr" for namespace attributes)
  kSetBlock,  // set targets[0] [| filters] body endset
  kMacro,     // macro name(params = defaults) body
  kBreak,
  kContinue,
  kFilterBlock,  // filter filters body endfilter
  kPassBody,     // generation / endgeneration: renders body unchanged
  kCallBlock,    // call[(params)] expr body endcall: expr (a kCall) gets caller=body
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                  // kText
  std::string name;                  // kMacro
  ExprPtr expr;                      // kPrint, kFor (iterable), kSet (value)
  ExprPtr cond;                      // kFor (loop filter)
  std::vector<ExprPtr> conds;        // kIf
  std::vector<Body> bodies;          // kIf
  std::vector<std::string> targets;  // kFor, kSet, kSetBlock
  std::vector<ExprPtr> filters;      // kSetBlock, kFilterBlock: kFilter exprs whose args[0] is null
  std::vector<MacroParam> params;    // kMacro, kCallBlock (the caller's)
  Body body;
  Body else_body;
};

struct Program {
  Body body;
};

}  // namespace strata::jinja
