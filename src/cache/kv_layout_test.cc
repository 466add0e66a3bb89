#include "cache/kv_layout.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

// Qwen2.5-0.5B's KV: 24 layers, 2 kv heads, head_dim 64, BF16.
KvLayout QwenSmall(int page_size) {
  KvLayout l;
  l.page_size = page_size;
  l.groups.push_back(PoolGroupSpec{"full_attention", 24, 2, 64, DType::kBF16});
  return l;
}

TEST(KvLayoutTest, BytesForOneGroup) {
  KvLayout l = QwenSmall(16);
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.groups[0].BytesPerTokenPerLayer(), 2u * 2 * 64 * 2);  // K+V x heads x dim x bf16
  EXPECT_EQ(l.BytesPerPagePerTensor(0), 16u * 2 * 64 * 2);
  EXPECT_EQ(l.BytesPerPage(0), 16u * 24 * 512);
  EXPECT_EQ(l.BytesPerPage(), l.BytesPerPage(0));
  EXPECT_EQ(l.BytesPerToken(), 24u * 512);
}

TEST(KvLayoutTest, BytesForSeveralGroupsAddUp) {
  KvLayout l;
  l.page_size = 4;
  l.groups.push_back(PoolGroupSpec{"full", 3, 8, 128, DType::kF16});
  PoolGroupSpec latent{"mla_latent", 2, 1, 576, DType::kF32};
  latent.has_v = false;
  l.groups.push_back(latent);
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.groups[1].BytesPerTokenPerLayer(), 576u * 4);
  EXPECT_EQ(l.BytesPerPage(0), 4u * 3 * 2 * 8 * 128 * 2);
  EXPECT_EQ(l.BytesPerPage(1), 4u * 2 * 576 * 4);
  EXPECT_EQ(l.BytesPerPage(), l.BytesPerPage(0) + l.BytesPerPage(1));
  EXPECT_EQ(l.BytesPerToken() * 4, l.BytesPerPage());
  EXPECT_NE(l.Describe().find("mla_latent: 2 layers x K x 1 kv heads x 576 x F32"), std::string::npos)
      << l.Describe();
}

// A group of one entry per r tokens holds ceil(page_size / r) entries per
// page: a quarter of a token group's bytes at r = 4, one entry per page when
// r exceeds the page.
TEST(KvLayoutTest, GroupsOfEntriesPerWindowHoldCeilPageOverRateEntries) {
  KvLayout l;
  l.page_size = 16;
  PoolGroupSpec tokens{"window_kv", 2, 1, 32, DType::kF32};
  tokens.has_v = false;
  PoolGroupSpec every4 = tokens, every128 = tokens;
  every4.name = "every4";
  every4.tokens_per_entry = 4;
  every128.name = "every128";
  every128.tokens_per_entry = 128;
  l.groups = {tokens, every4, every128};
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.groups[1].EntriesPerPage(16), 4);
  EXPECT_EQ(l.groups[2].EntriesPerPage(16), 1);
  EXPECT_EQ(l.groups[1].EntriesPerPage(1), 1);
  EXPECT_EQ(l.groups[1].EntriesPerPage(6), 2);
  EXPECT_EQ(l.BytesPerPagePerTensor(0), 16u * 32 * 4);
  EXPECT_EQ(l.BytesPerPagePerTensor(1), 4u * 32 * 4);
  EXPECT_EQ(l.BytesPerPagePerTensor(2), 1u * 32 * 4);
  EXPECT_EQ(l.BytesPerPage(1), 2u * 4 * 32 * 4);
  EXPECT_EQ(l.BytesPerPage(), l.BytesPerPage(0) + l.BytesPerPage(1) + l.BytesPerPage(2));
  EXPECT_EQ(l.BytesPerToken(), l.BytesPerPage() / 16);
  EXPECT_NE(l.Describe().find("every4: 2 layers x K x 1 kv heads x 32 x F32 per 4 tokens"),
            std::string::npos)
      << l.Describe();
  l.groups[1].tokens_per_entry = 0;
  EXPECT_NE(l.Validate().message().find("tokens_per_entry is 0"), std::string::npos);
}

TEST(KvLayoutTest, ValidateListsEveryProblem) {
  KvLayout l;
  l.page_size = 0;
  l.groups.push_back(PoolGroupSpec{"a", 0, 2, 64, DType::kI32});
  l.groups.push_back(PoolGroupSpec{"a", 1, 0, 0, DType::kBF16});
  Status s = l.Validate();
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const char* want : {"page_size is 0", "num_layers is 0", "dtype I32", "duplicate group name",
                           "num_kv_heads is 0", "head_dim is 0"}) {
    EXPECT_NE(s.message().find(want), std::string::npos) << want << " missing in: " << s.message();
  }
  KvLayout empty;
  EXPECT_NE(empty.Validate().message().find("no pool group"), std::string::npos);
}

TEST(KvLayoutTest, PagesForBytesRoundsDown) {
  KvLayout l = QwenSmall(16);
  const uint64_t page = l.BytesPerPage();
  auto n = NumKvPagesForBytes(l, page * 100 + page - 1);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 100);
  n = NumKvPagesForBytes(l, page);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
}

TEST(KvLayoutTest, PagesForBytesSmallerThanOnePageSaysSo) {
  KvLayout l = QwenSmall(16);
  auto n = NumKvPagesForBytes(l, l.BytesPerPage() - 1);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(n.status().message().find("smaller than one page"), std::string::npos) << n.status().message();
  EXPECT_NE(n.status().message().find("--page-size"), std::string::npos);
}

TEST(KvLayoutTest, PagesForBytesTooManyPages) {
  KvLayout l;
  l.page_size = 1;
  l.groups.push_back(PoolGroupSpec{"g", 1, 1, 1, DType::kF16});  // 4 bytes a page
  auto n = NumKvPagesForBytes(l, uint64_t{1} << 40);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("more than the supported"), std::string::npos);
}

TEST(KvLayoutTest, PagesForTokens) {
  KvLayout l16 = QwenSmall(16);
  auto n = NumKvPagesForTokens(l16, 1000);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 62);  // 992 tokens: rounds down, never above the cap
  KvLayout l1 = QwenSmall(1);
  n = NumKvPagesForTokens(l1, 1000);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1000);
}

TEST(KvLayoutTest, PagesForTokensErrors) {
  KvLayout l = QwenSmall(16);
  auto n = NumKvPagesForTokens(l, 15);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("smaller than one page of 16 tokens"), std::string::npos)
      << n.status().message();
  EXPECT_FALSE(NumKvPagesForTokens(l, 0).ok());
  EXPECT_FALSE(NumKvPagesForTokens(l, -5).ok());
  n = NumKvPagesForTokens(l, int64_t{1} << 50);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("more than the supported"), std::string::npos);
  KvLayout bad = QwenSmall(0);
  EXPECT_EQ(NumKvPagesForTokens(bad, 100).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
