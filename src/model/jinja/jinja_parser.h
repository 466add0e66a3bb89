// Parser of the Jinja engine: source -> Program (jinja_ast.h), following
// jinja2's grammar and operator precedence. Everything the interpreter
// cannot run is rejected here, at model load, never at request time:
// unknown tags (include, import, extends, do, with, ...), unknown filters
// and tests, recursive loops, arguments after *args/**kwargs.
// Thread-safety: stateless function.
#pragma once

#include <memory>
#include <string>

#include "model/jinja/jinja_ast.h"
#include "util/status.h"

namespace strata::jinja {

// InvalidArgument naming the line and the construct on error.
StatusOr<std::shared_ptr<const Program>> ParseTemplate(const std::string& source);

}  // namespace strata::jinja
