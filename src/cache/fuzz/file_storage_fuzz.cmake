# libFuzzer binary for the storage tier's file reader (clang only; under any
# compiler file_storage_fuzz_replay_test runs the same entry point over the
# seed corpus). The cache sources it needs are compiled again with coverage
# instrumentation and ASan/UBSan; it links only strata_util below them:
#   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   ninja -C build-fuzz file_storage_fuzz
#   build-fuzz/file_storage_fuzz -runs=10000000 <scratch-dir> tests/fuzz/file_storage
# (docs/architecture/testing.md, Fuzzing, has the recorded runs.)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND TARGET strata_util)
  set(_cache ${PROJECT_SOURCE_DIR}/src/cache)
  add_executable(file_storage_fuzz
    ${_cache}/fuzz/file_storage_fuzz.cc
    ${_cache}/storage_format.cc
    ${_cache}/kv_layout.cc
    ${_cache}/radix_tree.cc
    ${_cache}/page_allocator.cc
    ${PROJECT_SOURCE_DIR}/src/backend/dtype.cc)
  target_link_libraries(file_storage_fuzz PRIVATE strata_util)
  target_compile_definitions(file_storage_fuzz PRIVATE STRATA_LIBFUZZER)
  target_compile_options(file_storage_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(file_storage_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(file_storage_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
endif()
