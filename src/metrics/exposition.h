// Text exposition format 0.0.4: how numbers, help text and label values are
// written. Pure functions, thread-safe. Used by Registry::Render; public so
// that tests and other exporters format exactly the same way.
#pragma once

#include <string>
#include <string_view>

namespace strata::metrics {

// Integers (exact in a double) without exponent or point ("3", "-2"); others
// shortest round-trip ("0.25", "1e-05", "1e+20"); "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);
// # HELP text: backslash and newline escaped.
std::string EscapeHelp(std::string_view help);
// Label values: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view value);

}  // namespace strata::metrics
