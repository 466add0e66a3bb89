// Interpreter of the Jinja engine: walks a parsed Program with jinja2's
// runtime semantics (scoping: a for-loop iteration and a macro call get
// their own scope, if-blocks do not; `loop` variables; undefined values that
// print as "" but fail when used as objects).
//
// One Interpreter renders once; it is cheap to build. It borrows the
// Program, which must outlive it. Not thread-safe; use one per Render.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>

#include "model/jinja/jinja_ast.h"
#include "model/jinja/jinja_builtins.h"
#include "model/jinja/jinja_limits.h"
#include "model/jinja/jinja_value.h"

namespace strata::jinja {

class Interpreter {
 public:
  // `context`: the variables the template sees (messages, tools, ...).
  // `now`: the local time strftime_now() formats.
  Interpreter(const Program& program, const Dict& context, const std::tm& now,
              const RenderLimits& limits = RenderLimits());

  // Throws RenderError.
  std::string Render();

  // For builtins: calls a function value (macro, builtin, bound method).
  Value Call(const Value& callee, CallArgs& args);
  const std::tm& now() const { return now_; }
  // Throws RenderError if a string of `bytes` would pass the output limit.
  // Builtins that build a string whose size an argument picks (indent,
  // tojson's indent, ...) call it before building it.
  void CheckSize(size_t bytes) const;
  size_t max_output_bytes() const { return limits_.max_output_bytes; }
  // Charges n loop iterations (or list elements built) to the step budget.
  void Step(int64_t n);

 private:
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Frame> parent;
  };
  using FramePtr = std::shared_ptr<Frame>;
  enum class Flow { kNormal, kBreak, kContinue };

  Flow Exec(const Body& body, const FramePtr& frame, std::string& out);
  Flow ExecFor(const Stmt& s, const FramePtr& frame, std::string& out);
  void Assign(const std::vector<std::string>& targets, const Value& v, const FramePtr& frame,
              int line);
  Value DefineMacro(const Stmt& s, const FramePtr& frame);

  Value Eval(const Expr& e, const FramePtr& frame);
  Value Lookup(const std::string& name, const FramePtr& frame) const;
  CallArgs EvalArgs(const Expr& e, size_t first, const FramePtr& frame);
  Value Binary(const std::string& op, const Value& a, const Value& b);
  Value ApplyFilters(const std::vector<ExprPtr>& filters, Value v, const FramePtr& frame);

  class DepthGuard;
  // Exec/Eval frames across macro calls (kMaxNestingDepth bounds them
  // within one body; macros may call macros up to kMaxCallDepth deep).
  static constexpr int kMaxRenderDepth = 2000;

  const Program& program_;
  std::tm now_;
  RenderLimits limits_;
  FramePtr root_;
  int call_depth_ = 0;
  int render_depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace strata::jinja
