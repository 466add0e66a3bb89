#include "util/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(FlagSetTest, RejectEmptyStringsNamesTheFlagAndItsDefault) {
  std::string host = "127.0.0.1", key;
  FlagSet f("serve", "test");
  f.String("host", &host, "address");
  f.String("api-key", &key, "key");
  f.RejectEmptyStrings();
  Status st = f.Parse({"--host", ""});
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("--host is empty"));
  EXPECT_THAT(st.message(), HasSubstr("'127.0.0.1'"));
  EXPECT_EQ(host, "127.0.0.1");  // untouched
  Status eq = f.Parse({"--api-key="});
  ASSERT_FALSE(eq.ok());
  EXPECT_THAT(eq.message(), HasSubstr("--api-key is empty"));
  EXPECT_TRUE(f.Parse({"--host", "0.0.0.0", "--api-key", "k"}).ok());
  EXPECT_EQ(host, "0.0.0.0");
}

TEST(FlagSetTest, EmptyStringsAreAllowedUnlessRejected) {
  std::string v = "x";
  FlagSet f("cmd", "test");
  f.String("v", &v, "value");
  EXPECT_TRUE(f.Parse({"--v", ""}).ok());
  EXPECT_EQ(v, "");
}

}  // namespace
}  // namespace strata
