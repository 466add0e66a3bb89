# libFuzzer binary for the bootstrap message decoder (clang only; under any
# compiler bootstrap_fuzz_replay_test runs the same entry point over the seed
# corpus). The codec sources are compiled again with coverage
# instrumentation and ASan/UBSan; it links only strata_util below them:
#   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   ninja -C build-fuzz bootstrap_fuzz
#   build-fuzz/bootstrap_fuzz -max_len=4096 -runs=10000000 <scratch-dir> tests/fuzz/bootstrap
# (docs/architecture/testing.md, Fuzzing, has the recorded runs.)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND TARGET strata_util)
  add_executable(bootstrap_fuzz
    ${PROJECT_SOURCE_DIR}/src/disagg/fuzz/bootstrap_fuzz.cc
    ${PROJECT_SOURCE_DIR}/src/disagg/bootstrap_messages.cc
    ${PROJECT_SOURCE_DIR}/src/cache/kv_layout.cc
    ${PROJECT_SOURCE_DIR}/src/backend/dtype.cc)
  target_link_libraries(bootstrap_fuzz PRIVATE strata_util)
  target_compile_definitions(bootstrap_fuzz PRIVATE STRATA_LIBFUZZER)
  target_compile_options(bootstrap_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(bootstrap_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(bootstrap_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
endif()
