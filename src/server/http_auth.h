// API-key checks for the HTTP transport: parses `Authorization: Bearer <key>`
// (RFC 6750 §2.1; the auth-scheme is case-insensitive, RFC 9110 §11.1) and
// compares the key in constant time. Pure functions; thread-safe.
#pragma once

#include <string_view>

namespace strata {

enum class BearerCheck {
  kOk,       // the header carries the expected key
  kMissing,  // no Authorization header (or an empty one)
  kInvalid,  // another scheme, a malformed value or a wrong key
};

// Checks the value of the Authorization header (empty when absent) against
// `key`. REQUIRES: `key` is not empty (an empty key means "no auth": the
// caller does not ask). The time taken depends on the lengths of the two
// values, never on where they first differ.
BearerCheck CheckBearer(std::string_view authorization, std::string_view key);

// True iff a == b. Reads every byte of `secret` whatever `given` holds, so the
// time depends only on secret.size() (and not on the first differing byte,
// nor on given.size()).
bool ConstantTimeEquals(std::string_view given, std::string_view secret);

}  // namespace strata
