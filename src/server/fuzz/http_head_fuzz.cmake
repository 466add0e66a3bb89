# libFuzzer binary for the HTTP request reader and the API-key check (clang
# only; under any compiler http_head_fuzz_test runs the same entry point over
# the seed corpus). Only those two sources are instrumented.
# Run: build-fuzz/http_head_fuzz -max_len=512 -runs=10000000 <scratch-dir> tests/fuzz/http
# (the recorded runs and their counts: docs/architecture/testing.md, Fuzzing).
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND TARGET strata_server)
  set(_fuzz_dir ${PROJECT_SOURCE_DIR}/src/server)
  add_executable(http_head_fuzz
    ${_fuzz_dir}/fuzz/http_head_fuzz.cc
    ${_fuzz_dir}/http_request_reader.cc
    ${_fuzz_dir}/http_auth.cc)
  target_include_directories(http_head_fuzz PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(http_head_fuzz PRIVATE Boost::headers)
  target_compile_definitions(http_head_fuzz PRIVATE STRATA_LIBFUZZER)
  target_compile_options(http_head_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(http_head_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(http_head_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
endif()
