// PlanKvPoolPages and EffectiveContextLength (what startup validation sizes
// the device pool with before the weights load) give the pool Engine::Create
// allocates, from the layout of config.json alone.
#include <gtest/gtest.h>

#include "engine/engine.h"

namespace strata {
namespace {

TEST(KvPoolPlanTest, ThePlanFromTheConfigIsThePoolTheEngineAllocates) {
  CpuBackendOptions bo;
  bo.num_threads = 1;
  auto backend = CreateCpuBackend(bo);
  ASSERT_TRUE(backend.ok());
  // deepseek_v4: windowed groups behind a window backing, the byte cap
  // counting them by the backing's pages.
  for (const char* fixture : {"llama_default", "qwen3", "deepseek_v4"}) {
    const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + fixture;
    auto model = LoadModelDir(dir, **backend, {});
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto config = ReadModelConfig(dir);
    ASSERT_TRUE(config.ok());
    struct Case {
      int32_t page_size;
      int64_t max_total_tokens, context_length;
      int32_t max_running;
      DType dtype;
    };
    for (const Case& c : {Case{16, 0, 0, 64, DType::kF32}, Case{16, 1000, 0, 64, DType::kF32},
                          Case{4, 0, 300, 3, DType::kBF16}, Case{32, 4096, 128, 8, DType::kF16},
                          Case{16, 0, 0, 4096, DType::kF32}}) {
      EngineOptions eo;
      eo.page_size = c.page_size;
      eo.max_total_tokens = c.max_total_tokens;
      eo.context_length = c.context_length;
      eo.max_running_requests = c.max_running;
      eo.kv_dtype = c.dtype;
      auto layout = KvLayoutForConfig(*config, eo.page_size, eo.kv_dtype);
      ASSERT_TRUE(layout.ok()) << layout.status().message();
      const int64_t context = EffectiveContextLength(eo, config->max_position_embeddings);
      auto pages = PlanKvPoolPages(*layout, eo, context);
      ASSERT_TRUE(pages.ok()) << pages.status().message();
      auto engine = Engine::Create(**model, **backend, eo);
      ASSERT_TRUE(engine.ok()) << engine.status().message();
      EXPECT_EQ((*engine)->pool().num_pages(), *pages) << fixture << " page_size " << c.page_size;
      EXPECT_EQ((*engine)->context_length(), context) << fixture;
    }
  }
}

TEST(KvPoolPlanTest, SizingRules) {
  KvLayout l;
  l.page_size = 16;
  l.groups = {{"full_attention", 2, 2, 16, DType::kF32}};  // 512 bytes per token
  EngineOptions eo;
  eo.page_size = 16;
  eo.max_total_tokens = 1000;  // rounded down to whole pages
  EXPECT_EQ(*PlanKvPoolPages(l, eo, 2048), 62);
  eo.max_total_tokens = 0;
  eo.max_running_requests = 2;  // 2 x 2048 tokens + one page
  EXPECT_EQ(*PlanKvPoolPages(l, eo, 2048), 257);
  eo.max_running_requests = 4096;  // capped at 1 GiB of KV: 2^30 / (16 x 512)
  EXPECT_EQ(*PlanKvPoolPages(l, eo, 2048), 131072);
  eo.max_total_tokens = 8;  // less than a page
  EXPECT_FALSE(PlanKvPoolPages(l, eo, 2048).ok());
  EXPECT_EQ(EffectiveContextLength(EngineOptions{}, 0), 4096);
  EXPECT_EQ(EffectiveContextLength(EngineOptions{}, 777), 777);
  eo.context_length = 99;
  EXPECT_EQ(EffectiveContextLength(eo, 777), 99);
}

// A windowed group (a sliding window) behind a window backing costs the
// backing's pages, not one page per id: under the 1 GiB cap the bytes it
// saves become page ids. Without the backing (PD, HiCache) it is per id.
TEST(KvPoolPlanTest, TheByteCapCountsWindowedGroupsByTheBackingsPages) {
  KvLayout l;
  l.page_size = 16;
  l.groups = {{"full_attention", 2, 2, 16, DType::kF32},      // 512 B/token: 8 KiB a page
              {"sliding", 2, 2, 16, DType::kF32, true, 64}};  // the same, windowed
  EngineOptions eo;
  eo.page_size = 16;
  eo.max_running_requests = 4096;  // far past the cap
  eo.chunked_prefill_size = 64;
  eo.window_backing = false;
  EXPECT_EQ(*PlanKvPoolPages(l, eo, 2048), (int64_t{1} << 30) / (2 * 8192));
  eo.window_backing = true;
  eo.window_pages = 1024;  // 8 MiB of windowed pages; the rest of the GiB for ids
  EXPECT_EQ(*PlanKvPoolPages(l, eo, 2048), ((int64_t{1} << 30) - 1024 * 8192) / 8192);
  // The default backing: 2 x 4096 requests x ((64 + 64) / 16 + 1) pages,
  // more than the pool would have: no saving, the per-id cap.
  eo.window_pages = 0;
  EXPECT_EQ(WindowPagesFor(eo, 64, int64_t{1} << 30), 2 * 4096 * 9);
  EXPECT_EQ(*PlanKvPoolPages(l, eo, 2048), (int64_t{1} << 30) / (2 * 8192));
  // 64 requests of a 1M-token context: a backing of 2 x 64 x 9 pages, the
  // rest of the GiB for ids.
  eo.max_running_requests = 64;
  EXPECT_EQ(*PlanKvPoolPages(l, eo, int64_t{1} << 20), ((int64_t{1} << 30) - 2 * 64 * 9 * int64_t{8192}) / 8192);
  eo.hicache.enabled = true;  // the host tier copies every group per id
  EXPECT_FALSE(UsesWindowBacking(l, eo));
  EXPECT_EQ(*PlanKvPoolPages(l, eo, int64_t{1} << 20), (int64_t{1} << 30) / (2 * 8192));
}

}  // namespace
}  // namespace strata
