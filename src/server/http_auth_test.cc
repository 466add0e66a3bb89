// CheckBearer and ConstantTimeEquals (http_auth.h).
#include "server/http_auth.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(HttpAuth, BearerSchemeIsCaseInsensitive) {
  for (const char* v : {"Bearer sk-1", "bearer sk-1", "BEARER sk-1", "bEaReR sk-1", "Bearer   sk-1",
                        "  Bearer sk-1  ", "Bearer\tsk-1"}) {
    EXPECT_EQ(CheckBearer(v, "sk-1"), BearerCheck::kOk) << v;
  }
}

TEST(HttpAuth, MissingWrongOrMalformed) {
  EXPECT_EQ(CheckBearer("", "sk-1"), BearerCheck::kMissing);
  EXPECT_EQ(CheckBearer("   ", "sk-1"), BearerCheck::kMissing);
  for (const char* v :
       {"Bearer sk-2", "Bearer sk-", "Bearer sk-11", "Bearer", "Bearer ", "Bearersk-1",
        "Basic sk-1", "sk-1", "Bearer sk-1 x", "Token sk-1", "Bearer SK-1"}) {
    EXPECT_EQ(CheckBearer(v, "sk-1"), BearerCheck::kInvalid) << v;
  }
}

TEST(HttpAuth, ConstantTimeEqualsAgreesWithEquality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(
      ConstantTimeEquals("abcabc", "abc"));  // a repetition of the secret is not the secret
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("a\0c", 3), std::string_view("a\0d", 3)));
}

}  // namespace
}  // namespace strata
