// Run-time detection of the x86-64 instruction sets the CPU backend can use,
// and the choice of kernel level (scalar / AVX2 / AVX-512) from the user's
// request. A feature counts only when both the CPU reports it (cpuid) and the
// OS saves the register state it needs (XCR0 via xgetbv), so a binary built
// for baseline x86-64 never executes an instruction the machine cannot run.
// Thread-safe: detection runs once, results are immutable.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace strata::cpu {

struct CpuFeatures {
  bool avx2 = false;         // AVX2 + FMA + F16C, YMM state enabled by the OS
  bool avx512 = false;       // AVX-512 F/BW/VL/DQ, ZMM + opmask state enabled
  bool avx512_bf16 = false;  // AVX512_BF16 (vdpbf16ps), implies avx512
  bool amx_bf16 = false;     // AMX-TILE + AMX-BF16, tile state enabled in XCR0
  bool intel = false;        // vendor GenuineIntel (tunes the GEMV's prefetch distance)
  // "avx2 avx512 avx512_bf16 amx_bf16" (the features present).
  std::string ToString() const;
};

// The running CPU's features, detected on first call.
const CpuFeatures& DetectCpuFeatures();

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* CpuIsaName(CpuIsa isa);

// Maps a requested level ("auto", "avx512", "avx2", "scalar") to a level the
// CPU described by `features` supports. "auto" picks the best one. Asking for
// a level the CPU lacks, or an unknown name, is an InvalidArgument error.
StatusOr<CpuIsa> ResolveCpuIsa(std::string_view requested, const CpuFeatures& features);

// Asks Linux for permission to use AMX tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM). Returns false if the kernel refuses or the CPU has no
// AMX. Idempotent; the result is cached.
bool RequestAmxPermission();

}  // namespace strata::cpu
