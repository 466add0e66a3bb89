// Bounded JSON parsing of request bodies (outside input): no exceptions, a
// nesting limit, short error messages, and time linear in the body's size.
//
// Objects keep the client's key order (chat templates render tools and
// messages as sent, e.g. `tools|tojson`), so the result is an ordered_json.
// ordered_json's own parser inserts each key by a linear search of the keys
// before it, O(N^2) for an object of N keys (200,000 keys: 39 s); this one
// builds the DOM itself and finds duplicate keys through a hash of each large
// object's keys. A duplicate key keeps its first position and its last value
// (what ordered_json's parser did).
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
