#include "backend/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace strata::cpu {
namespace {

// xgetbv without needing -mxsave on this (baseline) translation unit.
uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d))
    f.intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & (1u << 12);
  const bool osxsave = c & (1u << 27);
  const bool avx = c & (1u << 28);
  const bool f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;          // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_tile = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG + XTILEDATA
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17);
  const bool avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  const unsigned subleaves = a;
  bool avx512_bf16 = false;
  if (subleaves >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    avx512_bf16 = a & (1u << 5);
  }
  f.avx2 = os_ymm && avx2 && fma && f16c;
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512_bf16 = f.avx512 && avx512_bf16;
  f.amx_bf16 = f.avx512 && os_tile && amx_tile && amx_bf16;
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(avx512, "avx512");
  add(avx512_bf16, "avx512_bf16");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "baseline" : s;
}

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

StatusOr<CpuIsa> ResolveCpuIsa(std::string_view requested, const CpuFeatures& f) {
  if (requested == "auto" || requested.empty()) {
    if (f.avx512) return CpuIsa::kAvx512;
    if (f.avx2) return CpuIsa::kAvx2;
    return CpuIsa::kScalar;
  }
  if (requested == "scalar") return CpuIsa::kScalar;
  if (requested == "avx2" || requested == "avx512") {
    const bool have = requested == "avx2" ? f.avx2 : f.avx512;
    if (!have) {
      return InvalidArgument("CPU backend: isa \"" + std::string(requested) +
                             "\" requested but this CPU (features: " + f.ToString() +
                             ") does not support it; use isa \"auto\"");
    }
    return requested == "avx2" ? CpuIsa::kAvx2 : CpuIsa::kAvx512;
  }
  return InvalidArgument("CPU backend: unknown isa \"" + std::string(requested) +
                         "\"; expected one of auto, avx512, avx2, scalar");
}

bool RequestAmxPermission() {
  static const bool granted = [] {
    if (!DetectCpuFeatures().amx_bf16) return false;
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

}  // namespace strata::cpu
