// Entry point of the libFuzzer target for the bootstrap message decoder
// (a bootstrap frame is outside input: any process that reaches the
// prefill's --disaggregation-bootstrap-port can send one).
//
// BootstrapMessageOneInput takes any bytes as one frame payload and must
// return 0 without crashing, hanging, leaking or tripping a sanitizer;
// besides that it checks DecodeMessage's documented contract (FUZZ_CHECK
// aborts with the failed condition). Under clang it is also built as a
// libFuzzer binary (bootstrap_fuzz.cmake; STRATA_LIBFUZZER defines
// LLVMFuzzerTestOneInput); under any compiler bootstrap_fuzz_replay_test
// runs it over the seed corpus in tests/fuzz/bootstrap/. Same conventions as
// src/cache/fuzz/cache_fuzz.h.
// Thread-safety: none needed; libFuzzer calls one input at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace strata::fuzz {

int BootstrapMessageOneInput(const uint8_t* data, size_t size);

}  // namespace strata::fuzz

#ifndef FUZZ_CHECK
#define FUZZ_CHECK(cond)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "disagg fuzz: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
#endif

#ifndef STRATA_FUZZ_ENTRY
#ifdef STRATA_LIBFUZZER
#define STRATA_FUZZ_ENTRY(fn)                                               \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return strata::fuzz::fn(data, size);                                    \
  }
#else
#define STRATA_FUZZ_ENTRY(fn)
#endif
#endif
