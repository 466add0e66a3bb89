// A JSON value quoted in an error message, safe for hostile input: at most
// 80 characters, and never deeper than a few levels. nlohmann's dump()
// recurses once per nesting level, so dumping an attacker's [[[[...]]]]
// (parsing it is iterative and fine) would overflow the stack.
// Thread-safe (pure functions).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata {

// True if j nests more than `levels` arrays/objects deep. Recursion stops at
// `levels`, so it is bounded whatever the input.
template <typename JsonT>
bool JsonNestsDeeperThan(const JsonT& j, int levels) {
  if (!j.is_structured()) return false;
  if (levels == 0) return true;
  for (const auto& e : j) {
    if (JsonNestsDeeperThan(e, levels - 1)) return true;
  }
  return false;
}

template <typename JsonT>
std::string JsonSnippet(const JsonT& j) {
  if (JsonNestsDeeperThan(j, 4)) return std::string("a deeply nested ") + j.type_name();
  std::string s = j.dump(-1, ' ', false, JsonT::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace strata
