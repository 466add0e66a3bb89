// Entry point of the libFuzzer target for the storage tier's file reader
// (files under --hicache-storage-path are outside input: another process, a
// crash, a full disk or an operator can leave anything there).
//
// FileStorageOneInput takes any bytes as one storage file and must return 0
// without crashing, hanging, leaking or tripping a sanitizer; besides that it
// checks the parser's documented contract (FUZZ_CHECK aborts with the failed
// condition). Under clang it is also built as a libFuzzer binary
// (file_storage_fuzz.cmake, STRATA_LIBFUZZER defines LLVMFuzzerTestOneInput);
// under any compiler file_storage_fuzz_replay_test runs it over the seed
// corpus in tests/fuzz/file_storage/. Same conventions as
// src/model/fuzz/model_fuzz.h (cache/ cannot include model/).
// Thread-safety: none needed; libFuzzer calls one input at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cache/kv_layout.h"

namespace strata::fuzz {

int FileStorageOneInput(const uint8_t* data, size_t size);

// The two layouts (and namespaces) the target parses every input against;
// the seed corpus holds valid files of both.
struct FuzzStorageLayout {
  std::string ns;
  KvLayout layout;
};
// [0]: "fuzz-a", page size 4, one group (2 layers x K/V x 2 heads x 8, BF16).
// [1]: "fuzz-b", page size 2, two groups (2 layers x K/V x 1 x 4 F32; one
//      K-only layer 1 x 8 F16, an MLA-like latent).
const FuzzStorageLayout& FileStorageFuzzLayout(int i);

}  // namespace strata::fuzz

#ifndef FUZZ_CHECK
#define FUZZ_CHECK(cond)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "cache fuzz: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                               \
    }                                                                                             \
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
