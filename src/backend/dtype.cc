#include "backend/dtype.h"

#include <cmath>

namespace strata {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

bool ParseDType(std::string_view n, DType* out) {
  if (n == "F32") *out = DType::kF32;
  else if (n == "F16") *out = DType::kF16;
  else if (n == "BF16") *out = DType::kBF16;
  else if (n == "I32") *out = DType::kI32;
  else if (n == "I64") *out = DType::kI64;
  else return false;
  return true;
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t FloatToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (absu < 0x38800000u) {  // subnormal or zero in f16
    float a;
    std::memcpy(&a, &absu, 4);
    // Round to nearest even at 2^-24 granularity.
    float scaled = a * 16777216.0f;  // a / 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((absu >> 23) - 127 + 15);
  uint32_t mant = absu & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;  // may carry into exp: correct
  return static_cast<uint16_t>(sign | h);
}

}  // namespace strata
