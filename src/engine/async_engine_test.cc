// AsyncEngine: admission control sheds load at once with the limit named,
// admitted requests all complete, cancellation and drain work, and nothing
// leaks. Uses the tiny llama_default fixture on the CPU backend.
#include "engine/async_engine.h"

#include <gtest/gtest.h>

#include <random>

namespace strata {
namespace {

struct Stack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<metrics::Registry> registry;
};

Stack Make(AdmissionOptions admission, int32_t max_running = 2) {
  Stack s;
  CpuBackendOptions bo;
  bo.num_threads = 1;
  s.backend = std::move(*CreateCpuBackend(bo));
  LoadOptions lo;
  lo.model.max_batch_tokens = 128 + max_running;
  s.model = std::move(*LoadModelDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default",
                                    *s.backend, lo));
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 4096;
  eo.max_running_requests = max_running;
  eo.chunked_prefill_size = 128;
  auto e = Engine::Create(*s.model, *s.backend, eo);
  EXPECT_TRUE(e.ok());
  s.registry = std::move(*metrics::Registry::Create({{"model", "test"}, {"role", "colocated"}}));
  auto a = AsyncEngine::Start(std::move(*e), admission, s.registry.get());
  EXPECT_TRUE(a.ok());
  s.engine = std::move(*a);
  return s;
}

EngineRequest Req(int prompt_len, int max_tokens, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  EngineRequest r;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(4 + rng() % 470);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  return r;
}

bool WaitFinished(RequestHandle& h) {
  for (int i = 0; i < 2000 && !h.finished(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return h.finished();
}

TEST(AsyncEngineTest, BurstAboveQueueLimitIsShedAndAdmittedOnesComplete) {
  AdmissionOptions adm;
  adm.max_queued_requests = 4;
  Stack s = Make(adm, /*max_running=*/1);
  std::vector<std::shared_ptr<RequestHandle>> admitted;
  int rejected = 0;
  for (int i = 0; i < 40; ++i) {
    SubmitResult r = s.engine->Submit(Req(20, 30, i));
    if (r.handle) {
      admitted.push_back(r.handle);
    } else {
      ++rejected;
      EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
      EXPECT_EQ(r.limit, "max_queued_requests");
      EXPECT_GE(r.retry_after_seconds, 1);
      EXPECT_NE(r.status.message().find("--max-queued-requests 4"), std::string::npos);
    }
  }
  EXPECT_GT(rejected, 20);
  EXPECT_LE(admitted.size(), 6u);  // 4 queued + what the engine had already started
  for (auto& h : admitted) {
    ASSERT_TRUE(WaitFinished(*h));
    RequestOutput out = h->Take();
    EXPECT_EQ(out.finish_reason, FinishReason::kLength);
    EXPECT_EQ(out.completion_tokens, 30);
  }
  ASSERT_TRUE(s.engine->WaitIdle(std::chrono::seconds(10)));
  EXPECT_TRUE(s.engine->CheckIntegrityWhenIdle(std::chrono::seconds(5)).ok());
  EngineSnapshot snap = s.engine->snapshot();
  EXPECT_EQ(snap.pages_active, 0);
  EXPECT_EQ(snap.queued_requests, 0);
  const std::string text = s.registry->Render();
  EXPECT_NE(text.find("strata_kv_pages_used{model=\"test\",role=\"colocated\",state=\"active\"} 0"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_generation_tokens_total"), std::string::npos);
}

TEST(AsyncEngineTest, QueuedTokenLimitNamesItself) {
  AdmissionOptions adm;
  adm.max_queued_tokens = 50;
  Stack s = Make(adm, 1);
  int token_rejections = 0;
  std::vector<std::shared_ptr<RequestHandle>> admitted;
  for (int i = 0; i < 20; ++i) {
    SubmitResult r = s.engine->Submit(Req(30, 20, i));
    if (r.handle) admitted.push_back(r.handle);
    else if (r.limit == "max_queued_tokens") ++token_rejections;
  }
  EXPECT_GT(token_rejections, 0);
  for (auto& h : admitted) ASSERT_TRUE(WaitFinished(*h));
}

TEST(AsyncEngineTest, InvalidRequestIsRejectedWithoutQueueing) {
  Stack s = Make({});
  EngineRequest r = Req(10, 5);
  r.prompt.push_back(100000);
  SubmitResult res = s.engine->Submit(std::move(r));
  EXPECT_FALSE(res.handle);
  EXPECT_EQ(res.status.code(), StatusCode::kInvalidArgument);
}

TEST(AsyncEngineTest, NotifierRunsAndCancelFreesPages) {
  Stack s = Make({});
  std::atomic<int> notified{0};
  EngineRequest r = Req(40, 100000 % 1500);
  r.params.max_tokens = 1500;
  r.notify = [&] { notified++; };
  SubmitResult res = s.engine->Submit(std::move(r));
  ASSERT_TRUE(res.handle);
  for (int i = 0; i < 1000 && notified.load() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GE(notified.load(), 5);
  res.handle->Cancel();
  ASSERT_TRUE(WaitFinished(*res.handle));
  EXPECT_EQ(res.handle->Take().finish_reason, FinishReason::kAbort);
  ASSERT_TRUE(s.engine->WaitIdle(std::chrono::seconds(5)));
  EXPECT_EQ(s.engine->snapshot().pages_active, 0);
}

TEST(AsyncEngineTest, DrainRefusesNewWorkAndFinishesOld) {
  Stack s = Make({});
  SubmitResult a = s.engine->Submit(Req(10, 40));
  ASSERT_TRUE(a.handle);
  s.engine->Drain();
  SubmitResult b = s.engine->Submit(Req(10, 5));
  EXPECT_FALSE(b.handle);
  EXPECT_EQ(b.limit, "draining");
  ASSERT_TRUE(WaitFinished(*a.handle));
  EXPECT_EQ(a.handle->Take().finish_reason, FinishReason::kLength);
}

TEST(AsyncEngineTest, StopAbortsInFlightRequests) {
  Stack s = Make({});
  EngineRequest r = Req(10, 1500);
  SubmitResult a = s.engine->Submit(std::move(r));
  ASSERT_TRUE(a.handle);
  s.engine->Stop();
  EXPECT_TRUE(a.handle->finished());
  EXPECT_EQ(a.handle->Take().finish_reason, FinishReason::kAbort);
}

}  // namespace
}  // namespace strata
