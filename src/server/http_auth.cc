#include "server/http_auth.h"

#include <cstddef>
#include <cstdint>

namespace strata {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

bool ConstantTimeEquals(std::string_view given, std::string_view secret) {
  // Every byte of the secret is read and combined; `given` is indexed modulo
  // its length so a short or empty value costs the same as a full one.
  uint32_t diff = given.size() == secret.size() ? 0u : 1u;
  const size_t n = given.size();
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char g = n == 0 ? 0 : static_cast<unsigned char>(given[i % n]);
    diff |= g ^ static_cast<unsigned char>(secret[i]);
    // Keeps the compiler from turning the loop into an early exit.
    __asm__ __volatile__("" : "+r"(diff));
  }
  return diff == 0;
}

BearerCheck CheckBearer(std::string_view authorization, std::string_view key) {
  while (!authorization.empty() && IsSpace(authorization.front())) authorization.remove_prefix(1);
  while (!authorization.empty() && IsSpace(authorization.back())) authorization.remove_suffix(1);
  if (authorization.empty()) return BearerCheck::kMissing;
  // credentials = auth-scheme 1*SP token68
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size()) return BearerCheck::kInvalid;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (Lower(authorization[i]) != kScheme[i]) return BearerCheck::kInvalid;
  }
  std::string_view rest = authorization.substr(kScheme.size());
  if (!IsSpace(rest.front())) return BearerCheck::kInvalid;  // "Bearerxyz"
  while (!rest.empty() && IsSpace(rest.front())) rest.remove_prefix(1);
  return ConstantTimeEquals(rest, key) ? BearerCheck::kOk : BearerCheck::kInvalid;
}

}  // namespace strata
