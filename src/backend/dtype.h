// Element types of weights, activations and KV pages, and scalar conversions.
// Conversions are exact round-to-nearest-even (float -> bf16/f16) and exact
// widening (bf16/f16 -> float), matching PyTorch's.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace strata {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64 };

inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

// "F32", "F16", "BF16", "I32", "I64" (safetensors spelling).
const char* DTypeName(DType t);
// Parses the safetensors spelling; false if unknown.
bool ParseDType(std::string_view name, DType* out);

inline float Bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float F16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);

}  // namespace strata
