#include "engine/engine.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "cache/kv_layout.h"
#include "util/logging.h"

namespace strata {

int64_t EffectiveContextLength(const EngineOptions& options, int64_t max_position_embeddings) {
  if (options.context_length > 0) return options.context_length;
  return max_position_embeddings > 0 ? max_position_embeddings : 4096;
}

StatusOr<int64_t> PlanKvPoolPages(const KvLayout& layout, const EngineOptions& options,
                                  int64_t context_length) {
  if (options.max_total_tokens > 0) return NumKvPagesForTokens(layout, options.max_total_tokens);
  const int64_t want = context_length * options.max_running_requests;
  ASSIGN_OR_RETURN(int64_t by_tokens, NumKvPagesForTokens(layout, want + options.page_size));
  constexpr uint64_t kCap = uint64_t{1} << 30;
  ASSIGN_OR_RETURN(int64_t by_bytes, NumKvPagesForBytes(layout, kCap));
  if (UsesWindowBacking(layout, options)) {
    // The windowed groups cost the backing's pages; the rest one per id.
    uint64_t windowed = 0, other = 0;
    for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
      (layout.groups[g].sliding_window > 0 ? windowed : other) += layout.BytesPerPage(g);
    const int64_t slots = options.window_pages > 0
                              ? options.window_pages
                              : WindowPagesFor(options, layout.MaxSlidingWindow(), by_tokens);
    const uint64_t slot_bytes = static_cast<uint64_t>(slots) * windowed;
    if (slot_bytes < kCap) {
      const uint64_t ids = other > 0 ? (kCap - slot_bytes) / other : uint64_t(kMaxKvPages);
      by_bytes = std::max<int64_t>(by_bytes, static_cast<int64_t>(std::min<uint64_t>(ids, kMaxKvPages)));
    }
  }
  return std::min(by_tokens, by_bytes);
}

bool UsesWindowBacking(const KvLayout& layout, const EngineOptions& options) {
  return layout.MaxSlidingWindow() > 0 && options.window_backing && !options.hicache.enabled &&
         !options.kv_pool_allocator;
}

int64_t MinWindowPages(const EngineOptions& options, int64_t window) {
  const int64_t ps = std::max<int32_t>(1, options.page_size);
  return (window + options.chunked_prefill_size + ps - 1) / ps + 1;
}

int64_t WindowPagesFor(const EngineOptions& options, int64_t window, int64_t pool_pages) {
  const int64_t want =
      2 * int64_t{std::max(1, options.max_running_requests)} * MinWindowPages(options, window);
  return std::min(want, pool_pages);
}

int32_t PromptLogitRows(const EngineOptions& options, int64_t vocab_size) {
  return static_cast<int32_t>(
      std::clamp<int64_t>(options.prompt_logit_floats / std::max<int64_t>(1, vocab_size), 16,
                          std::max(16, options.chunked_prefill_size)));
}

RunnerLimits EngineRunnerLimits(const EngineOptions& options, int64_t context_length,
                                int32_t max_batch_tokens, int64_t vocab_size) {
  RunnerLimits l;
  l.max_batch_tokens = max_batch_tokens;
  l.max_seqs = options.max_running_requests;
  l.max_logit_rows = static_cast<int32_t>(std::min<int64_t>(
      max_batch_tokens,
      int64_t{options.max_running_requests} + PromptLogitRows(options, vocab_size)));
  const int64_t page = std::max<int32_t>(1, options.page_size);
  l.max_pages_per_seq = std::max<int64_t>(1, (context_length + page - 1) / page);
  return l;
}

Engine::Engine(LoadedModel& model, Backend& backend, const EngineOptions& options)
    : model_(model), backend_(backend), options_(options) {}

Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(LoadedModel& model, Backend& backend,
                                                 const EngineOptions& options) {
  if (options.page_size < 1) return InvalidArgument("page size must be >= 1");
  if (options.max_running_requests < 1) return InvalidArgument("max running requests must be >= 1");
  if (options.chunked_prefill_size < 1) return InvalidArgument("chunked prefill size must be >= 1");
  std::unique_ptr<Engine> e(new Engine(model, backend, options));
  const auto overlap = options.mask_overlap;
  if (overlap == EngineOptions::MaskOverlap::kOn ||
      (overlap == EngineOptions::MaskOverlap::kAuto && backend.ComputesAsynchronously()))
    e->mask_worker_ = std::make_unique<HostWorker>();
  const KvLayout layout = model.model->kv_layout(options.page_size, options.kv_dtype);
  RETURN_IF_ERROR(layout.Validate());
  e->context_length_ = EffectiveContextLength(options, model.config.max_position_embeddings);
  int64_t pages = options.kv_pool_pages;
  if (pages <= 0) {
    ASSIGN_OR_RETURN(pages, PlanKvPoolPages(layout, options, e->context_length_));
  }
  int64_t window_pages = -1;  // no backing
  if (UsesWindowBacking(layout, options)) {
    const int window = layout.MaxSlidingWindow();
    window_pages =
        options.window_pages > 0 ? options.window_pages : WindowPagesFor(options, window, pages);
    const int64_t least = std::min(pages, MinWindowPages(options, window));
    if (window_pages < least || window_pages > pages)
      return InvalidArgument("window pages " + std::to_string(window_pages) + " must be in [" +
                             std::to_string(least) + ", " + std::to_string(pages) +
                             "]: one request's step reads a window of " + std::to_string(window) +
                             " tokens before its chunk of " +
                             std::to_string(options.chunked_prefill_size) +
                             ", and no more than the pool's pages");
  }
  ASSIGN_OR_RETURN(e->pool_, KvPool::Create(layout, pages, backend, options.kv_pool_allocator.get(),
                                            window_pages));
  if (options.hicache.enabled) {
    if (options.disable_radix_cache)
      return InvalidArgument(
          "the hierarchical cache needs the radix prefix cache (drop --disable-radix-cache)");
    RETURN_IF_ERROR(e->CreateHiCache(layout));
  } else if (!options.disable_radix_cache) {
    e->radix_ =
        std::make_unique<RadixTree>(RadixTreeConfig{options.page_size}, &e->pool_->allocator());
  }
  ASSIGN_OR_RETURN(e->runner_,
                   ModelRunner::Create(
                       *model.model, backend, *e->pool_,
                       EngineRunnerLimits(options, e->context_length_,
                                          model.model->max_batch_tokens(), model.config.vocab_size),
                       options.step_recording));
  SchedulerOptions so;
  so.page_size = options.page_size;
  so.max_running_requests = options.max_running_requests;
  so.chunked_prefill_size = options.chunked_prefill_size;
  so.max_batch_tokens = e->runner_->max_batch_tokens();
  so.init_new_token_ratio = std::min(1.0, 0.7 * std::max(0.0, options.schedule_conservativeness));
  so.min_new_token_ratio = std::min(1.0, 0.1 * std::max(0.0, options.schedule_conservativeness));
  // Prompt logprobs: the rows of logits per step (EngineOptions::prompt_logit_floats).
  so.max_prompt_logit_rows = PromptLogitRows(options, model.config.vocab_size);
  e->scheduler_ = std::make_unique<Scheduler>(so, *e->pool_, e->radix_.get(), e->hicache_.get());
  return e;
}

namespace {

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Identity of the model's weights for the storage tier: files written by a
// different model (or dtype, page size, layout) must never be read back.
// Hashes every tensor's name, dtype and shape and a sample of its bytes
// (start, middle, end), so two fine-tunes of one architecture differ.
std::string ModelFingerprint(const LoadedModel& model, const KvLayout& layout) {
  uint64_t h = RadixTree::kRootHash;
  auto mix_bytes = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    std::vector<int32_t> words;
    words.reserve(n / 4 + 1);
    for (size_t i = 0; i < n; i += 4) {
      uint32_t w = 0;
      std::memcpy(&w, b + i, std::min<size_t>(4, n - i));
      words.push_back(static_cast<int32_t>(w));
    }
    h = RadixTree::ChainPageHash(h, words);
  };
  auto mix_str = [&](const std::string& s) { mix_bytes(s.data(), s.size()); };
  mix_str(layout.Describe() + " page " + std::to_string(layout.page_size));
  mix_str(model.config.architecture);
  for (const auto& [name, w] : model.weights.tensors()) {
    mix_str(name + " " + DTypeName(w.dtype));
    for (int64_t d : w.shape) mix_bytes(&d, sizeof d);
    if (!w.data || w.nbytes == 0) continue;
    const size_t n = std::min<size_t>(256, w.nbytes);
    const auto* base = static_cast<const uint8_t*>(w.data);
    mix_bytes(base, n);
    mix_bytes(base + (w.nbytes - n) / 2, n);
    mix_bytes(base + w.nbytes - n, n);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace

Status Engine::CreateHiCache(const KvLayout& layout) {
  const HiCacheOptions& o = options_.hicache;
  int64_t host_pages = options_.hicache_host_pages;
  if (host_pages <= 0) {
    if (o.size_gb > 0) {
      host_pages =
          static_cast<int64_t>(o.size_gb * 1e9 / static_cast<double>(layout.BytesPerPage()));
    } else {
      host_pages = static_cast<int64_t>(o.ratio * static_cast<double>(pool_->num_pages()));
    }
  }
  // A host tier no larger than the device pool is allowed from a size (the
  // plan warns); a ratio must exceed 1 (the plan refuses it).
  if (host_pages < 1 || host_pages > kMaxKvPages)
    return InvalidArgument("the HiCache host pool of " + std::to_string(host_pages) +
                           " pages must be in [1, " + std::to_string(kMaxKvPages) +
                           "] (check --hicache-ratio / --hicache-size)");
  ASSIGN_OR_RETURN(host_pool_, HostKvPool::Create(layout, host_pages, o.numa_node, &backend_));
  radix_ = std::make_unique<RadixTree>(RadixTreeConfig{options_.page_size}, &pool_->allocator(),
                                       &host_pool_->allocator());
  std::unique_ptr<FileStorage> storage;
  if (o.storage_backend == "file") {
    FileStorageOptions fo;
    fo.dir = o.storage_path;
    fo.max_bytes = static_cast<uint64_t>(o.storage_max_gb * 1e9);
    fo.namespace_id = ModelFingerprint(model_, layout);
    auto st = FileStorage::Open(fo, layout);
    if (!st.ok())
      return st.status().Annotate("opening the HiCache storage tier (--hicache-storage-path)");
    storage = std::move(st).value();
  } else if (!o.storage_backend.empty()) {
    return InvalidArgument("--hicache-storage-backend " + o.storage_backend +
                           ": the only backend is 'file'");
  }
  hicache_ =
      std::make_unique<HiCache>(o, *pool_, *host_pool_, *radix_, backend_, std::move(storage));
  return OkStatus();
}

Status Engine::Validate(const EngineRequest& r) const {
  RETURN_IF_ERROR(r.params.Validate());
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxLogprobs)
    return InvalidArgument("prompt_logprobs " + std::to_string(r.prompt_logprobs) +
                           " must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (r.prompt_logprobs >= 0 && (r.kv_export || r.kv_import))
    return InvalidArgument(
        "prompt_logprobs is not supported by a prefill/decode pair (the prefill would have to "
        "send them); send the request to a colocated server");
  const int64_t plen = static_cast<int64_t>(r.prompt.size());
  if (plen == 0) return InvalidArgument("the prompt is empty");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= model_.config.vocab_size)
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(model_.config.vocab_size) + ")");
  if (plen >= context_length_)
    return InvalidArgument("the prompt has " + std::to_string(plen) +
                           " tokens; this model's context length is " +
                           std::to_string(context_length_) +
                           " (the prompt plus at least one generated token must fit)");
  const int64_t pool_tokens = pool_->num_pages() * options_.page_size;
  if (plen + 1 > pool_tokens)
    return InvalidArgument("the prompt has " + std::to_string(plen) +
                           " tokens; the KV cache holds " + std::to_string(pool_tokens) +
                           " (raise --max-total-tokens)");
  return OkStatus();
}

void Engine::Add(EngineRequest request, std::shared_ptr<RequestHandle> handle) {
  auto s = std::make_unique<Sequence>(std::move(request), std::move(handle), options_.page_size);
  s->tokens = s->req.prompt;
  s->prompt_len = static_cast<int64_t>(s->tokens.size());
  const int64_t pool_tokens = pool_->num_pages() * options_.page_size;
  s->limit = std::min(
      {context_length_, pool_tokens, s->prompt_len + std::max(0, s->req.params.max_tokens)});
  if (s->req.params.UsesPenalties()) s->history.AddPromptTokens(s->req.prompt);
  scheduler_->Add(std::move(s));
}

EngineLoad Engine::load() const {
  EngineLoad l;
  l.running = scheduler_->num_running();
  l.waiting = scheduler_->num_waiting();
  l.waiting_tokens = scheduler_->waiting_tokens();
  l.pages_total = pool_->num_pages();
  // The tree holds one reference per stored page; a request holds the
  // pages it adopted from the tree or inserted into it (chunk by chunk)
  // through its locked node. So the pages held by the cache alone are the
  // stored pages outside locked nodes.
  int64_t cached_only = 0;
  if (radix_) {
    const RadixTreeStats st = radix_->stats();
    cached_only = st.cached_pages - st.locked_pages;
  }
  l.pages_cached = cached_only;
  l.pages_active = pool_->allocator().num_used() - cached_only;
  return l;
}

void Engine::AbortAll(FinishReason reason, const Status& error) {
  scheduler_->FinishAll(reason, error);
}

// Row j of a prompt_logits item (position start_pos + j) scores the prompt
// token after it; positions already sent (before a preemption) are skipped.
void Engine::SendPromptLogprobs(Sequence& s, const StepItem& item, const float* rows) {
  const int64_t vocab = runner_->vocab_size();
  std::vector<PromptLogprob> out;
  for (int32_t j = 0; j < item.num_tokens; ++j) {
    const int64_t target = int64_t{item.start_pos} + j + 1;
    if (target < s.prompt_logprobs_next || target >= s.prompt_len) continue;
    SampleResult r;
    ComputeTokenLogprobs(rows + j * vocab, vocab, s.tokens[target], s.req.prompt_logprobs, &r);
    out.push_back({r.token_id, r.logprob, r.rank, std::move(r.top_logprobs)});
    s.prompt_logprobs_next = target + 1;
  }
  if (!out.empty()) s.handle->PushPromptLogprobs(std::move(out));
}

void Engine::Postprocess(const ScheduledBatch& batch, const Tensor& logits) {
  const int64_t vocab = runner_->vocab_size();
  // Every sampled row of the step goes to the backend in one call; prompt
  // logprob rows (rare) are copied to the host. Sampling reads only the
  // tokens so far, not what Computed() updates.
  batch_sampler_.Clear();
  const bool masks_early = mask_worker_ != nullptr && mask_worker_->busy();
  if (masks_early) mask_worker_->Wait();
  int64_t row = 0;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const StepItem& item = batch.items[i];
    Sequence& s = *batch.seqs[i];
    if (item.prompt_logits) {
      prompt_logits_.resize(static_cast<size_t>(item.num_tokens * vocab));
      backend_.CopyToHost(prompt_logits_.data(), logits.row<float>(row),
                          prompt_logits_.size() * sizeof(float));
      SendPromptLogprobs(s, item, prompt_logits_.data());
    }
    row += item.num_logit_rows();
    if (!item.want_logits) continue;
    const auto& p = s.req.params;
    std::span<const uint32_t> allowed;
    if (s.req.constraint)
      allowed = masks_early
                    ? early_masks_[i]
                    : s.req.constraint->Allowed(s.limit - static_cast<int64_t>(s.tokens.size()));
    banned_.clear();
    if (p.min_tokens > 0 && static_cast<int64_t>(s.tokens.size()) - s.prompt_len < p.min_tokens) {
      const auto& eos = model_.eos_token_ids;
      banned_.assign(eos.begin(), eos.end());
      banned_.insert(banned_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
    }
    batch_sampler_.Add(s.sampler, s.history, row - 1, allowed, banned_);
  }
  batch_sampler_.Run(backend_, logits, &sampled_);
  // The step's ops have finished (and a device-side index error surfaces)
  // before Computed() hands its pages to the prefix cache, HiCache backups
  // and PD exports, which may copy them at once.
  backend_.Synchronize();
  scheduler_->Computed(batch);
  size_t k = 0;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    if (!batch.items[i].want_logits) continue;
    Sequence& s = *batch.seqs[i];
    SampleResult& r = sampled_[k++];
    const auto& p = s.req.params;
    const auto& eos = model_.eos_token_ids;
    if (s.req.constraint) s.req.constraint->Advance(r.token_id);
    stats_.generated_tokens++;
    s.tokens.push_back(r.token_id);
    if (s.req.params.UsesPenalties()) s.history.AddOutputToken(r.token_id);
    GeneratedToken token{r.token_id, r.logprob, std::move(r.top_logprobs)};
    const bool is_eos = !p.ignore_eos && std::find(eos.begin(), eos.end(), r.token_id) != eos.end();
    const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), r.token_id) !=
                         p.stop_token_ids.end();
    FinishReason finish = FinishReason::kNone;
    if (is_eos || is_stop)
      finish = FinishReason::kStop;
    else if (static_cast<int64_t>(s.tokens.size()) >= s.limit)
      finish = FinishReason::kLength;
    if (s.req.kv_export) {
      // PD prefill: the first token goes to the decode with the KV; this
      // request ends once the decode has both.
      scheduler_->StartTransfer(s, token, finish);
      s.handle->Push(std::move(token));
      continue;
    }
    s.handle->Push(std::move(token));
    if (finish != FinishReason::kNone) scheduler_->Finish(s, finish);
  }
  scheduler_->Reap();
}

void Engine::StartMasks(const ScheduledBatch& batch) {
  if (!mask_worker_) return;
  struct Job {
    size_t item;
    TokenConstraint* constraint;
    int64_t tokens_left;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const Sequence& s = *batch.seqs[i];
    if (!batch.items[i].want_logits || !s.req.constraint) continue;
    jobs.push_back({i, s.req.constraint.get(), s.limit - static_cast<int64_t>(s.tokens.size())});
  }
  if (jobs.empty()) return;
  early_masks_.assign(batch.items.size(), {});
  mask_worker_->Start([this, jobs = std::move(jobs)] {
    for (const Job& j : jobs) early_masks_[j.item] = j.constraint->Allowed(j.tokens_left);
  });
}

Status Engine::Step() {
  ScheduledBatch batch;
  scheduler_->Schedule(&batch);
  if (batch.empty()) {
    if (hicache_ &&
        (!scheduler_->HasWork() || scheduler_->WaitingOnHiCache() || hicache_->busy())) {
      // Only copies or storage I/O are in flight: wait a little for them
      // instead of spinning (the loop comes straight back). A request may be
      // waiting for pages a backup in flight pins (write_through): they turn
      // evictable when it completes, so that is waiting, not "no progress".
      hicache_->WaitAny(std::chrono::milliseconds(2));
      return OkStatus();
    }
    if (scheduler_->WaitingOnHandoff()) {
      // PD: only waits on the other server (its pages, its KV, our writes):
      // the loop comes straight back after a short pause.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return OkStatus();
    }
    if (scheduler_->HasWork()) {
      Status err =
          Internal("scheduler made no progress: " + std::to_string(scheduler_->num_running()) +
                   " running, " + std::to_string(scheduler_->num_waiting()) + " waiting, " +
                   std::to_string(pool_->allocator().num_free()) + " free pages");
      AbortAll(FinishReason::kError, err);
      return err;
    }
    return OkStatus();
  }
  int64_t prompt_toks = 0, decode_toks = 0;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    if (batch.seqs[i]->state == RequestState::kDecoding)
      decode_toks += 1;
    else
      prompt_toks += batch.items[i].num_tokens;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = ProcessCpuSeconds();
  Tensor logits;
  StartMasks(batch);
  Status st = runner_->Run(batch.items, &logits);
  if (!st.ok()) {
    if (mask_worker_) mask_worker_->Wait();  // it reads the sequences AbortAll ends
    AbortAll(FinishReason::kError, st);
    return st;
  }
  Postprocess(batch, logits);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double dcpu = ProcessCpuSeconds() - cpu0;
  stats_.prefill_tokens += prompt_toks;
  stats_.decode_tokens += decode_toks;
  if (decode_toks == 0) {
    stats_.prefill_seconds += dt;
    stats_.prefill_cpu_seconds += dcpu;
  } else if (prompt_toks == 0) {
    stats_.decode_seconds += dt;
    stats_.decode_only_tokens += decode_toks;
    stats_.decode_cpu_seconds += dcpu;
  } else
    stats_.mixed_seconds += dt;
  stats_.steps++;
  const SchedulerStats& ss = scheduler_->stats();
  stats_.preemptions = ss.preemptions;
  stats_.headroom_waits = ss.headroom_waits;
  stats_.finished_requests = ss.finished_requests;
  stats_.aborted_requests = ss.aborted_requests;
  stats_.deferred_admissions = ss.deferred_admissions;
  return OkStatus();
}

Status Engine::CheckIntegrity() const {
  RETURN_IF_ERROR(pool_->allocator().CheckIntegrity());
  if (radix_) RETURN_IF_ERROR(radix_->CheckIntegrity());
  if (hicache_) RETURN_IF_ERROR(hicache_->CheckIntegrity());
  return scheduler_->CheckIntegrity();
}

StatusOr<std::vector<GenerationResult>> Engine::Generate(std::vector<GenerationRequest> requests) {
  struct Pending {
    std::shared_ptr<RequestHandle> handle;
    std::function<void(const StepOutput&)> on_token;
    GenerationResult result;
    bool done = false;
  };
  std::vector<Pending> pending(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest er;
    er.id = "generate-" + std::to_string(i);
    er.prompt = std::move(requests[i].prompt);
    er.params = requests[i].params;
    er.prompt_logprobs = requests[i].prompt_logprobs;
    er.constraint = std::move(requests[i].constraint);
    Status v = Validate(er);
    if (!v.ok()) {
      AbortAll(FinishReason::kAbort, v);
      return v.Annotate("request " + std::to_string(i));
    }
    pending[i].handle = std::make_shared<RequestHandle>();
    pending[i].on_token = std::move(requests[i].on_token);
    pending[i].result.prompt_tokens = static_cast<int64_t>(er.prompt.size());
    Add(std::move(er), pending[i].handle);
  }
  auto collect = [&]() -> Status {
    for (Pending& p : pending) {
      if (p.done) continue;
      RequestOutput out = p.handle->Take();
      for (PromptLogprob& lp : out.prompt_logprobs)
        p.result.prompt_logprobs.push_back(std::move(lp));
      for (GeneratedToken& t : out.tokens) {
        StepOutput so{t.id, t.logprob, std::move(t.top)};
        if (p.on_token) p.on_token(so);
        p.result.output.push_back(so.token);
        p.result.steps.push_back(std::move(so));
      }
      p.result.cached_tokens = out.cached_tokens;
      if (out.finished) {
        p.done = true;
        p.result.finish_reason = out.finish_reason;
        if (!out.error.ok()) return out.error;
      }
    }
    return OkStatus();
  };
  while (HasWork()) {
    RETURN_IF_ERROR(Step());
    RETURN_IF_ERROR(collect());
  }
  RETURN_IF_ERROR(collect());
  std::vector<GenerationResult> out;
  for (Pending& p : pending) out.push_back(std::move(p.result));
  return out;
}

}  // namespace strata
