# libFuzzer binary for the OpenAI protocol layer (clang only; under any
# compiler request_fuzz_test runs the same entry point over the seed corpus).
# The protocol sources are compiled again here with coverage instrumentation
# and sanitizers; everything below them (tokenizer, templates) is linked plain.
# Run: build/request_fuzz -max_total_time=60 <scratch-dir> tests/fuzz/openai
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND TARGET strata_server)
  set(_fuzz_dir ${PROJECT_SOURCE_DIR}/src/server)
  add_executable(request_fuzz
    ${_fuzz_dir}/fuzz/request_fuzz.cc
    ${_fuzz_dir}/api_error.cc
    ${_fuzz_dir}/json_body.cc
    ${_fuzz_dir}/openai_fields.cc
    ${_fuzz_dir}/openai_protocol.cc
    ${_fuzz_dir}/chat_messages.cc
    ${_fuzz_dir}/chat_prompt.cc
    ${_fuzz_dir}/openai_response.cc
    ${_fuzz_dir}/openai_responses.cc
    ${_fuzz_dir}/stop_matcher.cc)
  target_link_libraries(request_fuzz PRIVATE strata_engine)
  target_compile_options(request_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  target_link_options(request_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  set_target_properties(request_fuzz PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
endif()
