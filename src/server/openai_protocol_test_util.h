// Test helpers for the OpenAI request parsers: parse-or-fail wrappers,
// minimal valid bodies with extra fields, and the 400 checks (status, exact
// param, message substring). Shared by openai_protocol_test.cc and
// structured_output_test.cc.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "server/openai_protocol.h"

namespace strata::protocol_test {

using ::testing::HasSubstr;

inline CompletionRequest Completion(const std::string& body, const ProtocolLimits& limits = {}) {
  ApiOr<CompletionRequest> r = ParseCompletionRequest(body, limits);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().param + ": " + r.error().message)
                      << "\nbody: " << body;
  return r.ok() ? r.value() : CompletionRequest{};
}

inline ChatCompletionRequest Chat(const std::string& body, const ProtocolLimits& limits = {}) {
  ApiOr<ChatCompletionRequest> r = ParseChatCompletionRequest(body, limits);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().param + ": " + r.error().message)
                      << "\nbody: " << body;
  return r.ok() ? r.value() : ChatCompletionRequest{};
}

// Adds `extra` fields to a minimal valid body.
inline std::string CompletionBody(const std::string& extra) {
  return R"({"model": "m", "prompt": "Hi")" + (extra.empty() ? "" : ", " + extra) + "}";
}
inline std::string ChatBody(const std::string& extra) {
  return R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}])" +
         (extra.empty() ? "" : ", " + extra) + "}";
}

struct ErrorCase {
  std::string body;
  std::string param;
  std::string message;  // substring
};

inline void ExpectCompletionError(const ErrorCase& c, const ProtocolLimits& limits = {}) {
  ApiOr<CompletionRequest> r = ParseCompletionRequest(c.body, limits);
  ASSERT_FALSE(r.ok()) << c.body;
  EXPECT_EQ(r.error().http_status, 400) << c.body;
  EXPECT_EQ(r.error().type, "invalid_request_error");
  EXPECT_EQ(r.error().param, c.param) << c.body << "\n" << r.error().message;
  EXPECT_THAT(r.error().message, HasSubstr(c.message)) << c.body;
}

inline void ExpectChatError(const ErrorCase& c) {
  ApiOr<ChatCompletionRequest> r = ParseChatCompletionRequest(c.body);
  ASSERT_FALSE(r.ok()) << c.body;
  EXPECT_EQ(r.error().http_status, 400) << c.body;
  EXPECT_EQ(r.error().param, c.param) << c.body << "\n" << r.error().message;
  EXPECT_THAT(r.error().message, HasSubstr(c.message)) << c.body;
}

}  // namespace strata::protocol_test
