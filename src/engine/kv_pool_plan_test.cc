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
  for (const char* fixture : {"llama_default", "qwen3"}) {
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

}  // namespace
}  // namespace strata
