// Engine: continuous batching over a paged KV pool with a radix prefix
// cache. One step is three calls, as in nano-vllm:
//   Schedule()    which sequences run and how many tokens each: decode tokens
//                 first (one per running sequence), then prompt chunks under
//                 the per-step budget (chunked prefill); reserves KV pages,
//                 evicting cached prefixes and, if still short, preempting
//                 the newest running sequences (they recompute later);
//   runner.Run()  one forward pass over the whole batch;
//   Postprocess() sample (BatchSampler: on the backend, only results come
//                 back), append to each request's handle, finish requests
//                 (EOS, stop tokens, length, cancellation, deadlines), cache
//                 their prefixes and free their pages.
// The scheduler is CPU-only bookkeeping (ids and refcounts); the runner owns
// everything that touches the backend.
//
// Greedy outputs do not depend on batch composition: every kernel computes a
// row from that row's data alone.
// Not thread-safe: one thread drives an Engine (AsyncEngine's engine thread,
// or the caller of Generate()).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/hicache.h"
#include "cache/hicache_plan.h"
#include "cache/host_pool.h"
#include "cache/kv_pool.h"
#include "cache/radix_tree.h"
#include "engine/batch_sampler.h"
#include "engine/host_worker.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/model_dir.h"

namespace strata {

struct EngineOptions {
  int32_t page_size = 16;
  // Tokens of KV the pool holds (0: enough for max_running_requests full
  // contexts, capped at 1 GiB of KV).
  int64_t max_total_tokens = 0;
  // Pages of the device KV pool, when startup planned them (on CUDA with
  // --mem-fraction-static: engine/device_memory_plan.h, the arena's
  // remainder, capped by --max-total-tokens). 0: PlanKvPoolPages.
  int64_t kv_pool_pages = 0;
  int32_t max_running_requests = 64;
  // Prompt tokens one step may carry (chunked prefill); decode tokens come
  // on top, one per running request.
  int32_t chunked_prefill_size = 512;
  // --schedule-conservativeness (SGLang's): scales the decode headroom kept
  // at admission (SchedulerOptions::init_new_token_ratio 0.7 x this, its
  // floor 0.1 x this, both at most 1: from 10 on, every answer's whole
  // budget is kept and nothing is preempted). 0: admit on the prompt's
  // pages alone and preempt when decode runs out.
  double schedule_conservativeness = 1.0;
  DType kv_dtype = DType::kF32;
  int64_t context_length = 0;  // 0: the model's max_position_embeddings
  bool disable_radix_cache = false;
  // HiCache (host + storage tiers under the prefix cache,
  // --enable-hierarchical-cache and --hicache-*), validated by
  // cli/serve_config before the engine is created, and the host page count
  // that validation planned (0: ratio x device pages, or size / bytes per
  // page, unchecked — offline use and tests).
  HiCacheOptions hicache;
  int64_t hicache_host_pages = 0;
  // Prompt logprobs: floats of logits one step may return for prompt
  // positions (128 MB; 220 rows at a 152k vocabulary, at least 16 rows):
  // a longer prompt asking for them is cut into more chunks.
  int64_t prompt_logit_floats = int64_t{32} << 20;
  // Where the device KV pool's memory comes from (null: the backend's
  // Allocate). `strata serve` in a PD role passes its KV transport's
  // allocator so peers write the pool directly. Host memory, so only with a
  // backend that computes on host memory (cache/kv_pool.h).
  std::shared_ptr<KvPoolAllocator> kv_pool_allocator;
  // Windowed pool groups (a sliding window; DeepSeek V4's compressor
  // inputs) behind a window backing of fewer pages than the pool's page ids
  // (cache/window_backing.h): pages that left every window are reused. Off
  // with the host tier and with a kv_pool_allocator (HiCache and PD copy
  // every group by page id), and off when false (`strata serve` in a PD
  // role). window_pages: the backing's pages, 0: WindowPagesFor.
  bool window_backing = true;
  int64_t window_pages = 0;
  // Constraint masks of a step computed on a thread of their own while the
  // step's forward is launched and runs (Engine::StartMasks): kAuto when
  // the backend computes asynchronously (CUDA), where the host's launches
  // and masks otherwise add up; on the CPU the forward has every core.
  enum class MaskOverlap { kAuto, kOff, kOn };
  MaskOverlap mask_overlap = MaskOverlap::kAuto;
  // Decode steps replayed from recordings (CUDA graphs; model_runner.h).
  StepRecordingOptions step_recording;
};

// The context length an engine with these options serves: the option, else
// the model's max_position_embeddings, else 4096.
int64_t EffectiveContextLength(const EngineOptions& options, int64_t max_position_embeddings);

// True when an engine with these options puts `layout`'s windowed groups
// behind a window backing (EngineOptions::window_backing).
bool UsesWindowBacking(const KvLayout& layout, const EngineOptions& options);
// The window backing's default page count for a layout whose largest
// sliding window is `window` tokens (> 0): two of the largest step's
// windows per running request (the step's chunk and the window before it,
// in pages, plus one for a page boundary inside each), at most the pool's
// pages. The second half keeps cached prefixes' windows until it is needed.
int64_t WindowPagesFor(const EngineOptions& options, int64_t window, int64_t pool_pages);
// The fewest window pages that let one request run: its largest step's
// window (what `window_pages` may not go under).
int64_t MinWindowPages(const EngineOptions& options, int64_t window);

// Pages of the device KV pool for `layout`: --max-total-tokens rounded down
// to whole pages when set, else enough for max_running_requests contexts of
// `context_length` (plus one page), capped at 1 GiB of KV. Under a window
// backing (UsesWindowBacking) the cap counts the windowed groups by the
// backing's pages (window_pages, or WindowPagesFor's want) and the rest by
// page id, so the bytes the backing saves become page ids. Engine::Create
// sizes its pool with this, and startup validation calls it before the
// weights load, so both agree. Fails as NumKvPagesForTokens/ForBytes do.
StatusOr<int64_t> PlanKvPoolPages(const KvLayout& layout, const EngineOptions& options,
                                  int64_t context_length);

// Rows of prompt logprobs one step may return (EngineOptions::
// prompt_logit_floats over the vocabulary, in [16, max(16,
// chunked_prefill_size)]): the scheduler's max_prompt_logit_rows.
int32_t PromptLogitRows(const EngineOptions& options, int64_t vocab_size);

// What the engine's ModelRunner must hold in one step (its per-step
// buffers are allocated once at these sizes): max_batch_tokens rows,
// max_running_requests sequences, one logit row per sequence plus the
// prompt-logprob rows, and page tables of context_length tokens.
RunnerLimits EngineRunnerLimits(const EngineOptions& options, int64_t context_length,
                                int32_t max_batch_tokens, int64_t vocab_size);

// Offline API (strata generate, benchmarks, parity tests).
struct StepOutput {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top_logprobs;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  // Called after each generated token (optional), e.g. to stream text.
  std::function<void(const StepOutput&)> on_token;
  int prompt_logprobs = -1;  // EngineRequest::prompt_logprobs
  std::shared_ptr<TokenConstraint> constraint;  // EngineRequest::constraint (optional)
};

struct GenerationResult {
  std::vector<int32_t> output;
  std::vector<StepOutput> steps;
  FinishReason finish_reason = FinishReason::kNone;  // kStop (EOS / stop token) or kLength
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<PromptLogprob> prompt_logprobs;  // prompt tokens 1.. when asked
};

struct EngineStats {
  int64_t prefill_tokens = 0;  // prompt tokens computed (cache hits excluded)
  int64_t decode_tokens = 0;
  int64_t generated_tokens = 0;  // every sampled token (first tokens included)
  double prefill_seconds = 0;    // steps that carried only prompt tokens
  double decode_seconds = 0;     // steps that carried only decode tokens
  int64_t decode_only_tokens = 0;  // decode tokens of those steps: / decode_seconds is a rate
  double mixed_seconds = 0;
  // Process CPU time (all threads, spinning included) of the prefill-only and
  // decode-only steps: on a shared machine, tokens x threads / CPU-seconds
  // says what the engine does with the cores it got (strata bench engine).
  double prefill_cpu_seconds = 0;
  double decode_cpu_seconds = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t finished_requests = 0;
  int64_t aborted_requests = 0;
  int64_t deferred_admissions = 0;  // admissions that waited for a shared prefix in computation
  int64_t headroom_waits = 0;  // steps whose admission waited for decode headroom
};

// Instantaneous state, for admission control and gauges.
struct EngineLoad {
  int64_t running = 0;         // admitted, computing
  int64_t waiting = 0;         // queued, prefill not started (incl. preempted)
  int64_t waiting_tokens = 0;  // prompt tokens of waiting requests
  int64_t pages_total = 0;
  int64_t pages_active = 0;  // held by at least one request
  int64_t pages_cached = 0;  // held only by the prefix cache
};

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(LoadedModel& model, Backend& backend,
                                                  const EngineOptions& options);
  ~Engine();

  // Checks what can be checked before queueing: params, token ids within the
  // vocabulary, prompt + 1 within the context and the KV pool. A request
  // that passes can always run eventually.
  Status Validate(const EngineRequest& request) const;
  // Queues a validated request; output goes to `handle`.
  void Add(EngineRequest request, std::shared_ptr<RequestHandle> handle);
  // Requests to run, or HiCache copies / storage writes still in flight
  // (Step then only applies their completions).
  bool HasWork() const { return scheduler_->HasWork() || (hicache_ && hicache_->busy()); }
  // One schedule -> run -> postprocess iteration. Returns an error only for
  // internal failures (then every request was finished with that error).
  Status Step();
  // Finishes every queued and running request with `reason`/`error`.
  void AbortAll(FinishReason reason, const Status& error);

  // Runs requests to completion (offline use).
  StatusOr<std::vector<GenerationResult>> Generate(std::vector<GenerationRequest> requests);

  const EngineStats& stats() const { return stats_; }
  // Decode steps replayed from recordings (EngineOptions::step_recording).
  const StepRecordingStats& step_recording_stats() const { return runner_->recording_stats(); }
  EngineLoad load() const;
  const KvPool& pool() const { return *pool_; }
  const RadixTree* prefix_cache() const { return radix_.get(); }
  // Null unless --enable-hierarchical-cache. Engine thread only.
  HiCache* hicache() { return hicache_.get(); }
  const HiCache* hicache() const { return hicache_.get(); }
  int64_t context_length() const { return context_length_; }
  const EngineOptions& options() const { return options_; }
  // Allocator + radix tree + every request's page table agree.
  Status CheckIntegrity() const;

 private:
  Engine(LoadedModel& model, Backend& backend, const EngineOptions& options);

  void SendPromptLogprobs(Sequence& s, const StepItem& item, const float* rows);
  // logits: the step's rows in backend memory (ModelRunner::Run).
  void Postprocess(const ScheduledBatch& batch, const Tensor& logits);
  // On an asynchronous backend, starts computing the constraint masks of
  // the batch's sampled rows on mask_worker_ (they depend only on tokens
  // already chosen), so they overlap the step's launches and forward;
  // Postprocess collects them. No-op otherwise or without constrained rows.
  void StartMasks(const ScheduledBatch& batch);

  LoadedModel& model_;
  Backend& backend_;
  EngineOptions options_;
  int64_t context_length_ = 0;
  Status CreateHiCache(const KvLayout& layout);

  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<HostKvPool> host_pool_;  // before radix_: the tree holds host page refs
  std::unique_ptr<RadixTree> radix_;
  std::unique_ptr<HiCache> hicache_;  // after radix_: it still applies completions to the tree
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;  // declared last: gives its pages back first
  EngineStats stats_;
  BatchSampler batch_sampler_;           // one step's sampling (reused)
  std::vector<SampleResult> sampled_;    // its results
  std::vector<float> prompt_logits_;     // scratch: an item's prompt-logprob rows on the host
  std::vector<int32_t> banned_;          // scratch: one row's min_tokens bans
  // StartMasks' results by batch item (empty span: none), valid while
  // mask_worker_ is busy or until Postprocess is done with them. Declared
  // after scheduler_, so destroyed first: it waits for a job reading
  // sequences.
  std::vector<std::span<const uint32_t>> early_masks_;
  std::unique_ptr<HostWorker> mask_worker_;  // asynchronous backends only
};

}  // namespace strata
