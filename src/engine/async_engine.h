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
//
// Thread-safety: Submit, Drain, load and metrics accessors are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
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
  std::shared_ptr<RequestHandle> handle;  // set when admitted
  Status status;       // InvalidArgument (bad request) or Unavailable (shed / draining)
  std::string limit;   // for Unavailable: "max_queued_requests", "max_queued_tokens",
                       // "max_queue_time", or "draining"
  double retry_after_seconds = 0;
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
  // metrics (queue, KV pages, token counters, queue-time histogram).
  static StatusOr<std::unique_ptr<AsyncEngine>> Start(std::unique_ptr<Engine> engine,
                                                      const AdmissionOptions& admission,
                                                      metrics::Registry* registry);
  ~AsyncEngine();  // Stop()

  SubmitResult Submit(EngineRequest request);

  // Stops admitting (Submit returns Unavailable "draining"); running and
  // queued requests continue.
  void Drain();
  bool draining() const { return draining_.load(); }
  // Blocks until no request is queued or running (or timeout); true if idle.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Aborts everything still in flight and joins the engine thread.
  void Stop();

  EngineSnapshot snapshot() const;
  const Engine& engine() const { return *engine_; }  // engine-thread state: read only when stopped
  // Runs Engine::CheckIntegrity on the engine thread when it is next idle
  // and returns the result (for tests and /health?debug).
  Status CheckIntegrityWhenIdle(std::chrono::milliseconds timeout);

 private:
  AsyncEngine(std::unique_ptr<Engine> engine, const AdmissionOptions& admission);
  void Loop();
  void Publish();
  void RegisterMetrics(metrics::Registry& r);

  std::unique_ptr<Engine> engine_;
  AdmissionOptions admission_;
  std::thread thread_;

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
  bool integrity_requested_ = false;  // guarded by mu_
  bool integrity_done_ = false;       // guarded by mu_
  Status integrity_;                  // guarded by mu_
  std::atomic<bool> draining_{false};

  // Metrics (owned by the registry); null when none.
  metrics::Counter* prompt_tokens_ = nullptr;
  metrics::Counter* generation_tokens_ = nullptr;
  metrics::Counter* prefix_hit_tokens_ = nullptr;
  metrics::Counter* preemptions_ = nullptr;
  metrics::Family<metrics::Gauge>* kv_used_ = nullptr;
  EngineStats last_stats_;
  int64_t last_hit_tokens_ = 0;
  double prefill_rate_ = 0;  // engine thread: EMA of prefill tokens/s
};

}  // namespace strata
