// Entry points of the libFuzzer targets for the parsers of model files (the
// files come from whoever published the checkpoint, so they are outside
// input): safetensors headers, the shard index, config.json /
// generation_config.json, tokenizer.json, and Jinja chat templates.
//
// Each function takes any bytes and must return 0 without crashing, hanging,
// leaking, throwing or tripping a sanitizer; besides that it checks the
// parser's documented contract (FUZZ_CHECK aborts with the failed condition).
// Under clang each is also built as a libFuzzer binary (model_fuzz.cmake,
// STRATA_LIBFUZZER defines LLVMFuzzerTestOneInput); under any compiler
// model_fuzz_replay_test runs them over the seed corpora in tests/fuzz/.
// Thread-safety: none needed; libFuzzer calls one input at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace strata::fuzz {

int SafetensorsOneInput(const uint8_t* data, size_t size);
int SafetensorsIndexOneInput(const uint8_t* data, size_t size);
int HfConfigOneInput(const uint8_t* data, size_t size);
int TokenizerOneInput(const uint8_t* data, size_t size);
int JinjaOneInput(const uint8_t* data, size_t size);

}  // namespace strata::fuzz

#define FUZZ_CHECK(cond)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "model fuzz: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

// In a libFuzzer binary, `fn` is the target's LLVMFuzzerTestOneInput.
#ifdef STRATA_LIBFUZZER
#define STRATA_FUZZ_ENTRY(fn)                                               \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return strata::fuzz::fn(data, size);                                    \
  }
#else
#define STRATA_FUZZ_ENTRY(fn)
#endif
