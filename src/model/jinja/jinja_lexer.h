// Lexer of the Jinja engine: template source -> tokens, with jinja2's
// whitespace rules as transformers configures them (trim_blocks and
// lstrip_blocks on, keep_trailing_newline off, "-"/"+" markers, newlines
// normalized to "\n"). Comments vanish here; {% raw %} becomes text.
// Thread-safety: stateless functions.
#pragma once

#include <string>
#include <vector>

#include "util/status.h"

namespace strata::jinja {

enum class TokenType {
  kText,        // template data between tags (already whitespace-trimmed)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value holds the unescaped string
  kInt,
  kFloat,
  kOperator,  // value holds the operator text, e.g. "//", "==", "("
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
};

// Returns InvalidArgument (with the line number) for unterminated tags,
// strings or comments and characters that are not Jinja syntax.
StatusOr<std::vector<Token>> Lex(const std::string& source);

}  // namespace strata::jinja
