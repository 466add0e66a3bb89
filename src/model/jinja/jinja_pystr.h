// Python str semantics for the Jinja engine: the str methods chat templates
// call (content.split('</think>'), .startswith(...), .strip('\n'), ...) and
// the case mappings jinja2's filters use, on UTF-8 with code-point indices.
// Thread-safety: stateless functions; they throw RenderError on bad input.
#pragma once

#include <cstdint>
#include <string>

#include "model/jinja/jinja_builtins.h"
#include "model/jinja/jinja_limits.h"
#include "model/jinja/jinja_value.h"

namespace strata::jinja {

// Throws unless `v` is a string / integer (bools count as 0/1, as in Python).
const std::string& RequireString(const Value& v, const char* what);
int64_t ToInt(const Value& v, const char* what);

std::string MapString(const std::string& s, int how);  // how: 0 lower(), 1 upper()
std::string PyCapitalize(const std::string& s);        // str.capitalize()
std::string JinjaTitle(const std::string& s);          // jinja2's title filter (not str.title)
// str.replace(from, to, count); count < 0 replaces all.
// Fails (RenderError) once the result passes max_bytes: replace("", x) on a
// long string grows it by |x| per character.
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, size_t max_bytes = RenderLimits().max_output_bytes);
// str.split(sep, maxsplit) / rsplit; sep none = runs of whitespace.
List Split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right);

// s.<name>(args) for the supported str methods (IsStrMethod).
bool IsStrMethod(const std::string& name);
Value StrMethod(const std::string& s, const std::string& name, CallArgs& args);
// A Python method name templates might call that the engine lacks (format,
// zfill, ...); the parser rejects `x.<name>(...)` with it.
bool IsUnsupportedPyMethod(const std::string& name);

}  // namespace strata::jinja
