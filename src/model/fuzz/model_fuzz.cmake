# libFuzzer binaries for the parsers of model files (clang only; under any
# compiler model_fuzz_replay_test runs the same entry points over the seed
# corpora). Each binary compiles the parser it covers again, with coverage
# instrumentation and ASan/UBSan, and links only strata_util below it, so a
# clang build dir needs no backend kernels:
#   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   ninja -C build-fuzz safetensors_fuzz
#   build-fuzz/safetensors_fuzz -runs=10000000 <scratch-dir> tests/fuzz/safetensors
# (docs/architecture/testing.md has the command and results for each.)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND TARGET strata_util)
  set(_model ${PROJECT_SOURCE_DIR}/src/model)
  file(GLOB _tokenizer_srcs ${_model}/tokenizer/tokenizer*.cc)
  list(FILTER _tokenizer_srcs EXCLUDE REGEX "_(test|bench)\\.cc$")
  file(GLOB _jinja_srcs ${_model}/jinja/*.cc)
  list(FILTER _jinja_srcs EXCLUDE REGEX "_test\\.cc$")

  set(_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  # The parser sources, instrumented once and shared by the targets that use them.
  function(strata_model_fuzz_objects name)
    add_library(${name} OBJECT ${ARGN})
    target_link_libraries(${name} PRIVATE strata_util)
    target_compile_options(${name} PRIVATE ${_fuzz_flags})
  endfunction()
  function(strata_model_fuzz name objects)
    add_executable(${name} ${_model}/fuzz/${name}.cc $<TARGET_OBJECTS:${objects}>)
    target_compile_definitions(${name} PRIVATE STRATA_LIBFUZZER)
    target_link_libraries(${name} PRIVATE strata_util)
    target_compile_options(${name} PRIVATE ${_fuzz_flags})
    target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
  endfunction()

  strata_model_fuzz_objects(model_fuzz_weights ${_model}/weights.cc
                            ${PROJECT_SOURCE_DIR}/src/backend/dtype.cc)
  strata_model_fuzz(safetensors_fuzz model_fuzz_weights)
  strata_model_fuzz(safetensors_index_fuzz model_fuzz_weights)
  strata_model_fuzz_objects(model_fuzz_hf_config ${_model}/hf_config.cc)
  strata_model_fuzz(hf_config_fuzz model_fuzz_hf_config)
  strata_model_fuzz_objects(model_fuzz_tokenizer ${_tokenizer_srcs})
  target_link_libraries(model_fuzz_tokenizer PRIVATE PkgConfig::PCRE2 PkgConfig::UTF8PROC)
  strata_model_fuzz(tokenizer_fuzz model_fuzz_tokenizer)
  target_link_libraries(tokenizer_fuzz PRIVATE PkgConfig::PCRE2 PkgConfig::UTF8PROC)
  strata_model_fuzz_objects(model_fuzz_jinja ${_jinja_srcs})
  target_link_libraries(model_fuzz_jinja PRIVATE PkgConfig::UTF8PROC)
  strata_model_fuzz(jinja_fuzz model_fuzz_jinja)
  target_link_libraries(jinja_fuzz PRIVATE PkgConfig::UTF8PROC)
endif()
