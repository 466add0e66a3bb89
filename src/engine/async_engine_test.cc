// AsyncEngine: admission control sheds load at once with the limit named,
// admitted requests all complete, cancellation and drain work, and nothing
// leaks. Uses the tiny llama_default fixture on the CPU backend.
#include "engine/async_engine.h"

#include <gtest/gtest.h>

#include <fstream>
#include <future>
#include <random>

namespace strata {
namespace {

// Destroyed bottom-up: the engine (whose thread publishes into the
// registry) goes before the registry, the model and the backend.
struct Stack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<metrics::Registry> registry;
  std::unique_ptr<AsyncEngine> engine;
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
  // Long enough that none finishes during the burst (the tiny model makes
  // 30 tokens in a few ms: a preempted test thread saw 8 admitted).
  for (int i = 0; i < 40; ++i) {
    SubmitResult r = s.engine->Submit(Req(20, 400, i));
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
  // 4 queued + the one running, + any that finished while this thread was
  // descheduled mid-burst (a loaded machine: each freed a place in line).
  size_t finished_during_burst = 0;
  for (auto& h : admitted)
    if (h->finished()) ++finished_during_burst;
  EXPECT_LE(admitted.size(), 6u + finished_during_burst);
  for (auto& h : admitted) {
    ASSERT_TRUE(WaitFinished(*h));
    RequestOutput out = h->Take();
    EXPECT_EQ(out.finish_reason, FinishReason::kLength);
    EXPECT_EQ(out.completion_tokens, 400);
  }
  ASSERT_TRUE(s.engine->WaitIdle(std::chrono::seconds(10)));
  EXPECT_TRUE(s.engine->CheckIntegrityWhenIdle(std::chrono::seconds(5)).ok());
  EngineSnapshot snap = s.engine->snapshot();
  EXPECT_EQ(snap.pages_active, 0);
  EXPECT_EQ(snap.queued_requests, 0);
  const std::string text = s.registry->Render();
  EXPECT_NE(text.find("strata_kv_pages_used{model=\"test\",role=\"colocated\",state=\"active\"} 0"), std::string::npos) << text;
  EXPECT_NE(text.find("strata_generation_tokens_total"), std::string::npos);
  // The limits are series too (the dashboard's queue panels and the "queue
  // near limit" alert divide by them); an unset limit has none.
  EXPECT_NE(text.find("strata_max_queued_requests{model=\"test\",role=\"colocated\"} 4\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("strata_max_running_requests{model=\"test\",role=\"colocated\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("strata_max_queued_tokens"), std::string::npos) << text;
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
  const std::string text = s.registry->Render();
  EXPECT_NE(text.find("strata_max_queued_tokens{model=\"test\",role=\"colocated\"} 50\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("strata_max_queued_requests"), std::string::npos) << text;
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

// Item 6 of issue 6: a request that exceeds a limit on its own can never be
// admitted, so it is the client's error (InvalidArgument naming the limit),
// not a retryable Unavailable; a group is judged as a whole.
TEST(AsyncEngineTest, RequestThatCanNeverBeAdmittedIsInvalidNotUnavailable) {
  AdmissionOptions adm;
  adm.max_queued_requests = 4;
  adm.max_queued_tokens = 100;
  Stack s = Make(adm, /*max_running=*/2);
  // 7 choices > 2 running slots + 4 queued, on an idle engine.
  std::vector<EngineRequest> seven;
  for (int i = 0; i < 7; ++i) seven.push_back(Req(5, 5, i));
  SubmitResult r = s.engine->SubmitAll(std::move(seven));
  EXPECT_TRUE(r.handles.empty());
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
  EXPECT_EQ(r.limit, "max_queued_requests");
  EXPECT_NE(r.status.message().find("--max-queued-requests 4"), std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("--max-running-requests 2"), std::string::npos)
      << r.status.message();
  // One 200-token prompt under --max-queued-tokens 100.
  SubmitResult t = s.engine->Submit(Req(200, 5));
  EXPECT_FALSE(t.handle);
  EXPECT_EQ(t.status.code(), StatusCode::kInvalidArgument) << t.status.ToString();
  EXPECT_EQ(t.limit, "max_queued_tokens");
  EXPECT_NE(t.status.message().find("--max-queued-tokens 100"), std::string::npos)
      << t.status.message();
  EngineSnapshot snap = s.engine->snapshot();
  EXPECT_EQ(snap.queued_requests, 0);
  EXPECT_EQ(snap.queued_tokens, 0);
  // Exactly at the bound it is admitted, all at once.
  std::vector<EngineRequest> six;
  for (int i = 0; i < 6; ++i) six.push_back(Req(10, 5, i));
  SubmitResult ok = s.engine->SubmitAll(std::move(six));
  ASSERT_EQ(ok.handles.size(), 6u) << ok.status.ToString();
  for (auto& h : ok.handles) ASSERT_TRUE(WaitFinished(*h));
}

TEST(AsyncEngineTest, SubmitAllIsAllOrNothingAndWaitingCanHelpIsUnavailable) {
  AdmissionOptions adm;
  adm.max_queued_requests = 3;
  Stack s = Make(adm, /*max_running=*/1);
  SubmitResult first = s.engine->Submit(Req(10, 1500));
  ASSERT_TRUE(first.handle);
  ASSERT_TRUE([&] {
    for (int i = 0; i < 1000; ++i) {
      if (s.engine->snapshot().running == 1) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }());
  // The slot is taken; 3 fit in the queue, so a group of 4 must wait: 503.
  std::vector<EngineRequest> four;
  for (int i = 0; i < 4; ++i) four.push_back(Req(10, 5, i));
  SubmitResult r = s.engine->SubmitAll(std::move(four));
  EXPECT_TRUE(r.handles.empty());
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_EQ(r.limit, "max_queued_requests");
  EXPECT_GE(r.retry_after_seconds, 1);
  EXPECT_EQ(s.engine->snapshot().queued_requests, 0);  // none of the four was queued
  std::vector<EngineRequest> three;
  for (int i = 0; i < 3; ++i) three.push_back(Req(10, 5, i));
  SubmitResult ok = s.engine->SubmitAll(std::move(three));
  EXPECT_EQ(ok.handles.size(), 3u) << ok.status.ToString();
  first.handle->Cancel();
  for (auto& h : ok.handles) ASSERT_TRUE(WaitFinished(*h));
}

int ThreadCount() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "Threads:") {
      int n = 0;
      in >> n;
      return n;
    }
  }
  return -1;
}

// Item 3: integrity checks go through the engine loop, one at a time, with
// no thread per call; busy answers Unavailable, never blocks the caller.
TEST(AsyncEngineTest, IntegrityChecksAreOneAtATimeWithoutThreads) {
  Stack s = Make({});
  EXPECT_TRUE(s.engine->CheckIntegrityWhenIdle(std::chrono::seconds(5)).ok());
  // Busy until cancelled.
  std::vector<std::shared_ptr<RequestHandle>> busy;
  for (int i = 0; i < 4; ++i) {
    SubmitResult r = s.engine->Submit(Req(10, 2000, i));
    ASSERT_TRUE(r.handle);
    busy.push_back(r.handle);
  }
  const int threads_before = ThreadCount();
  auto first = std::make_shared<std::promise<Status>>();
  auto first_result = first->get_future();
  s.engine->CheckIntegrity(std::chrono::minutes(10), [first](Status st) { first->set_value(st); });
  std::atomic<int> refused{0};
  for (int i = 0; i < 300; ++i) {
    s.engine->CheckIntegrity(std::chrono::minutes(10), [&](Status st) {
      if (st.code() == StatusCode::kUnavailable) refused++;
    });
  }
  EXPECT_EQ(refused.load(), 300);  // answered at once: one check is pending
  EXPECT_LE(ThreadCount(), threads_before);
  // Idle again: the pending check runs.
  for (auto& h : busy) h->Cancel();
  ASSERT_EQ(first_result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(first_result.get().ok());

  // A check whose timeout passes while the engine stays busy: Unavailable.
  busy.clear();
  for (int i = 0; i < 4; ++i) busy.push_back(s.engine->Submit(Req(10, 2000, i)).handle);
  auto late = std::make_shared<std::promise<Status>>();
  auto late_result = late->get_future();
  s.engine->CheckIntegrity(std::chrono::milliseconds(10), [late](Status st) { late->set_value(st); });
  ASSERT_EQ(late_result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  Status st = late_result.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("idle"), std::string::npos) << st.message();
  for (auto& h : busy) h->Cancel();
  ASSERT_TRUE(s.engine->WaitIdle(std::chrono::seconds(10)));
  EXPECT_TRUE(s.engine->CheckIntegrityWhenIdle(std::chrono::seconds(5)).ok());
}

// Item 4: destroying the engine answers a pending check ("shutting down")
// instead of leaving a waiter on a destroyed condition variable.
TEST(AsyncEngineTest, StopAnswersPendingIntegrityCheck) {
  Stack s = Make({});
  SubmitResult busy = s.engine->Submit(Req(10, 1500));
  ASSERT_TRUE(busy.handle);
  auto result = std::make_shared<std::promise<Status>>();
  auto f = result->get_future();
  s.engine->CheckIntegrity(std::chrono::minutes(10),
                           [result](Status st) { result->set_value(st); });
  const auto t0 = std::chrono::steady_clock::now();
  s.engine.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  Status st = f.get();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("shutting down"), std::string::npos) << st.message();
  EXPECT_EQ(busy.handle->Take().finish_reason, FinishReason::kAbort);
}

TEST(AsyncEngineTest, FactsAreFixedAtStart) {
  Stack s = Make({}, /*max_running=*/3);
  const EngineFacts& f = s.engine->facts();
  EXPECT_EQ(f.max_running_requests, 3);
  EXPECT_EQ(f.page_size, 4);
  EXPECT_EQ(f.pages_total, s.engine->snapshot().pages_total);
  EXPECT_EQ(f.context_length, s.model->config.max_position_embeddings);
}

}  // namespace
}  // namespace strata
