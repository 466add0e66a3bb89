// Engine scheduling behaviour on a real (tiny) model: prefix-cache reuse,
// preemption when KV pages run out, cancellation and deadlines, and that
// none of it changes greedy outputs or leaks pages.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "engine/engine_test_util.h"

namespace strata {
namespace {

using Stack = test::EngineStack;

Stack Make(EngineOptions eo, const std::string& fixture = "llama_default") {
  return test::MakeEngineStack(eo, fixture);
}

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(4, 479);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = d(rng);
  return p;
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  return r;
}

std::vector<std::vector<int32_t>> Outputs(Engine& e, const std::vector<GenerationRequest>& reqs) {
  auto res = e.Generate(reqs);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  std::vector<std::vector<int32_t>> out;
  if (res.ok())
    for (auto& r : *res) out.push_back(r.output);
  return out;
}

TEST(EngineTest, PrefixCacheReusesPagesAndKeepsOutputs) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 4096;
  Stack s = Make(eo);
  std::mt19937 rng(1);
  std::vector<int32_t> system = RandomPrompt(rng, 40);
  std::vector<int32_t> a = system, b = system;
  for (int32_t t : RandomPrompt(rng, 7)) a.push_back(t);
  for (int32_t t : RandomPrompt(rng, 9)) b.push_back(t);

  EngineOptions no_cache = eo;
  no_cache.disable_radix_cache = true;
  Stack ref = Make(no_cache);
  auto want = Outputs(*ref.engine, {Greedy(a, 12), Greedy(b, 12)});

  auto first = s.engine->Generate({Greedy(a, 12)});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)[0].cached_tokens, 0);
  auto second = s.engine->Generate({Greedy(b, 12)});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0].cached_tokens, 40) << "the shared 40-token system prompt (10 pages)";
  EXPECT_EQ((*first)[0].output, want[0]);
  EXPECT_EQ((*second)[0].output, want[1]);
  // The same prompt again: all but the last page-aligned part is cached.
  auto third = s.engine->Generate({Greedy(a, 12)});
  ASSERT_TRUE(third.ok());
  EXPECT_EQ((*third)[0].cached_tokens, 44);
  EXPECT_EQ((*third)[0].output, want[0]);
  EXPECT_EQ(s.engine->load().pages_active, 0);
  EXPECT_GT(s.engine->load().pages_cached, 0);
  EXPECT_TRUE(s.engine->CheckIntegrity().ok()) << s.engine->CheckIntegrity().ToString();
}

// Pages for far less than 8 x ~90 tokens. Admitting on prompts alone
// (conservativeness 0), decode runs out of pages and preempts, and the
// outputs are still those of a roomy pool. Admission that keeps room for
// the answers of running requests: with every answer's whole budget kept
// (conservativeness 10: ratio 1 throughout) the same load is never
// preempted; the default keeps part of it (fewer preemptions than none).
TEST(EngineTest, AdmissionKeepsPagesForAnswersSoRunningRequestsAreNotPreempted) {
  std::mt19937 rng(2);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(Greedy(RandomPrompt(rng, 30 + 5 * i), 40));
  EngineOptions roomy;
  roomy.page_size = 4;
  roomy.max_total_tokens = 8192;
  Stack ref = Make(roomy);
  auto want = Outputs(*ref.engine, reqs);
  int64_t preemptions[3] = {0, 0, 0};
  const double conservativeness[3] = {0, 1, 10};
  for (int k = 0; k < 3; ++k) {
    EngineOptions tight = roomy;
    tight.max_total_tokens = 200;
    tight.chunked_prefill_size = 64;
    tight.schedule_conservativeness = conservativeness[k];
    Stack s = Make(tight);
    EXPECT_EQ(Outputs(*s.engine, reqs), want) << "conservativeness " << conservativeness[k];
    preemptions[k] = s.engine->stats().preemptions;
    EXPECT_EQ(s.engine->load().pages_active, 0);
    EXPECT_TRUE(s.engine->CheckIntegrity().ok()) << s.engine->CheckIntegrity().ToString();
  }
  EXPECT_GT(preemptions[0], 0);
  EXPECT_LT(preemptions[1], preemptions[0]);
  EXPECT_EQ(preemptions[2], 0);
}

TEST(EngineTest, CancelFreesPagesAtTheNextStep) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 2048;
  Stack s = Make(eo);
  std::mt19937 rng(3);
  EngineRequest r;
  r.id = "c";
  r.prompt = RandomPrompt(rng, 50);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = 1000;
  auto h = std::make_shared<RequestHandle>();
  ASSERT_TRUE(s.engine->Validate(r).ok());
  s.engine->Add(std::move(r), h);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.engine->Step().ok());
  EXPECT_GT(s.engine->load().pages_active, 0);
  h->Cancel();
  ASSERT_TRUE(s.engine->Step().ok());
  EXPECT_FALSE(s.engine->HasWork());
  EXPECT_EQ(s.engine->load().pages_active, 0);
  RequestOutput out = h->Take();
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(out.completion_tokens, 3);  // prefill (first token) + two decode steps
  EXPECT_TRUE(s.engine->CheckIntegrity().ok());
}

TEST(EngineTest, QueueDeadlineFailsWaitingRequestsWithUnavailable) {
  EngineOptions eo;
  eo.max_running_requests = 1;
  Stack s = Make(eo);
  std::mt19937 rng(4);
  auto busy = std::make_shared<RequestHandle>();
  EngineRequest a;
  a.prompt = RandomPrompt(rng, 10);
  a.params.max_tokens = 50;
  a.params.ignore_eos = true;
  s.engine->Add(a, busy);
  auto late = std::make_shared<RequestHandle>();
  EngineRequest b;
  b.prompt = RandomPrompt(rng, 10);
  b.queue_deadline = std::chrono::steady_clock::now();  // already past when scheduled
  s.engine->Add(b, late);
  ASSERT_TRUE(s.engine->Step().ok());
  RequestOutput out = late->Take();
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.error.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(out.started);
  while (s.engine->HasWork()) ASSERT_TRUE(s.engine->Step().ok());
  EXPECT_EQ(busy->Take().finish_reason, FinishReason::kLength);
}

TEST(EngineTest, ValidateRejectsWhatCanNeverRun) {
  EngineOptions eo;
  eo.max_total_tokens = 64;
  eo.page_size = 4;
  Stack s = Make(eo);
  EngineRequest r;
  EXPECT_EQ(s.engine->Validate(r).code(), StatusCode::kInvalidArgument);  // empty prompt
  r.prompt = {1, 2, 600};
  EXPECT_NE(s.engine->Validate(r).message().find("600"), std::string::npos);
  r.prompt.assign(100, 5);
  EXPECT_NE(s.engine->Validate(r).message().find("KV cache"), std::string::npos);
  r.prompt.assign(10, 5);
  r.params.top_p = 0;
  EXPECT_FALSE(s.engine->Validate(r).ok());
}

// Random arrivals, lengths, cancellations and a small pool: every request
// finishes, nothing leaks, invariants hold after every step.
TEST(EngineTest, RandomWorkloadKeepsInvariants) {
  EngineOptions eo;
  eo.page_size = 2;
  eo.max_total_tokens = 300;
  eo.max_running_requests = 6;
  eo.chunked_prefill_size = 48;
  Stack s = Make(eo);
  std::mt19937 rng(5);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  std::vector<int32_t> shared = RandomPrompt(rng, 24);
  for (int step = 0; step < 400; ++step) {
    if (step < 200 && rng() % 3 == 0) {
      EngineRequest r;
      r.prompt = rng() % 2 ? shared : std::vector<int32_t>{};
      for (int32_t t : RandomPrompt(rng, 1 + rng() % 40)) r.prompt.push_back(t);
      r.params.temperature = rng() % 2 ? 0.f : 0.8f;
      r.params.max_tokens = 1 + rng() % 30;
      r.params.ignore_eos = true;
      auto h = std::make_shared<RequestHandle>();
      ASSERT_TRUE(s.engine->Validate(r).ok());
      s.engine->Add(std::move(r), h);
      handles.push_back(h);
    }
    if (!handles.empty() && rng() % 17 == 0) handles[rng() % handles.size()]->Cancel();
    ASSERT_TRUE(s.engine->Step().ok());
    ASSERT_TRUE(s.engine->CheckIntegrity().ok())
        << "step " << step << ": " << s.engine->CheckIntegrity().ToString();
  }
  while (s.engine->HasWork()) ASSERT_TRUE(s.engine->Step().ok());
  for (auto& h : handles) EXPECT_TRUE(h->finished());
  EXPECT_EQ(s.engine->load().pages_active, 0);
  EXPECT_TRUE(s.engine->CheckIntegrity().ok());
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Requests that arrive together with one long shared prefix (a system
// prompt, or the n choices of one request) compute it once: the first one
// inserts its prompt pages chunk by chunk and the others wait for them
// instead of recomputing. Outputs are those of requests run alone.
TEST(EngineTest, ConcurrentRequestsWithASharedPrefixComputeItOnce) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 4096;
  eo.chunked_prefill_size = 64;
  std::mt19937 rng(7);
  const std::vector<int32_t> system = RandomPrompt(rng, 160);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = system;
    for (int32_t t : RandomPrompt(rng, 5 + i)) p.push_back(t);
    reqs.push_back(Greedy(p, 6));
  }
  EngineOptions no_cache = eo;
  no_cache.disable_radix_cache = true;
  Stack ref = Make(no_cache);
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(Outputs(*ref.engine, {r})[0]);

  Stack s = Make(eo);
  auto res = s.engine->Generate(reqs);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  int64_t prompt_total = 0, cached_total = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*res)[i].output, want[i]) << "request " << i;
    prompt_total += static_cast<int64_t>(reqs[i].prompt.size());
    cached_total += (*res)[i].cached_tokens;
  }
  EXPECT_EQ((*res)[0].cached_tokens, 0);
  for (size_t i = 1; i < reqs.size(); ++i)
    EXPECT_EQ((*res)[i].cached_tokens, 160) << "request " << i;
  // The shared 160 tokens were computed once, not four times.
  EXPECT_EQ(s.engine->stats().prefill_tokens, prompt_total - cached_total);
  EXPECT_GT(s.engine->stats().deferred_admissions, 0);
  EXPECT_TRUE(s.engine->CheckIntegrity().ok());
  // Without the deferral each request computes the shared part itself.
  EXPECT_EQ(ref.engine->stats().prefill_tokens, prompt_total);
}

// A prompt's pages enter the prefix cache as each chunk of its prefill
// completes, locked by the request computing it.
TEST(EngineTest, PromptPagesAreCachedChunkByChunk) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 4096;
  eo.chunked_prefill_size = 32;
  Stack s = Make(eo);
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 100);
  EngineRequest r;
  r.id = "r";
  r.prompt = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = 4;
  auto handle = std::make_shared<RequestHandle>();
  ASSERT_TRUE(s.engine->Validate(r).ok());
  s.engine->Add(std::move(r), handle);
  const RadixTree& tree = *s.engine->prefix_cache();
  std::vector<int64_t> cached;
  while (!handle->finished()) {
    ASSERT_TRUE(s.engine->Step().ok());
    cached.push_back(tree.PeekPrefixLength(prompt));
    ASSERT_TRUE(s.engine->CheckIntegrity().ok());
    // Pages the request holds through its locked node are active, not cached.
    if (!handle->finished()) {
      EXPECT_EQ(s.engine->load().pages_cached, 0);
    }
  }
  ASSERT_GE(cached.size(), 4u);
  EXPECT_EQ(cached[0], 32);
  EXPECT_EQ(cached[1], 64);
  EXPECT_EQ(cached[2], 96);
  EXPECT_EQ(cached[3], 100);  // the fourth chunk completes the last page
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// prompt_logprobs: the prompt P + O, where O is P's greedy continuation,
// must score O's tokens exactly as generating O did (teacher forcing), in
// any chunking, with the prefix cache warm, batched, and under preemption.
struct TeacherForced {
  std::vector<int32_t> prompt;    // P + O
  size_t p_len = 0;               // |P|
  std::vector<StepOutput> steps;  // generating O from P, logprobs 3
};

TeacherForced MakeTeacherForced(Engine& e, std::vector<int32_t> p, int n) {
  GenerationRequest g = Greedy(p, n);
  g.params.logprobs = 3;
  auto res = e.Generate({g});
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  TeacherForced tf;
  tf.p_len = p.size();
  tf.prompt = std::move(p);
  if (!res.ok()) return tf;
  for (int32_t t : (*res)[0].output) tf.prompt.push_back(t);
  tf.steps = (*res)[0].steps;
  return tf;
}

GenerationRequest WithPromptLogprobs(const std::vector<int32_t>& prompt) {
  GenerationRequest r = Greedy(prompt, 1);
  r.prompt_logprobs = 3;
  return r;
}

void ExpectTeacherForced(const TeacherForced& tf, const GenerationResult& r, const char* where) {
  SCOPED_TRACE(where);
  ASSERT_EQ(r.prompt_logprobs.size(), tf.prompt.size() - 1);
  for (size_t i = 0; i < r.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(r.prompt_logprobs[i].id, tf.prompt[i + 1]) << "entry " << i;
    EXPECT_LE(r.prompt_logprobs[i].logprob, 0.f);
    EXPECT_GE(r.prompt_logprobs[i].rank, 1);
    EXPECT_EQ(r.prompt_logprobs[i].top.size(), 3u);
  }
  for (size_t k = 0; k < tf.steps.size(); ++k) {
    const PromptLogprob& lp = r.prompt_logprobs[tf.p_len - 1 + k];
    const StepOutput& st = tf.steps[k];
    EXPECT_NEAR(lp.logprob, st.logprob, 1e-4) << "output token " << k;
    EXPECT_EQ(lp.rank, 1) << "a greedy token is the argmax";
    ASSERT_EQ(lp.top.size(), st.top_logprobs.size());
    for (size_t j = 0; j < lp.top.size(); ++j) {
      EXPECT_EQ(lp.top[j].token_id, st.top_logprobs[j].token_id) << k << "/" << j;
      EXPECT_NEAR(lp.top[j].logprob, st.top_logprobs[j].logprob, 1e-4) << k << "/" << j;
    }
  }
}

TEST(PromptLogprobsTest, EqualTheLogprobsOfATeacherForcedRun) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 4096;
  Stack s = Make(eo);
  std::mt19937 rng(11);
  const TeacherForced tf = MakeTeacherForced(*s.engine, RandomPrompt(rng, 21), 12);
  ASSERT_EQ(tf.prompt.size(), 33u);

  auto one = s.engine->Generate({WithPromptLogprobs(tf.prompt)});
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ExpectTeacherForced(tf, (*one)[0], "alone");

  // The prompt is now cached (it was computed whole and inserted); a prompt
  // logprobs request still computes it all: cached KV has no logits.
  auto plain = s.engine->Generate({Greedy(tf.prompt, 1)});
  ASSERT_TRUE(plain.ok());
  EXPECT_GT((*plain)[0].cached_tokens, 0) << "the prompt's pages were cached for others";
  auto warm = s.engine->Generate({WithPromptLogprobs(tf.prompt)});
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ((*warm)[0].cached_tokens, 0);
  ExpectTeacherForced(tf, (*warm)[0], "prefix cache warm");
  EXPECT_TRUE((*plain)[0].prompt_logprobs.empty());

  // Batched with other requests (one of them sharing the prompt).
  auto batch = s.engine->Generate(
      {Greedy(RandomPrompt(rng, 30), 8), WithPromptLogprobs(tf.prompt), Greedy(tf.prompt, 4)});
  ASSERT_TRUE(batch.ok());
  ExpectTeacherForced(tf, (*batch)[1], "batched");
  EXPECT_TRUE(s.engine->CheckIntegrity().ok()) << s.engine->CheckIntegrity().ToString();
  EXPECT_EQ(s.engine->load().pages_active, 0);

  // Chunked prefill: 5-token chunks, each with its rows of logits.
  EngineOptions chunked = eo;
  chunked.chunked_prefill_size = 5;
  Stack c = Make(chunked);
  auto ch = c.engine->Generate({WithPromptLogprobs(tf.prompt)});
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  ExpectTeacherForced(tf, (*ch)[0], "chunked");
}

TEST(PromptLogprobsTest, PreemptionSendsEachPromptTokenOnce) {
  std::mt19937 rng(12);
  EngineOptions roomy;
  roomy.page_size = 4;
  roomy.max_total_tokens = 8192;
  Stack ref = Make(roomy);
  std::vector<GenerationRequest> reqs;
  std::vector<TeacherForced> tfs;
  for (int i = 0; i < 6; ++i) {
    tfs.push_back(MakeTeacherForced(*ref.engine, RandomPrompt(rng, 20 + 3 * i), 6));
    GenerationRequest r = WithPromptLogprobs(tfs.back().prompt);
    r.params.max_tokens = 40;
    reqs.push_back(r);
  }
  EngineOptions tight = roomy;
  tight.max_total_tokens = 160;
  tight.chunked_prefill_size = 32;
  tight.schedule_conservativeness = 0;  // admit on prompts alone: decode runs out
  Stack s = Make(tight);
  auto got = s.engine->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_GT(s.engine->stats().preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) ExpectTeacherForced(tfs[i], (*got)[i], "preempted");
  EXPECT_TRUE(s.engine->CheckIntegrity().ok()) << s.engine->CheckIntegrity().ToString();
}

// The rows of logits per step are capped (EngineOptions::prompt_logit_floats
// / vocab, at least 16), so a prompt longer than the cap is computed in more
// chunks than chunked prefill alone would cut, with the same results.
TEST(PromptLogprobsTest, LogitRowsPerStepAreCapped) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 4096;
  eo.chunked_prefill_size = 512;
  eo.prompt_logit_floats = 1;  // the floor: 16 rows a step
  Stack s = Make(eo);
  std::mt19937 rng(13);
  const TeacherForced tf = MakeTeacherForced(*s.engine, RandomPrompt(rng, 36), 4);  // 40 tokens
  int64_t before = s.engine->stats().steps;
  auto got = s.engine->Generate({WithPromptLogprobs(tf.prompt)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(s.engine->stats().steps - before, 3) << "40 prompt tokens at 16 rows a step";
  ExpectTeacherForced(tf, (*got)[0], "capped");
  before = s.engine->stats().steps;
  ASSERT_TRUE(s.engine->Generate({Greedy(RandomPrompt(rng, 40), 1)}).ok());
  EXPECT_EQ(s.engine->stats().steps - before, 1) << "without prompt logprobs: one chunk";
}

TEST(PromptLogprobsTest, OutOfRangeIsInvalid) {
  EngineOptions eo;
  Stack s = Make(eo);
  EngineRequest r;
  r.prompt = {5, 6, 7};
  r.params.max_tokens = 1;
  r.prompt_logprobs = kMaxLogprobs + 1;
  EXPECT_EQ(s.engine->Validate(r).code(), StatusCode::kInvalidArgument);
  r.prompt_logprobs = 0;
  EXPECT_TRUE(s.engine->Validate(r).ok());
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Every op goes to `inner`; CopyBlocks (the HiCache controller's copies)
// first waits until the gate opens, so a backup stays in flight.
class GatedCopyBackend : public Backend {
 public:
  explicit GatedCopyBackend(Backend& inner) : b_(inner) {}
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::string Name() const override { return b_.Name(); }
  StatusOr<Buffer> Allocate(size_t n) override { return b_.Allocate(n); }
  void CopyToDevice(void* d, const void* s, size_t n) override { b_.CopyToDevice(d, s, n); }
  void CopyToHost(void* d, const void* s, size_t n) override { b_.CopyToHost(d, s, n); }
  void Synchronize() override { b_.Synchronize(); }
  Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind kind) override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return open_; });
    l.unlock();
    return b_.CopyBlocks(blocks, kind);
  }
  Status PinHostMemory(void* p, size_t n) override { return b_.PinHostMemory(p, n); }
  void UnpinHostMemory(void* p) override { b_.UnpinHostMemory(p); }
  StatusOr<Tensor> UploadWeight(const Tensor& h) override { return b_.UploadWeight(h); }
  void Embedding(const Tensor& t, const int32_t* ids, Tensor o) override {
    b_.Embedding(t, ids, o);
  }
  void RmsNorm(const Tensor& x, const Tensor& w, float e, Tensor o) override {
    b_.RmsNorm(x, w, e, o);
  }
  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor o) override {
    b_.Linear(x, w, bias, o);
  }
  void SiluMul(const Tensor& g, const Tensor& u, Tensor o) override { b_.SiluMul(g, u, o); }
  void Add(const Tensor& a, const Tensor& c, Tensor o) override { b_.Add(a, c, o); }
  void Rope(Tensor q, Tensor k, const int32_t* p, const RopeParams& r) override {
    b_.Rope(q, k, p, r);
  }
  void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& l, const int64_t* s) override {
    b_.StoreKv(k, v, l, s);
  }
  void PagedAttention(const Tensor& q, const KvLayerView& l, const AttentionSeq* s, int32_t n,
                      const AttentionParams& p, Tensor o) override {
    b_.PagedAttention(q, l, s, n, p, o);
  }
  void LinearGroup(const Tensor& x, std::span<const LinearPart> parts) override {
    b_.LinearGroup(x, parts);
  }
  void AddRmsNorm(Tensor x, const Tensor& d, const Tensor& w, float e, Tensor o) override {
    b_.AddRmsNorm(x, d, w, e, o);
  }
  void LinearSiluMul(const Tensor& x, const LinearPart& g, const LinearPart& u, Tensor o) override {
    b_.LinearSiluMul(x, g, u, o);
  }
  void GatherRows(const Tensor& x, const int32_t* r, Tensor o) override { b_.GatherRows(x, r, o); }
  void ScaleAddRows(const Tensor& x, const int32_t* r, const float* s, Tensor o) override {
    b_.ScaleAddRows(x, r, s, o);
  }

 private:
  Backend& b_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A request that needs pages a write_through backup in flight pins waits for
// the backup (then evicts them) instead of failing every request with
// "scheduler made no progress" (seen in the monitoring e2e under CI load).
TEST(EngineHiCacheTest, WaitsForPagesPinnedByABackupInFlight) {
  CpuBackendOptions bo;
  bo.num_threads = 1;
  auto cpu = std::move(*CreateCpuBackend(bo));
  LoadOptions lo;
  lo.model.max_batch_tokens = 260;
  auto m = LoadModelDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default",
                        *cpu, lo);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  GatedCopyBackend gated(*cpu);
  EngineOptions eo;
  eo.page_size = 16;
  eo.max_total_tokens = 160;  // 10 pages: one 7-page request at a time
  eo.chunked_prefill_size = 256;
  eo.max_running_requests = 4;
  eo.hicache.enabled = true;
  eo.hicache_host_pages = 40;
  auto e = Engine::Create(**m, gated, eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<GenerationRequest> reqs(2);
  for (int i = 0; i < 2; ++i) {
    for (int t = 0; t < 100; ++t) reqs[i].prompt.push_back(4 + (t * (i + 3) + i) % 400);
    reqs[i].params.temperature = 0;
    reqs[i].params.ignore_eos = true;
    reqs[i].params.max_tokens = 2;
  }
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    gated.Open();
  });
  auto res = (*e)->Generate(std::move(reqs));
  opener.join();
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->size(), 2u);
  for (const GenerationResult& r : *res) EXPECT_EQ(r.output.size(), 2u);
  EXPECT_TRUE((*e)->CheckIntegrity().ok()) << (*e)->CheckIntegrity().ToString();
}

// Forwards every op (gate open) and records, per PagedAttention call, the
// max_kv_len hint against the longest kv_len of the call's sequences (the
// CPU backend's memory is host memory, so the Seq array is readable here).
class AttentionHintRecorder final : public GatedCopyBackend {
 public:
  explicit AttentionHintRecorder(Backend& inner) : GatedCopyBackend(inner) { Open(); }
  void PagedAttention(const Tensor& q, const KvLayerView& l, const AttentionSeq* s, int32_t n,
                      const AttentionParams& p, Tensor o) override {
    int32_t longest = 0;
    for (int32_t i = 0; i < n; ++i) longest = std::max(longest, s[i].kv_len);
    ++calls;
    if (p.max_kv_len != longest) ++wrong;
    widest = std::max(widest, longest);
    GatedCopyBackend::PagedAttention(q, l, s, n, p, o);
  }
  int calls = 0, wrong = 0;
  int32_t widest = 0;
};

// The runner tells attention the step's longest context (the CUDA backend
// sizes its split-K from it), in prefill, decode and mixed batches.
TEST(EngineAttentionHintTest, EveryAttentionCallGetsTheLongestContext) {
  CpuBackendOptions bo;
  bo.num_threads = 1;
  auto cpu = std::move(*CreateCpuBackend(bo));
  AttentionHintRecorder rec(*cpu);
  auto m = LoadModelDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default",
                        rec, LoadOptions{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EngineOptions eo;
  eo.page_size = 16;
  eo.max_total_tokens = 512;
  auto e = Engine::Create(**m, rec, eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<GenerationRequest> reqs;
  for (int len : {5, 40, 90}) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < len; ++t) prompt.push_back(4 + (t * 7 + len) % 300);
    reqs.push_back(Greedy(prompt, 6));
  }
  auto res = (*e)->Generate(std::move(reqs));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_GT(rec.calls, 0);
  EXPECT_EQ(rec.wrong, 0) << "of " << rec.calls << " attention calls";
  EXPECT_EQ(rec.widest, 90 + 6 - 1);  // the last decode step's context
}

// A constraint of the engine's interface alone: at its k-th token it allows
// the 5 ids from (seed + 37k) mod 400 + 8 on, and records which threads ask.
class StepConstraint : public TokenConstraint {
 public:
  StepConstraint(int seed, int64_t vocab) : seed_(seed), words_((vocab + 31) / 32) {}
  std::span<const uint32_t> Allowed(int64_t tokens_left) override {
    EXPECT_GT(tokens_left, 0);
    {
      std::lock_guard<std::mutex> l(mu_);
      threads_.push_back(std::this_thread::get_id());
    }
    std::fill(words_.begin(), words_.end(), 0u);
    for (int id = First(); id < First() + 5; ++id) words_[id / 32] |= 1u << (id % 32);
    return words_;
  }
  void Advance(int32_t token) override {
    EXPECT_GE(token, First()) << "step " << k_;
    EXPECT_LT(token, First() + 5) << "step " << k_;
    ++k_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> l(mu_);
    return threads_;
  }

 private:
  int First() const { return (seed_ + 37 * k_) % 400 + 8; }
  int seed_, k_ = 0;
  std::vector<uint32_t> words_;
  std::mutex mu_;
  std::vector<std::thread::id> threads_;
};

// EngineOptions::mask_overlap on (what a CUDA backend gets by default): the
// masks are computed on the engine's mask worker while the step runs, and
// constrained and unconstrained requests batched together get exactly the
// tokens they get with the masks computed in line.
TEST(EngineMaskOverlapTest, OverlappedMasksGiveTheSameTokensFromTheWorker) {
  std::vector<std::vector<int32_t>> outs[2];
  for (int on = 0; on < 2; ++on) {
    EngineOptions eo;
    eo.page_size = 4;
    eo.max_total_tokens = 2048;
    eo.mask_overlap = on ? EngineOptions::MaskOverlap::kOn : EngineOptions::MaskOverlap::kOff;
    Stack s = Make(eo);
    const int64_t vocab = s.model->config.vocab_size;
    std::mt19937 rng(7);
    std::vector<std::shared_ptr<StepConstraint>> cons;
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      reqs.push_back(Greedy(RandomPrompt(rng, 9 + 11 * i), 12));
      if (i != 2) {  // request 2 runs unconstrained beside the others
        cons.push_back(std::make_shared<StepConstraint>(i * 101, vocab));
        reqs.back().constraint = cons.back();
      }
    }
    outs[on] = Outputs(*s.engine, reqs);
    for (auto& c : cons) {
      const auto threads = c->threads();
      ASSERT_EQ(threads.size(), 12u) << "one mask per sampled token";
      for (const auto& t : threads) {
        if (on)
          EXPECT_NE(t, std::this_thread::get_id()) << "masks come from the worker";
        else
          EXPECT_EQ(t, std::this_thread::get_id()) << "masks come from the engine thread";
      }
    }
    EXPECT_EQ(s.engine->load().pages_active, 0);
  }
  EXPECT_EQ(outs[0], outs[1]);
}

}  // namespace
}  // namespace strata
