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

TEST(FlagSetTest, StringListAppendsEveryOccurrence) {
  std::vector<std::string> workers;
  FlagSet f("router", "test");
  f.StringList("worker", &workers, "a worker URL");
  ASSERT_TRUE(f.Parse({"--worker", "http://a:1", "--worker=http://b:2"}).ok());
  EXPECT_EQ(workers, (std::vector<std::string>{"http://a:1", "http://b:2"}));
  EXPECT_THAT(f.Help(), HasSubstr("(repeatable)"));
}

TEST(FlagSetTest, EmptyStringsAreAllowedUnlessRejected) {
  std::string v = "x";
  FlagSet f("cmd", "test");
  f.String("v", &v, "value");
  EXPECT_TRUE(f.Parse({"--v", ""}).ok());
  EXPECT_EQ(v, "");
}

TEST(FlagSetTest, IsSetTellsAnExplicitDefaultFromAnAbsentFlag) {
  double ratio = 2.0, size = 0;
  bool enable = false;
  FlagSet f("serve", "test");
  f.Double("hicache-ratio", &ratio, "ratio");
  f.Double("hicache-size", &size, "size");
  f.Bool("enable-hierarchical-cache", &enable, "on");
  ASSERT_TRUE(f.Parse({"--hicache-ratio", "2", "--enable_hierarchical_cache"}).ok());
  EXPECT_TRUE(f.IsSet("hicache-ratio"));              // given, though equal to the default
  EXPECT_TRUE(f.IsSet("enable-hierarchical-cache"));  // snake_case spelling counts
  EXPECT_FALSE(f.IsSet("hicache-size"));
  EXPECT_FALSE(f.IsSet("no-such-flag"));
  EXPECT_EQ(f.SetFlags(), (std::vector<std::string>{"hicache-ratio", "enable-hierarchical-cache"}));
  // A value that fails to parse does not count as set.
  FlagSet g("serve", "test");
  g.Double("hicache-size", &size, "size");
  EXPECT_FALSE(g.Parse({"--hicache-size", "lots"}).ok());
  EXPECT_FALSE(g.IsSet("hicache-size"));
}

}  // namespace
}  // namespace strata
