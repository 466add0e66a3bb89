#include "engine/async_engine.h"

#include <algorithm>
#include <cmath>
#include <future>

#include "util/logging.h"

namespace strata {

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, const AdmissionOptions& admission)
    : engine_(std::move(engine)), admission_(admission) {
  facts_.context_length = engine_->context_length();
  facts_.max_running_requests = engine_->options().max_running_requests;
  facts_.page_size = engine_->options().page_size;
  facts_.pages_total = engine_->load().pages_total;
}

StatusOr<std::unique_ptr<AsyncEngine>> AsyncEngine::Start(std::unique_ptr<Engine> engine,
                                                          const AdmissionOptions& admission,
                                                          metrics::Registry* registry) {
  std::unique_ptr<AsyncEngine> a(new AsyncEngine(std::move(engine), admission));
  if (registry) a->RegisterMetrics(*registry);
  a->Publish();
  a->thread_ = std::thread([p = a.get()] { p->Loop(); });
  return a;
}

AsyncEngine::~AsyncEngine() { Stop(); }

void AsyncEngine::RegisterMetrics(metrics::Registry& r) {
  auto gauge = [&](const char* name, const char* help, int64_t EngineSnapshot::*field) {
    Status st = r.AddCallbackGauge(
        name, help, [this, field] { return static_cast<double>(snapshot().*field); });
    if (!st.ok()) STRATA_LOG(ERROR) << st.ToString();
  };
  gauge("strata_running_requests", "Requests being computed (prefill or decode).",
        &EngineSnapshot::running);
  gauge("strata_queued_requests", "Admitted requests waiting for prefill to start.",
        &EngineSnapshot::queued_requests);
  gauge("strata_queued_tokens", "Prompt tokens of queued requests.",
        &EngineSnapshot::queued_tokens);
  // The limits, so dashboards and alerts can put a queue against its limit
  // (deploy/prometheus/alerts.yml "queue near limit"). A limit that is not set
  // (0) has no series: "no limit" is no number to compare against.
  auto limit = [&](const char* name, const char* help, int64_t value) {
    if (value <= 0) return;
    auto f = r.AddGauge(name, help);
    if (!f.ok()) {
      STRATA_LOG(ERROR) << f.status().ToString();
      return;
    }
    (*f)->Get().Set(static_cast<double>(value));
  };
  limit("strata_max_running_requests", "--max-running-requests: requests computed concurrently.",
        facts_.max_running_requests);
  limit("strata_max_queued_requests",
        "--max-queued-requests: admitted requests that may wait (absent: no limit).",
        admission_.max_queued_requests);
  limit("strata_max_queued_tokens",
        "--max-queued-tokens: prompt tokens that may wait (absent: no limit).",
        admission_.max_queued_tokens);
  // The pool size is fixed for the process lifetime; a constant series is a
  // valid counter, which keeps the conventional name promtool-clean.
  if (Status st = r.AddCallbackCounter(
          "strata_kv_pages_total", "Pages in the KV cache pool (fixed at startup).",
          [this] { return static_cast<double>(snapshot().pages_total); });
      !st.ok())
    STRATA_LOG(ERROR) << st.ToString();
  auto used = r.AddGauge("strata_kv_pages_used",
                         "KV pages in use: active = held by in-flight requests, cached = held only "
                         "by the prefix cache.",
                         {"state"});
  if (used.ok()) {
    // Callback gauges carry no labels: keep two gauges current at publish time.
    (*used)->Get({"active"});
    (*used)->Get({"cached"});
    kv_used_ = *used;
  }
  // Windowed pool groups behind a window backing (cache/window_backing.h):
  // their physical pages, backing a page id or free; both 0 when the pool
  // has no backing (no sliding-window groups, or HiCache / PD).
  if (auto w = r.AddGauge("strata_kv_window_pages",
                          "Physical pages of the windowed KV pool groups (sliding windows) behind "
                          "a window backing: backed = holding a page's window entries, free = "
                          "reusable; both 0 without a backing.",
                          {"state"});
      w.ok()) {
    (*w)->Get({"backed"});
    (*w)->Get({"free"});
    kv_window_ = *w;
  }
  // Bytes of each pool group on each tier, fixed at startup: a model with
  // several pools (DeepSeek's) shows where its KV memory went.
  if (auto f = r.AddGauge(
          "strata_kv_pool_bytes",
          "Bytes of the KV cache per pool group and tier (device: the engine's pool; host: the "
          "HiCache host tier), fixed at startup.",
          {"group", "tier"});
      f.ok()) {
    const KvLayout& layout = engine_->pool().layout();
    for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) {
      const double page = static_cast<double>(layout.BytesPerPage(g));
      (*f)->Get({layout.groups[g].name, "device"}).Set(page * engine_->pool().GroupPages(g));
      if (engine_->hicache())
        (*f)->Get({layout.groups[g].name, "host"})
            .Set(page * engine_->hicache()->host_pool().num_pages());
    }
  } else {
    STRATA_LOG(ERROR) << f.status().ToString();
  }
  auto counter = [&](const char* name, const char* help) -> metrics::Counter* {
    auto f = r.AddCounter(name, help);
    if (!f.ok()) {
      STRATA_LOG(ERROR) << f.status().ToString();
      return nullptr;
    }
    return &(*f)->Get();
  };
  prompt_tokens_ = counter("strata_prompt_tokens_total",
                           "Prompt tokens computed by prefill (prefix-cache hits excluded).");
  generation_tokens_ = counter("strata_generation_tokens_total", "Tokens generated.");
  prefix_hit_tokens_ = counter("strata_prefix_cache_hit_tokens_total",
                               "Prompt tokens served from the prefix cache.");
  preemptions_ = counter("strata_preemptions_total",
                         "Requests preempted (KV pages ran out) and recomputed later.");
  headroom_waits_ =
      counter("strata_admission_headroom_waits_total",
              "Scheduling steps whose admission waited: the KV pool could not also hold the "
              "expected rest of the running requests' answers (--schedule-conservativeness).");
  if (engine_->hicache()) RegisterHiCacheMetrics(r);
}

void AsyncEngine::RegisterHiCacheMetrics(metrics::Registry& r) {
  auto m = std::make_unique<HiCacheMetrics>();
  auto log = [](const Status& st) {
    if (!st.ok()) STRATA_LOG(ERROR) << st.ToString();
  };
  auto labelled =
      [&](const char* name, const char* help, const char* label,
          std::initializer_list<const char*> values) -> metrics::Family<metrics::Counter>* {
    auto f = r.AddCounter(name, help, {label});
    if (!f.ok()) {
      log(f.status());
      return nullptr;
    }
    for (const char* v : values) (*f)->Get({v});  // render 0 before the first event
    return *f;
  };
  for (const PoolGroupSpec& g : engine_->pool().layout().groups) m->groups.push_back(g.name);
  if (auto f = r.AddGauge(
          "strata_hicache_host_pages",
          "HiCache host pool pages per pool group: used (holding a backed-up prefix or a copy "
          "in flight) or free.",
          {"group", "state"});
      f.ok()) {
    m->host_pages = *f;
    for (const std::string& g : m->groups) {
      (*f)->Get({g, "used"});
      (*f)->Get({g, "free"});
    }
  } else {
    log(f.status());
  }
  if (auto f = r.AddGauge("strata_hicache_storage_bytes",
                          "Bytes of KV pages the HiCache storage tier holds.");
      f.ok())
    m->storage_bytes = &(*f)->Get();
  else
    log(f.status());
  m->hit_tokens =
      labelled("strata_hicache_hit_tokens_total",
               "Prompt tokens found in the prefix cache, by the tier they were found in.", "tier",
               {"device", "host", "storage"});
  m->load_back_tokens =
      labelled("strata_hicache_load_back_tokens_total",
               "Prompt tokens copied back into device pages, by the tier they came from.", "tier",
               {"host", "storage"});
  m->backup_tokens = labelled("strata_hicache_backup_tokens_total",
                              "Prefix tokens backed up, by the tier they were written to.", "tier",
                              {"host", "storage"});
  m->evicted_tokens = labelled(
      "strata_hicache_evicted_tokens_total",
      "Prefix tokens evicted, by the tier they left (device: the prefix may stay on the host).",
      "tier", {"device", "host", "storage"});
  m->storage_errors = labelled(
      "strata_hicache_storage_errors_total",
      "Storage tier errors: corrupt files (treated as misses and removed), I/O errors, full disk.",
      "reason", {"corrupt", "io", "full"});
  if (auto f = r.AddHistogram(
          "strata_hicache_load_back_seconds",
          "Time from submitting a load-back of a request's host-resident prefix to its completion.",
          {}, metrics::ExponentialBuckets(0.0001, 2, 16));
      f.ok())
    m->load_back_seconds = &(*f)->Get();
  else
    log(f.status());
  hicache_metrics_ = std::move(m);
}

void AsyncEngine::PublishHiCache() {
  HiCache* hc = engine_->hicache();
  if (!hc || !hicache_metrics_) return;
  HiCacheMetrics& m = *hicache_metrics_;
  const HiCacheStats st = hc->stats();
  const HiCacheStats& last = m.last;
  auto inc = [](metrics::Family<metrics::Counter>* f, const char* label, int64_t now,
                int64_t before) {
    if (f && now > before) f->Get({label}).Inc(static_cast<double>(now - before));
  };
  inc(m.hit_tokens, "device", st.hit_tokens_device, last.hit_tokens_device);
  inc(m.hit_tokens, "host", st.hit_tokens_host, last.hit_tokens_host);
  inc(m.hit_tokens, "storage", st.hit_tokens_storage, last.hit_tokens_storage);
  inc(m.load_back_tokens, "host", st.load_back_tokens_host, last.load_back_tokens_host);
  inc(m.load_back_tokens, "storage", st.load_back_tokens_storage, last.load_back_tokens_storage);
  inc(m.backup_tokens, "host", st.backup_tokens_host, last.backup_tokens_host);
  inc(m.backup_tokens, "storage", st.backup_tokens_storage, last.backup_tokens_storage);
  inc(m.evicted_tokens, "device", st.evicted_tokens_device, last.evicted_tokens_device);
  inc(m.evicted_tokens, "host", st.evicted_tokens_host, last.evicted_tokens_host);
  inc(m.evicted_tokens, "storage", st.evicted_tokens_storage, last.evicted_tokens_storage);
  inc(m.storage_errors, "corrupt", st.storage_errors_corrupt, last.storage_errors_corrupt);
  inc(m.storage_errors, "io", st.storage_errors_io, last.storage_errors_io);
  inc(m.storage_errors, "full", st.storage_errors_full, last.storage_errors_full);
  if (m.host_pages)
    for (const std::string& g : m.groups) {
      m.host_pages->Get({g, "used"}).Set(static_cast<double>(st.host_pages_used));
      m.host_pages->Get({g, "free"})
          .Set(static_cast<double>(st.host_pages_total - st.host_pages_used));
    }
  if (m.storage_bytes) m.storage_bytes->Set(static_cast<double>(st.storage_bytes));
  if (m.load_back_seconds)
    for (double s : hc->TakeLoadBackSeconds()) m.load_back_seconds->Observe(s);
  m.last = st;
}

EngineSnapshot AsyncEngine::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineSnapshot s = published_;
  s.queued_requests += static_cast<int64_t>(inbox_.size());
  s.queued_tokens += inbox_tokens_;
  return s;
}

SubmitResult AsyncEngine::Submit(EngineRequest request) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  SubmitResult r = SubmitAll(std::move(one));
  if (!r.handles.empty()) r.handle = r.handles[0];
  return r;
}

SubmitResult AsyncEngine::SubmitAll(std::vector<EngineRequest> requests) {
  SubmitResult r;
  if (draining_.load()) {
    r.status = Unavailable("the server is shutting down and accepts no new requests");
    r.limit = "draining";
    r.retry_after_seconds = 5;
    return r;
  }
  int64_t tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    r.status = engine_->Validate(requests[i]);  // reads only immutable engine state
    if (!r.status.ok()) {
      r.failed_request = i;
      return r;
    }
    tokens += static_cast<int64_t>(requests[i].prompt.size());
  }
  const int64_t count = static_cast<int64_t>(requests.size());
  if (count == 0) return r;
  const std::string what =
      count == 1 ? "this request" : "this request's " + std::to_string(count) + " choices";
  // Limits the group exceeds on its own: waiting cannot help, so it is the
  // client's error (400), not a retryable 503. Running slots count because
  // an idle engine starts that many at once without queueing them.
  const int64_t max_running = facts_.max_running_requests;
  if (admission_.max_queued_requests > 0 && count > admission_.max_queued_requests + max_running) {
    r.status = InvalidArgument(what + " can never be admitted: the server holds at most " +
                               std::to_string(max_running + admission_.max_queued_requests) +
                               " requests (--max-running-requests " + std::to_string(max_running) +
                               " + --max-queued-requests " +
                               std::to_string(admission_.max_queued_requests) +
                               "); send fewer prompts or a smaller n");
    r.limit = "max_queued_requests";
    return r;
  }
  if (admission_.max_queued_tokens > 0 && tokens > admission_.max_queued_tokens) {
    r.status = InvalidArgument(what + " can never be admitted: " + std::to_string(tokens) +
                               " prompt tokens exceed --max-queued-tokens " +
                               std::to_string(admission_.max_queued_tokens) +
                               "; send a shorter prompt, fewer prompts or a smaller n");
    r.limit = "max_queued_tokens";
    return r;
  }
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t queued = published_.queued_requests + static_cast<int64_t>(inbox_.size());
  const int64_t queued_tokens = published_.queued_tokens + inbox_tokens_;
  const double rate = published_.prefill_tokens_per_second;
  // Time for the queue ahead to drain, from the measured prefill rate.
  auto drain_seconds = [&](int64_t toks) { return rate > 0 ? toks / rate : 1.0; };
  auto reject = [&](const char* limit, std::string msg) {
    r.status = Unavailable(std::move(msg));
    r.limit = limit;
    r.retry_after_seconds = std::clamp(std::ceil(drain_seconds(queued_tokens)), 1.0, 600.0);
    return r;
  };
  // Requests that will find a free running slot do not wait in the queue:
  // a burst into an idle server fills the batch and then the queue.
  const int64_t free_slots = std::max<int64_t>(0, max_running - published_.running);
  if (admission_.max_queued_requests > 0 &&
      queued + count > admission_.max_queued_requests + free_slots)
    return reject("max_queued_requests", "server overloaded: " + std::to_string(queued) +
                                             " requests are already queued and " + what +
                                             " would add " + std::to_string(count) +
                                             " (--max-queued-requests " +
                                             std::to_string(admission_.max_queued_requests) + ")");
  if (admission_.max_queued_tokens > 0 && queued_tokens + tokens > admission_.max_queued_tokens)
    return reject("max_queued_tokens", "server overloaded: " + std::to_string(queued_tokens) +
                                           " prompt tokens are queued and " + what + " adds " +
                                           std::to_string(tokens) + " (--max-queued-tokens " +
                                           std::to_string(admission_.max_queued_tokens) + ")");
  if (admission_.max_queue_time_ms > 0 && rate > 0) {
    const double wait_ms = 1000.0 * queued_tokens / rate;
    if (wait_ms > admission_.max_queue_time_ms)
      return reject("max_queue_time", "server overloaded: the estimated queue wait is " +
                                          std::to_string(static_cast<int64_t>(wait_ms)) +
                                          " ms (--max-queue-time-ms " +
                                          std::to_string(admission_.max_queue_time_ms) + ")");
  }
  for (EngineRequest& request : requests) {
    if (admission_.max_queue_time_ms > 0)
      request.queue_deadline =
          std::min(request.queue_deadline,
                   request.arrival + std::chrono::milliseconds(admission_.max_queue_time_ms));
    auto handle = std::make_shared<RequestHandle>(std::move(request.notify));
    request.notify = nullptr;
    r.handles.push_back(handle);
    inbox_.push_back({std::move(request), std::move(handle)});
  }
  inbox_tokens_ += tokens;
  lock.unlock();
  cv_.notify_one();
  return r;
}

void AsyncEngine::Drain() { draining_.store(true); }

bool AsyncEngine::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [&] {
    return inbox_.empty() && published_.running == 0 && published_.queued_requests == 0;
  });
}

void AsyncEngine::Stop() {
  std::lock_guard<std::mutex> join_lock(stop_mu_);  // two callers: one joins
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncEngine::CheckIntegrity(std::chrono::milliseconds timeout,
                                 std::function<void(Status)> done) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || stopped_) {
      refused = Unavailable("the engine is shutting down; no integrity check was run");
    } else if (integrity_done_) {
      refused = Unavailable("an integrity check is already pending; retry when it has answered");
    } else {
      integrity_done_ = std::move(done);
      integrity_deadline_ = std::chrono::steady_clock::now() + timeout;
    }
  }
  if (!refused.ok()) {
    done(refused);
    return;
  }
  cv_.notify_all();
}

Status AsyncEngine::CheckIntegrityWhenIdle(std::chrono::milliseconds timeout) {
  // The promise's shared state outlives whichever side finishes last.
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> f = result->get_future();
  CheckIntegrity(timeout, [result](Status st) { result->set_value(std::move(st)); });
  return f.get();
}

// Engine thread. Idle: run the pending check. Busy: give up on it once its
// deadline has passed. The callback runs outside mu_.
void AsyncEngine::AnswerIntegrity(bool idle) {
  std::function<void(Status)> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!integrity_done_) return;
    idle = idle && inbox_.empty();  // requests on their way in: not idle yet
    if (!idle && std::chrono::steady_clock::now() < integrity_deadline_) return;
    done = std::move(integrity_done_);
    integrity_done_ = nullptr;
  }
  Status st;
  if (idle) {
    st = engine_->CheckIntegrity();
    // Unavailable means "busy, retry" to callers; a violation is never that.
    if (st.code() == StatusCode::kUnavailable) st = Internal(st.message());
  } else {
    st = Unavailable(
        "the engine did not become idle within the integrity check's timeout; retry later");
  }
  done(std::move(st));
}

void AsyncEngine::Publish() {
  const EngineLoad l = engine_->load();
  const EngineStats& st = engine_->stats();
  // Prefill rate: tokens over time of steps that carried prompt tokens.
  const int64_t dtok = st.prefill_tokens - last_stats_.prefill_tokens;
  const double dsec = (st.prefill_seconds + st.mixed_seconds) -
                      (last_stats_.prefill_seconds + last_stats_.mixed_seconds);
  if (dtok > 0 && dsec > 0) {
    const double now_rate = dtok / dsec;
    prefill_rate_ = prefill_rate_ > 0 ? 0.8 * prefill_rate_ + 0.2 * now_rate : now_rate;
  }
  if (prompt_tokens_ && dtok > 0) prompt_tokens_->Inc(static_cast<double>(dtok));
  if (generation_tokens_) {
    const int64_t gen = st.generated_tokens - last_stats_.generated_tokens;
    if (gen > 0) generation_tokens_->Inc(static_cast<double>(gen));
  }
  if (preemptions_ && st.preemptions > last_stats_.preemptions)
    preemptions_->Inc(static_cast<double>(st.preemptions - last_stats_.preemptions));
  if (headroom_waits_ && st.headroom_waits > last_stats_.headroom_waits)
    headroom_waits_->Inc(static_cast<double>(st.headroom_waits - last_stats_.headroom_waits));
  if (engine_->prefix_cache()) {
    // Every tier counts: a host or storage hit is copied back, not recomputed.
    int64_t hits = engine_->prefix_cache()->stats().hit_tokens;
    if (const HiCache* hc = engine_->hicache()) {
      const HiCacheStats hs = hc->stats();
      hits += hs.hit_tokens_host + hs.hit_tokens_storage;
    }
    if (prefix_hit_tokens_ && hits > last_hit_tokens_)
      prefix_hit_tokens_->Inc(static_cast<double>(hits - last_hit_tokens_));
    last_hit_tokens_ = hits;
  }
  last_stats_ = st;
  PublishHiCache();
  if (kv_used_) {
    kv_used_->Get({"active"}).Set(static_cast<double>(l.pages_active));
    kv_used_->Get({"cached"}).Set(static_cast<double>(l.pages_cached));
  }
  if (const WindowBacking* w = engine_->pool().window_backing(); kv_window_ && w) {
    kv_window_->Get({"backed"}).Set(static_cast<double>(w->num_slots() - w->num_free_slots()));
    kv_window_->Get({"free"}).Set(static_cast<double>(w->num_free_slots()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  published_.running = l.running;
  published_.queued_requests = l.waiting;
  published_.queued_tokens = l.waiting_tokens;
  published_.pages_total = l.pages_total;
  published_.pages_active = l.pages_active;
  published_.pages_cached = l.pages_cached;
  published_.prefill_tokens_per_second = prefill_rate_;
}

void AsyncEngine::Loop() {
  std::vector<Pending> batch;
  for (;;) {
    if (!engine_->HasWork()) AnswerIntegrity(/*idle=*/true);
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: wake for new requests, stop, or an integrity check. Busy:
      // take whatever arrived without waiting.
      if (!engine_->HasWork()) {
        idle_cv_.notify_all();
        cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || integrity_done_; });
      }
      if (stop_) break;
      // What leaves the inbox stays counted as queued until Publish() below
      // recounts it from the engine: otherwise a Submit in between sees a
      // queue shorter by the whole batch and admits past the limit.
      published_.queued_requests += static_cast<int64_t>(inbox_.size());
      published_.queued_tokens += inbox_tokens_;
      batch.swap(inbox_);
      inbox_tokens_ = 0;
    }
    for (Pending& p : batch) engine_->Add(std::move(p.request), std::move(p.handle));
    batch.clear();
    // The queue counters must include what just moved from the inbox into
    // the engine before the next admission decision.
    Publish();
    if (engine_->HasWork()) {
      Status st = engine_->Step();
      if (!st.ok()) STRATA_LOG(ERROR) << "engine step failed: " << st.ToString();
      Publish();
      AnswerIntegrity(/*idle=*/false);
    }
  }
  engine_->AbortAll(FinishReason::kAbort,
                    Unavailable("the server stopped before this request finished"));
  std::function<void(Status)> integrity;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Pending& p : inbox_)
      p.handle->Finish(FinishReason::kAbort,
                       Unavailable("the server stopped before this request started"));
    inbox_.clear();
    inbox_tokens_ = 0;
    published_ = EngineSnapshot{};
    stopped_ = true;
    integrity = std::move(integrity_done_);
    integrity_done_ = nullptr;
  }
  idle_cv_.notify_all();
  if (integrity) integrity(Unavailable("the server is shutting down; no integrity check was run"));
}

}  // namespace strata
