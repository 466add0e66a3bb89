// AsyncEngine: the engine on its own thread, fed by I/O threads.
//
//   I/O thread:  Submit() -> validate, admission control -> inbox  (never blocks on the engine)
//   engine thread: inbox -> Engine::Add; loop Engine::Step(); publish load
//   I/O thread:  RequestHandle notifier -> Take() -> detokenize -> socket
//
// Admission control (the fix for the incident that motivated Strata): a
// request is refused at once, before any engine work, when admitting it
// would exceed --max-queued-requests, --max-queued-tokens (prompt tokens
// waiting for prefill), or when its estimated queue wait (queued prompt
// tokens / measured prefill rate) exceeds --max-queue-time-ms. A refusal
// names the limit and carries a Retry-After estimated from the drain rate.
// Admitted requests that still end up waiting past the queue-time limit fail
// with Unavailable before prefill starts, rather than being served late.
// The choices of one HTTP request are admitted together (SubmitAll): all or
// none, judged as a whole; a group that exceeds a limit on its own (more
// requests than running slots + queue, more prompt tokens than the token
// limit) can never be admitted and is refused as InvalidArgument, not as a
// retryable Unavailable.
//
// Integrity checks (CheckIntegrity) run on the engine thread when it is next
// idle, one at a time; the caller gets a callback, never a blocked thread.
//
// Ownership: the engine thread is the only thread AsyncEngine starts; Stop()
// (and the destructor) joins it, aborts every request, and answers a pending
// integrity check with "shutting down". No other thread may be inside a
// method of this object when it is destroyed.
// Thread-safety: every public method is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "metrics/metrics.h"

namespace strata {

struct AdmissionOptions {
  int64_t max_queued_requests = 0;  // 0: no limit
  int64_t max_queued_tokens = 0;    // 0: no limit
  int64_t max_queue_time_ms = 0;    // 0: no limit
};

struct SubmitResult {
  std::shared_ptr<RequestHandle> handle;  // Submit: set when admitted
  // SubmitAll: one handle per request, in order, when admitted (all or none).
  std::vector<std::shared_ptr<RequestHandle>> handles;
  // InvalidArgument: a bad request (limit empty), or one that exceeds an
  // admission limit on its own and can never be admitted (limit set).
  // Unavailable: shed now, waiting could help (limit set; or "draining").
  Status status;
  std::string limit;               // "max_queued_requests", "max_queued_tokens", "max_queue_time",
                                   // or "draining"
  double retry_after_seconds = 0;  // for Unavailable
  size_t failed_request = 0;       // SubmitAll, InvalidArgument without limit: which request
};

// What the server may know about the engine while it runs: fixed before the
// engine thread starts, never changed (so readable from any thread without
// touching engine-thread state).
struct EngineFacts {
  int64_t context_length = 0;  // longest prompt + output, in tokens
  int32_t max_running_requests = 0;
  int32_t page_size = 0;
  int64_t pages_total = 0;
};

// A consistent-enough view for gauges, /health and admission (published by
// the engine thread after every step).
struct EngineSnapshot {
  int64_t running = 0;
  int64_t queued_requests = 0;  // submitted, prefill not started
  int64_t queued_tokens = 0;
  int64_t pages_total = 0;
  int64_t pages_active = 0;
  int64_t pages_cached = 0;
  double prefill_tokens_per_second = 0;  // recent, 0 until measured
};

class AsyncEngine {
 public:
  // Starts the engine thread. `registry` (optional) receives the engine's
  // metrics (queue, KV pages, token counters, queue-time histogram) and
  // must outlive the AsyncEngine (the engine thread writes into it).
  static StatusOr<std::unique_ptr<AsyncEngine>> Start(std::unique_ptr<Engine> engine,
                                                      const AdmissionOptions& admission,
                                                      metrics::Registry* registry);
  ~AsyncEngine();  // Stop()

  SubmitResult Submit(EngineRequest request);
  // Admits every request or none (e.g. the n choices of each prompt of one
  // HTTP request): the admission limits judge the group as a whole.
  SubmitResult SubmitAll(std::vector<EngineRequest> requests);

  // Stops admitting (Submit returns Unavailable "draining"); running and
  // queued requests continue.
  void Drain();
  bool draining() const { return draining_.load(); }
  // Blocks until no request is queued or running (or timeout); true if idle.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Aborts everything still in flight and joins the engine thread.
  void Stop();

  EngineSnapshot snapshot() const;
  const EngineFacts& facts() const { return facts_; }

  // Runs Engine::CheckIntegrity on the engine thread when it is next idle,
  // then calls `done` exactly once with the result:
  //   OkStatus, or Internal naming the first violated invariant;
  //   Unavailable at once (on the calling thread) if a check is already
  //     pending — one at a time;
  //   Unavailable if the engine was not idle within `timeout` (checked after
  //     every step);
  //   Unavailable "shutting down" if the engine stops first.
  // Except for the first case `done` runs on the engine thread: it must be
  // quick and must not call back into this object.
  void CheckIntegrity(std::chrono::milliseconds timeout, std::function<void(Status)> done);
  // Blocking form of CheckIntegrity (tests, tools).
  Status CheckIntegrityWhenIdle(std::chrono::milliseconds timeout);

 private:
  AsyncEngine(std::unique_ptr<Engine> engine, const AdmissionOptions& admission);
  void Loop();
  void Publish();
  void AnswerIntegrity(bool idle);  // engine thread
  void RegisterMetrics(metrics::Registry& r);

  std::unique_ptr<Engine> engine_;
  AdmissionOptions admission_;
  std::thread thread_;

  std::mutex stop_mu_;  // serialises Stop()
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable idle_cv_;  // wakes WaitIdle
  struct Pending {
    EngineRequest request;
    std::shared_ptr<RequestHandle> handle;
  };
  std::vector<Pending> inbox_;  // guarded by mu_
  int64_t inbox_tokens_ = 0;    // guarded by mu_
  EngineSnapshot published_;    // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  bool stopped_ = false;        // guarded by mu_: the engine thread has finished
  // The pending integrity check (at most one); guarded by mu_.
  std::function<void(Status)> integrity_done_;
  std::chrono::steady_clock::time_point integrity_deadline_;
  std::atomic<bool> draining_{false};
  EngineFacts facts_;  // immutable after Start

  // Metrics (owned by the registry); null when none.
  metrics::Counter* prompt_tokens_ = nullptr;
  metrics::Counter* generation_tokens_ = nullptr;
  metrics::Counter* prefix_hit_tokens_ = nullptr;
  metrics::Counter* preemptions_ = nullptr;
  metrics::Counter* headroom_waits_ = nullptr;
  metrics::Family<metrics::Gauge>* kv_used_ = nullptr;
  metrics::Family<metrics::Gauge>* kv_window_ = nullptr;
  // HiCache (registered only when it is on): strata_hicache_* families, and
  // the stats they were last brought up to.
  struct HiCacheMetrics {
    metrics::Family<metrics::Gauge>* host_pages = nullptr;
    metrics::Gauge* storage_bytes = nullptr;
    metrics::Family<metrics::Counter>* hit_tokens = nullptr;
    metrics::Family<metrics::Counter>* load_back_tokens = nullptr;
    metrics::Family<metrics::Counter>* backup_tokens = nullptr;
    metrics::Family<metrics::Counter>* evicted_tokens = nullptr;
    metrics::Family<metrics::Counter>* storage_errors = nullptr;
    metrics::Histogram* load_back_seconds = nullptr;
    std::vector<std::string> groups;
    HiCacheStats last;
  };
  std::unique_ptr<HiCacheMetrics> hicache_metrics_;
  void RegisterHiCacheMetrics(metrics::Registry& r);
  void PublishHiCache();
  EngineStats last_stats_;
  int64_t last_hit_tokens_ = 0;
  double prefill_rate_ = 0;  // engine thread: EMA of prefill tokens/s
};

}  // namespace strata
