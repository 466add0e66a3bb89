// Recorded decode steps (StepRecordingOptions, Backend::BeginRecording).
//
// On the CPU (CI): a backend that records the way a CUDA graph does -- each
// op kept as a closure over its arguments, run at Replay -- in front of the
// CPU backend, so the runner's side of the contract is checked without a
// GPU: replayed steps give the eager tokens and logprobs to the bit, a
// recording the backend refuses runs its step op by op, a dropped recording
// is recorded again, and prefill steps are never recorded.
// On a GPU (skipped without one): the CUDA backend's graphs give the same
// bits as the same steps issued op by op. On the GPU machine:
//   ./build/src/step_recording_test
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <vector>

#include "engine/engine.h"
#include "model/model_dir.h"

namespace strata {
namespace {

// Every op goes to `inner`, or, while recording, into a list run at Replay.
class ClosureRecordingBackend final : public Backend {
 public:
  explicit ClosureRecordingBackend(Backend& inner) : b_(inner) {}

  // Test knobs: refuse every recording; drop every recording at the n-th
  // call of Replay (the backend having moved memory they use).
  bool refuse = false;
  int drop_at_replay = -1;
  int recorded = 0, replayed = 0, ops_recorded = 0;
  std::vector<int32_t> recorded_rows;  // Embedding rows of each recording

  std::string Name() const override { return b_.Name() + " (closure recordings)"; }
  StatusOr<Buffer> Allocate(size_t n) override {
    if (recording_) broken_ = true;
    return b_.Allocate(n);
  }
  void CopyToDevice(void* d, const void* s, size_t n) override {
    if (recording_) return void(broken_ = true);
    b_.CopyToDevice(d, s, n);
  }
  void CopyToHost(void* d, const void* s, size_t n) override {
    if (recording_) return void(broken_ = true);
    b_.CopyToHost(d, s, n);
  }
  void Synchronize() override {
    if (recording_) return void(broken_ = true);
    b_.Synchronize();
  }
  Status CopyBlocks(std::span<const CopyBlock> blocks, CopyKind kind) override {
    return b_.CopyBlocks(blocks, kind);
  }
  StatusOr<Tensor> UploadWeight(const Tensor& h) override { return b_.UploadWeight(h); }
  void SampleRows(const Tensor& logits, std::span<const SampleRowParams> rows, HostRowSampler& host,
                  std::span<SampleResult> out) override {
    if (recording_) return void(broken_ = true);
    b_.SampleRows(logits, rows, host, out);
  }

  void Embedding(const Tensor& t, const int32_t* ids, Tensor o) override {
    if (recording_) recorded_rows.push_back(static_cast<int32_t>(o.rows));
    Do([=, this] { b_.Embedding(t, ids, o); });
  }
  void RmsNorm(const Tensor& x, const Tensor& w, float e, Tensor o) override {
    Do([=, this] { b_.RmsNorm(x, w, e, o); });
  }
  void Linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor o) override {
    Do([=, this] { b_.Linear(x, w, bias, o); });
  }
  void LinearGroup(const Tensor& x, std::span<const LinearPart> parts) override {
    std::vector<LinearPart> p(parts.begin(), parts.end());
    Do([=, this] { b_.LinearGroup(x, p); });
  }
  void LinearSiluMul(const Tensor& x, const LinearPart& g, const LinearPart& u, Tensor o) override {
    Do([=, this] { b_.LinearSiluMul(x, g, u, o); });
  }
  void AddRmsNorm(Tensor x, const Tensor& d, const Tensor& w, float e, Tensor o) override {
    Do([=, this] { b_.AddRmsNorm(x, d, w, e, o); });
  }
  void SiluMul(const Tensor& g, const Tensor& u, Tensor o) override {
    Do([=, this] { b_.SiluMul(g, u, o); });
  }
  void Add(const Tensor& a, const Tensor& c, Tensor o) override {
    Do([=, this] { b_.Add(a, c, o); });
  }
  void Rope(Tensor q, Tensor k, const int32_t* p, const RopeParams& r) override {
    Do([=, this] { b_.Rope(q, k, p, r); });
  }
  void StoreKv(const Tensor& k, const Tensor& v, const KvLayerView& l, const int64_t* s) override {
    Do([=, this] { b_.StoreKv(k, v, l, s); });
  }
  void RopeStoreKv(Tensor q, Tensor k, const Tensor& v, const int32_t* p, const RopeParams& r,
                   const KvLayerView& l, const int64_t* s) override {
    Do([=, this] { b_.RopeStoreKv(q, k, v, p, r, l, s); });
  }
  void PagedAttention(const Tensor& q, const KvLayerView& l, const AttentionSeq* s, int32_t n,
                      const AttentionParams& p, Tensor o) override {
    Do([=, this] { b_.PagedAttention(q, l, s, n, p, o); });
  }
  void GatherRows(const Tensor& x, const int32_t* r, Tensor o) override {
    Do([=, this] { b_.GatherRows(x, r, o); });
  }
  void ScaleAddRows(const Tensor& x, const int32_t* r, const float* s, Tensor o) override {
    Do([=, this] { b_.ScaleAddRows(x, r, s, o); });
  }

  bool SupportsRecording() const override { return true; }
  Status BeginRecording() override {
    EXPECT_FALSE(recording_);
    recording_ = true;
    broken_ = false;
    ops_.clear();
    return OkStatus();
  }
  StatusOr<int> EndRecording() override {
    recording_ = false;
    if (refuse || broken_) return FailedPrecondition("refused");
    ++recorded;
    ops_recorded += static_cast<int>(ops_.size());
    recordings_[next_] = std::move(ops_);
    return next_++;
  }
  bool Replay(int id) override {
    if (++replay_calls_ == drop_at_replay) recordings_.clear();
    auto it = recordings_.find(id);
    if (it == recordings_.end()) return false;
    ++replayed;
    for (const auto& op : it->second) op();
    return true;
  }
  void ForgetRecording(int id) override { recordings_.erase(id); }

 private:
  void Do(std::function<void()> op) {
    if (recording_)
      ops_.push_back(std::move(op));
    else
      op();
  }
  Backend& b_;
  bool recording_ = false, broken_ = false;
  std::vector<std::function<void()>> ops_;
  std::map<int, std::vector<std::function<void()>>> recordings_;
  int next_ = 0, replay_calls_ = 0;
};

// Three sequences finishing at different steps (decode batches of 3, 2 and
// 1), the longest context crossing the 128 hint, greedy with logprobs.
std::vector<GenerationRequest> Requests() {
  std::vector<GenerationRequest> reqs;
  const int lens[] = {5, 40, 70}, gens[] = {30, 12, 70};
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    for (int t = 0; t < lens[i]; ++t) r.prompt.push_back(4 + (t * 7 + lens[i]) % 300);
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = gens[i];
    r.params.logprobs = 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct Outcome {
  std::vector<GenerationResult> results;
  StepRecordingStats stats;
};

Outcome Generate(Backend& backend, const StepRecordingOptions& rec) {
  Outcome run;
  auto m = LoadModelDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/llama_default",
                        backend, LoadOptions{});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return run;
  EngineOptions eo;
  eo.page_size = 16;
  eo.max_total_tokens = 1024;
  eo.step_recording = rec;
  auto e = Engine::Create(**m, backend, eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (!e.ok()) return run;
  auto res = (*e)->Generate(Requests());
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  if (res.ok()) run.results = std::move(*res);
  run.stats = (*e)->step_recording_stats();
  return run;
}

// Same tokens, logprobs and top logprobs, to the bit.
void ExpectSame(const Outcome& want, const Outcome& got) {
  ASSERT_EQ(want.results.size(), got.results.size());
  for (size_t i = 0; i < want.results.size(); ++i) {
    const auto& w = want.results[i].steps;
    const auto& g = got.results[i].steps;
    ASSERT_EQ(w.size(), g.size()) << "request " << i;
    for (size_t t = 0; t < w.size(); ++t) {
      EXPECT_EQ(w[t].token, g[t].token) << "request " << i << " token " << t;
      EXPECT_EQ(w[t].logprob, g[t].logprob) << "request " << i << " token " << t;
      ASSERT_EQ(w[t].top_logprobs.size(), g[t].top_logprobs.size());
      for (size_t k = 0; k < w[t].top_logprobs.size(); ++k) {
        EXPECT_EQ(w[t].top_logprobs[k].token_id, g[t].top_logprobs[k].token_id);
        EXPECT_EQ(w[t].top_logprobs[k].logprob, g[t].top_logprobs[k].logprob);
      }
    }
  }
}

std::unique_ptr<Backend> Cpu() {
  CpuBackendOptions bo;
  bo.num_threads = 1;
  return std::move(*CreateCpuBackend(bo));
}

TEST(StepRecordingTest, ReplayedDecodeStepsGiveTheEagerBits) {
  auto cpu = Cpu();
  const Outcome want = Generate(*cpu, {});  // the CPU backend records nothing
  EXPECT_EQ(want.stats.recorded, 0);
  ClosureRecordingBackend rec(*cpu);
  const Outcome got = Generate(rec, {});
  ExpectSame(want, got);
  // Contexts 71.. after the prefill: keys (sequences, hint) (3, 128),
  // (2, 128), (1, 128), (1, 256), each seen once eagerly, recorded at its
  // second step and replayed from then on.
  EXPECT_EQ(got.stats.recorded, 4);
  EXPECT_EQ(got.stats.failed, 0);
  EXPECT_EQ(rec.recorded, 4);
  EXPECT_EQ(rec.replayed, got.stats.replayed);
  EXPECT_GT(got.stats.replayed, 60);
  EXPECT_EQ(got.stats.eager_decode, 4);
  // Only decode steps: one row per sequence.
  for (int32_t rows : rec.recorded_rows) EXPECT_LE(rows, 3);
}

TEST(StepRecordingTest, ARefusedRecordingRunsItsStepsOpByOp) {
  auto cpu = Cpu();
  const Outcome want = Generate(*cpu, {});
  ClosureRecordingBackend rec(*cpu);
  rec.refuse = true;
  const Outcome got = Generate(rec, {});
  ExpectSame(want, got);
  EXPECT_EQ(got.stats.recorded, 0);
  EXPECT_EQ(got.stats.failed, 4);  // once per key, then never asked again
  EXPECT_EQ(got.stats.replayed, 0);
  EXPECT_EQ(rec.replayed, 0);
}

TEST(StepRecordingTest, ADroppedRecordingIsRecordedAgain) {
  auto cpu = Cpu();
  const Outcome want = Generate(*cpu, {});
  ClosureRecordingBackend rec(*cpu);
  rec.drop_at_replay = 5;  // a replay of the 3-sequence key finds every recording gone
  const Outcome got = Generate(rec, {});
  ExpectSame(want, got);
  EXPECT_EQ(got.stats.dropped, 1);   // the others were not recorded yet
  EXPECT_EQ(got.stats.recorded, 5);  // that key recorded again
  EXPECT_EQ(got.stats.failed, 0);
}

TEST(StepRecordingTest, DisabledOrCappedRecordsNothingBeyondTheCap) {
  auto cpu = Cpu();
  const Outcome want = Generate(*cpu, {});
  ClosureRecordingBackend rec(*cpu);
  StepRecordingOptions off;
  off.enabled = false;
  const Outcome none = Generate(rec, off);
  ExpectSame(want, none);
  EXPECT_EQ(none.stats.recorded + none.stats.eager_decode, 0);
  StepRecordingOptions capped;
  capped.max_recordings = 1;
  const Outcome one = Generate(rec, capped);
  ExpectSame(want, one);
  EXPECT_EQ(one.stats.recorded, 1);
  StepRecordingOptions small;
  small.max_seqs = 2;  // the 3-sequence steps run op by op, and are no candidates
  const Outcome two = Generate(rec, small);
  ExpectSame(want, two);
  EXPECT_EQ(two.stats.recorded, 3);
  EXPECT_EQ(two.stats.eager_decode, 3);
}

// The CUDA backend's graphs: the same steps replayed and issued op by op
// (max_recordings 0: the same hints, nothing recorded) give the same bits,
// at both matmul precisions (one row: GEMV kernels; two and three:
// cuBLASLt, with the bf16 scratch in the graph).
TEST(CudaStepRecordingTest, GraphsGiveTheOpByOpBits) {
  auto facts = ReadCudaMemoryFacts(0);
  if (!facts.ok()) GTEST_SKIP() << facts.status().message();
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    CudaBackendOptions co;
    co.matmul_precision = precision;
    auto cuda = CreateCudaBackend(co);
    ASSERT_TRUE(cuda.ok()) << cuda.status().message();
    ASSERT_TRUE((*cuda)->SupportsRecording());
    StepRecordingOptions none;
    none.max_recordings = 0;
    const Outcome want = Generate(**cuda, none);
    EXPECT_EQ(want.stats.recorded, 0);
    const Outcome got = Generate(**cuda, {});
    ExpectSame(want, got);
    EXPECT_EQ(got.stats.recorded, 4);
    EXPECT_EQ(got.stats.failed, 0);
    EXPECT_GT(got.stats.replayed, 60);
  }
}

}  // namespace
}  // namespace strata
