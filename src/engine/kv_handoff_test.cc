// The engine's PD seam (kv_handoff.h) on a real tiny model: a prefill
// engine and a decode engine in one process, joined by a loopback handoff
// that copies pages between their pools with memcpy (the byte moves the
// real transport does over UCX; disagg/ tests that one). What is checked
// here is the engine's side of the contract: greedy outputs and logprobs
// equal to one colocated engine, decode-side prefix hits, the states'
// page holding under aborts and failures, kv_full, and no leaked page.
#include "engine/kv_handoff.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace strata {
namespace {

using Stack = test::EngineStack;

Stack Make(EngineOptions eo) { return test::MakeEngineStack(eo); }

// One room shared by the two sides (single-threaded test: no locking).
struct Room {
  KvPoolMemory src, dst;
  int page_size = 0;
  bool reserved = false;
  int64_t first_page = 0;
  std::vector<int32_t> dst_pages;
  int64_t pages_copied = 0;
  bool done = false;
  FirstToken first;
  bool prefill_failed = false;
  Status prefill_error;
  bool decode_aborted = false;
  bool hold_abort_ack = false;  // the test releases the decode's pages by clearing it
  Status decode_error;

  void Copy(int64_t first, std::span<const int32_t> pages) {
    const KvLayout& l = *src.layout;
    for (size_t i = 0; i < pages.size(); ++i) {
      const int64_t k = first + static_cast<int64_t>(i);
      if (k < first_page) continue;
      const int32_t d = dst_pages.at(static_cast<size_t>(k - first_page));
      for (int g = 0; g < static_cast<int>(l.groups.size()); ++g)
        for (int layer = 0; layer < l.groups[g].num_layers; ++layer)
          for (int t = 0; t < (l.groups[g].has_v ? 2 : 1); ++t)
            std::memcpy(dst.PagePtr(g, layer, t, d), src.PagePtr(g, layer, t, pages[i]),
                        l.BytesPerPagePerTensor(g));
      pages_copied++;
    }
  }
};

class LoopExport : public KvExport {
 public:
  explicit LoopExport(std::shared_ptr<Room> r) : r_(std::move(r)) {}
  bool Ready() override { return r_->reserved; }
  void PagesComputed(int64_t first, std::span<const int32_t> pages) override {
    r_->Copy(first, pages);
  }
  void Complete(int64_t first, std::span<const int32_t> pages, const FirstToken& ft) override {
    r_->Copy(first, pages);
    r_->first = ft;
    r_->done = true;
  }
  HandoffState Poll(Status* error) override {
    if (r_->decode_aborted) {
      *error = Unavailable("aborted: the decode ended the room");
      return HandoffState::kFailed;
    }
    return r_->done ? HandoffState::kDone : HandoffState::kPending;
  }
  void Abort(const Status& why) override {
    r_->prefill_failed = true;
    r_->prefill_error = why;
  }

 private:
  std::shared_ptr<Room> r_;
};

class LoopImport : public KvImport {
 public:
  explicit LoopImport(std::shared_ptr<Room> r) : r_(std::move(r)) {}
  void Reserved(int64_t first_page, std::span<const int32_t> pages, int64_t) override {
    r_->reserved = true;
    r_->first_page = first_page;
    r_->dst_pages.assign(pages.begin(), pages.end());
  }
  HandoffState Poll(FirstToken* first, Status* error) override {
    if (r_->decode_aborted) {
      if (r_->hold_abort_ack) return HandoffState::kPending;
      *error = Unavailable("aborted");
      return HandoffState::kFailed;
    }
    if (r_->prefill_failed) {
      *error = Unavailable("peer_lost: " + r_->prefill_error.ToString());
      return HandoffState::kFailed;
    }
    if (!r_->done) return HandoffState::kPending;
    *first = r_->first;
    return HandoffState::kDone;
  }
  void Abort(const Status& why) override {
    r_->decode_aborted = true;
    r_->decode_error = why;
  }

 private:
  std::shared_ptr<Room> r_;
};

struct Pd {
  Stack prefill, decode;
};

Pd MakePd(EngineOptions eo) { return Pd{Make(eo), Make(eo)}; }

EngineRequest Req(std::vector<int32_t> prompt, int max_tokens, int logprobs = -1) {
  EngineRequest r;
  r.id = "r";
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  r.params.max_tokens = max_tokens;
  r.params.logprobs = logprobs;
  return r;
}

struct Started {
  std::shared_ptr<Room> room;
  std::shared_ptr<RequestHandle> p, d;
};

Started Start(Pd& pd, const EngineRequest& req) {
  Started s;
  s.room = std::make_shared<Room>();
  s.room->src = pd.prefill.engine->pool().memory();
  s.room->dst = pd.decode.engine->pool().memory();
  EngineRequest pr = req, dr = req;
  pr.kv_export = std::make_shared<LoopExport>(s.room);
  dr.kv_import = std::make_shared<LoopImport>(s.room);
  s.p = std::make_shared<RequestHandle>();
  s.d = std::make_shared<RequestHandle>();
  EXPECT_TRUE(pd.prefill.engine->Validate(pr).ok());
  pd.prefill.engine->Add(std::move(pr), s.p);
  pd.decode.engine->Add(std::move(dr), s.d);
  return s;
}

void Drive(Pd& pd, int max_steps = 100000) {
  for (int i = 0; i < max_steps && (pd.prefill.engine->HasWork() || pd.decode.engine->HasWork());
       ++i) {
    if (pd.prefill.engine->HasWork()) {
      ASSERT_TRUE(pd.prefill.engine->Step().ok());
    }
    if (pd.decode.engine->HasWork()) {
      ASSERT_TRUE(pd.decode.engine->Step().ok());
    }
  }
  ASSERT_FALSE(pd.prefill.engine->HasWork() || pd.decode.engine->HasWork()) << "did not finish";
}

void ExpectClean(Pd& pd) {
  for (Engine* e : {pd.prefill.engine.get(), pd.decode.engine.get()}) {
    EXPECT_TRUE(e->CheckIntegrity().ok()) << e->CheckIntegrity().ToString();
    EXPECT_EQ(e->load().pages_active, 0);
  }
}

std::vector<int32_t> Prompt(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int32_t> d(4, 479);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = d(rng);
  return p;
}

RequestOutput Collect(RequestHandle& h) {
  RequestOutput all;
  for (;;) {
    RequestOutput o = h.Take();
    for (auto& t : o.tokens) all.tokens.push_back(std::move(t));
    all.finished = o.finished;
    all.finish_reason = o.finish_reason;
    all.error = o.error;
    all.prompt_tokens = o.prompt_tokens;
    all.cached_tokens = o.cached_tokens;
    if (o.finished || o.tokens.empty()) return all;
  }
}

class KvHandoffTest : public ::testing::TestWithParam<int> {};

TEST_P(KvHandoffTest, OutputsAndLogprobsEqualColocated) {
  EngineOptions eo;
  eo.page_size = GetParam();
  eo.max_total_tokens = 4096;
  eo.chunked_prefill_size = 16;  // several chunks: pages go out as chunks finish
  Stack ref = Make(eo);
  Pd pd = MakePd(eo);
  std::mt19937 rng(7);
  for (int n : {1, 5, 16, 17, 40}) {
    EngineRequest req = Req(Prompt(rng, n), 8, 2);
    GenerationRequest g;
    g.prompt = req.prompt;
    g.params = req.params;
    auto want = ref.engine->Generate({g});
    ASSERT_TRUE(want.ok());
    Started s = Start(pd, req);
    Drive(pd);
    RequestOutput out = Collect(*s.d);
    ASSERT_TRUE(out.finished);
    ASSERT_TRUE(out.error.ok()) << out.error.ToString();
    EXPECT_EQ(out.finish_reason, FinishReason::kLength);
    ASSERT_EQ(out.tokens.size(), (*want)[0].steps.size()) << "prompt of " << n;
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      EXPECT_EQ(out.tokens[i].id, (*want)[0].steps[i].token)
          << "token " << i << ", prompt of " << n;
      EXPECT_FLOAT_EQ(out.tokens[i].logprob, (*want)[0].steps[i].logprob);
      ASSERT_EQ(out.tokens[i].top.size(), 2u);
      EXPECT_EQ(out.tokens[i].top[0].token_id, (*want)[0].steps[i].top_logprobs[0].token_id);
    }
    EXPECT_EQ(out.prompt_tokens, n);
    RequestOutput pout = Collect(*s.p);
    EXPECT_TRUE(pout.finished && pout.error.ok()) << pout.error.ToString();
    ExpectClean(pd);
  }
}

TEST_P(KvHandoffTest, DecodeSidePrefixHitsAreNotTransferred) {
  EngineOptions eo;
  eo.page_size = GetParam();
  eo.max_total_tokens = 4096;
  Stack ref = Make(eo);
  Pd pd = MakePd(eo);
  std::mt19937 rng(3);
  std::vector<int32_t> system = Prompt(rng, 33);
  std::vector<int32_t> a = system, b = system;
  for (int32_t t : Prompt(rng, 6)) a.push_back(t);
  for (int32_t t : Prompt(rng, 9)) b.push_back(t);
  Started sa = Start(pd, Req(a, 5));
  Drive(pd);
  Started sb = Start(pd, Req(b, 5));
  Drive(pd);
  EXPECT_EQ(sb.room->first_page * GetParam(), 33 / GetParam() * GetParam())
      << "the shared pages are hits";
  EXPECT_EQ(sb.room->pages_copied,
            (static_cast<int64_t>(b.size()) + GetParam() - 1) / GetParam() - sb.room->first_page);
  GenerationRequest g;
  g.prompt = b;
  g.params = Req(b, 5).params;
  auto want = ref.engine->Generate({g});
  ASSERT_TRUE(want.ok());
  RequestOutput out = Collect(*sb.d);
  ASSERT_EQ(out.tokens.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out.tokens[i].id, (*want)[0].output[i]);
  ExpectClean(pd);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KvHandoffTest, ::testing::Values(1, 4, 16));

TEST(KvHandoffFailureTest, PrefillAbortFailsTheDecodeAndFreesBothSides) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 1024;
  eo.chunked_prefill_size = 8;
  Pd pd = MakePd(eo);
  std::mt19937 rng(5);
  Started s = Start(pd, Req(Prompt(rng, 40), 8));
  // Two steps in: the prefill is mid-prompt, the decode awaits its KV.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pd.decode.engine->Step().ok());
    ASSERT_TRUE(pd.prefill.engine->Step().ok());
  }
  EXPECT_GT(pd.decode.engine->load().pages_active, 0);
  s.p->Cancel();
  Drive(pd);
  RequestOutput out = Collect(*s.d);
  ASSERT_TRUE(out.finished);
  EXPECT_FALSE(out.error.ok());
  EXPECT_TRUE(out.tokens.empty()) << "never decoded from unfilled pages";
  EXPECT_EQ(pd.decode.engine->prefix_cache()->stats().cached_pages, 0)
      << "unfilled pages were cached";
  ExpectClean(pd);
}

TEST(KvHandoffFailureTest, CancelledDecodeHoldsItsPagesUntilNothingWritesThem) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 1024;
  Pd pd = MakePd(eo);
  std::mt19937 rng(6);
  Started s = Start(pd, Req(Prompt(rng, 20), 8));
  s.room->hold_abort_ack = true;
  ASSERT_TRUE(pd.decode.engine->Step().ok());  // reserved, awaiting
  const int64_t held = pd.decode.engine->load().pages_active;
  EXPECT_EQ(held, 5);
  s.d->Cancel();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pd.decode.engine->Step().ok());
  EXPECT_TRUE(s.room->decode_aborted);
  EXPECT_EQ(pd.decode.engine->load().pages_active, held)
      << "freed while the prefill may still write";
  EXPECT_TRUE(pd.decode.engine->CheckIntegrity().ok());
  s.room->hold_abort_ack = false;
  Drive(pd);
  RequestOutput out = Collect(*s.d);
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.finish_reason, FinishReason::kAbort);
  RequestOutput pout = Collect(*s.p);
  EXPECT_TRUE(pout.finished);
  EXPECT_FALSE(pout.error.ok()) << "the prefill learns that the decode gave up";
  ExpectClean(pd);
}

TEST(KvHandoffFailureTest, DecodeWithoutPagesRejectsAtOnceAsKvFull) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 64;  // 16 pages
  Pd pd = MakePd(eo);
  std::mt19937 rng(8);
  Started a = Start(pd, Req(Prompt(rng, 40), 4));  // 10 pages, awaiting
  ASSERT_TRUE(pd.decode.engine->Step().ok());
  Started b = Start(pd, Req(Prompt(rng, 40), 4));  // 10 more: do not fit
  ASSERT_TRUE(pd.decode.engine->Step().ok());
  RequestOutput ob = Collect(*b.d);
  ASSERT_TRUE(ob.finished);
  EXPECT_EQ(ob.error.code(), StatusCode::kUnavailable);
  EXPECT_NE(ob.error.message().find("kv_full"), std::string::npos) << ob.error.ToString();
  EXPECT_TRUE(b.room->decode_aborted) << "the prefill is told";
  Drive(pd);
  RequestOutput oa = Collect(*a.d);
  EXPECT_TRUE(oa.error.ok()) << oa.error.ToString();
  EXPECT_EQ(oa.tokens.size(), 4u);
  ExpectClean(pd);
}

TEST(KvHandoffFailureTest, FirstTokenThatEndsTheRequestEndsItOnTheDecode) {
  EngineOptions eo;
  eo.page_size = 4;
  eo.max_total_tokens = 1024;
  Pd pd = MakePd(eo);
  std::mt19937 rng(9);
  Started s = Start(pd, Req(Prompt(rng, 10), 1));
  Drive(pd);
  RequestOutput out = Collect(*s.d);
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.tokens.size(), 1u);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  ExpectClean(pd);
}

}  // namespace
}  // namespace strata
