// Bounded JSON parsing of request bodies (outside input): no exceptions, a
// nesting limit, short error messages.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "server/api_error.h"

namespace strata {

// Parses JSON without exceptions and with a nesting limit; the error is a 400
// "invalid JSON: ..." with the byte position and reason (param null).
ApiOr<nlohmann::ordered_json> ParseJsonBody(std::string_view body, int max_depth);

}  // namespace strata
