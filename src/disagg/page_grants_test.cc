// PageGrants (page_grants.h): what each writer may write, by page.
#include "disagg/page_grants.h"

#include <gtest/gtest.h>

#include <vector>

#include "disagg/page_ops.h"
#include "disagg/page_ops_test_util.h"

namespace strata::disagg {
namespace {

KvLayout Layout() { return TwoGroups(16); }

TEST(PageGrantsTest, AWriteIsAllowedOnlyIntoPagesGrantedToItsWriter) {
  const KvLayout l = Layout();
  const int64_t n = 10;
  PageGrants g(l, n);
  const std::vector<int32_t> room = {3, 4, 8};
  g.Grant("bootstrap#1", room);
  EXPECT_EQ(g.granted("bootstrap#1"), 3);
  auto ops = PageWriteOps(l, {n, 0}, {n, 0}, std::vector<int32_t>{0, 1, 2}, room);
  ASSERT_TRUE(ops.ok());
  for (const WriteOp& op : *ops) {
    EXPECT_EQ(g.Check("bootstrap#1", op.dst_region, op.dst_offset, op.length), "");
    EXPECT_NE(g.Check("bootstrap#2", op.dst_region, op.dst_offset, op.length), "")
        << "another connection's write";
    EXPECT_EQ(g.Check("", op.dst_region, op.dst_offset, op.length), "")
        << "the shared descriptor: granted to anyone";
  }
  // Page 5 of group 1 (run 512 B, K only): not granted.
  const std::string no = g.Check("bootstrap#1", 1, 5 * 512, 512);
  EXPECT_EQ(no, "page 5 of group 1 is not granted to bootstrap#1 (no open room of it holds it)");
  // A range from page 4 into page 5: refused for the page it reaches.
  EXPECT_NE(g.Check("bootstrap#1", 0, 4 * 256, 257), "");
  EXPECT_NE(g.Check("bootstrap#1", 5, 0, 1).find("region 5"), std::string::npos);
}

TEST(PageGrantsTest, RevokedPagesAreRefusedAndGrantsCount) {
  PageGrants g(Layout(), 10);
  const std::vector<int32_t> a = {2, 3};
  g.Grant("k", a);
  g.Grant("k", std::vector<int32_t>{3});  // a second room holds page 3 too
  g.Revoke("k", a);
  EXPECT_NE(g.Check("k", 0, 2 * 256, 256), "") << "page 2: revoked";
  EXPECT_EQ(g.Check("k", 0, 3 * 256, 256), "") << "page 3: still granted once";
  EXPECT_EQ(g.Check("", 0, 3 * 256, 256), "");
  g.Revoke("k", std::vector<int32_t>{3});
  EXPECT_NE(g.Check("k", 0, 3 * 256, 256), "");
  EXPECT_NE(g.Check("", 0, 3 * 256, 256), "") << "no writer holds it any more";
  EXPECT_EQ(g.granted("k"), 0);
  g.Revoke("never", a);  // unknown: nothing happens
  g.Revoke("k", std::vector<int32_t>{7});
}

}  // namespace
}  // namespace strata::disagg
