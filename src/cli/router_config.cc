#include "cli/router_config.h"

#include <algorithm>

namespace strata::cli {

FlagSet MakeRouterFlagSet(RouterConfig* c) {
  router::RouterOptions& o = c->o;
  RouterConfig& rf = *c;
  FlagSet f("router",
            "Routes OpenAI requests to `strata serve` workers: colocated ones (--worker) or PD "
            "pairs (--prefill and --decode), with health checks, circuit breakers, retries and "
            "its own admission limits.");
  f.String("host", &rf.host, "address to listen on");
  f.Int("port", &rf.port, "TCP port (0: any free port, printed at startup)", 0, 65535);
  f.StringList("worker", &o.workers, "a colocated worker, http://HOST:PORT");
  f.StringList("prefill", &o.prefills,
               "a prefill server, http://HOST:PORT (its bootstrap port is read from its "
               "/server_info)");
  f.StringList("decode", &o.decodes, "a decode server, http://HOST:PORT");
  f.String("policy", &o.policy.name,
           "round_robin, random, least_load or cache_aware (SGLang router's default)");
  f.String("prefill-policy", &o.prefill_policy, "PD: the policy for prefills (default: --policy)");
  f.String("decode-policy", &o.decode_policy, "PD: the policy for decodes (default: --policy)");
  f.Int("balance-abs-threshold", &o.policy.balance_abs_threshold,
        "cache_aware: leave the prefix's worker when its load exceeds the least loaded's by more "
        "than this (and by --balance-rel-threshold)",
        0, int64_t{1} << 30);
  f.Double("balance-rel-threshold", &o.policy.balance_rel_threshold,
           "cache_aware: ... and is more than this many times it", 1, 1e6);
  f.Int("max-tree-size", &rf.max_tree_size,
        "cache_aware: most prompt-prefix blocks remembered (least recently used dropped)", 1,
        int64_t{1} << 32);
  f.Int("max-concurrent-requests", &o.admission.max_concurrent_requests,
        "generation requests the router has at workers at once (0: no limit)", 0, int64_t{1} << 30);
  f.Int("max-queued-requests", &o.admission.max_queued_requests,
        "requests waiting for a slot beyond --max-concurrent-requests; past it 503 + Retry-After",
        0, int64_t{1} << 30);
  f.Int("max-queue-time-ms", &rf.max_queue_time_ms,
        "a queued request waiting longer gets 503 + Retry-After (0: no limit)", 0,
        int64_t{1} << 40);
  f.Int("health-check-interval-ms", &rf.health_check_interval_ms,
        "GET /health (and /load) of every worker this often", 10, int64_t{1} << 30);
  f.Int("health-check-timeout-ms", &rf.health_check_timeout_ms,
        "a check not answered within this fails", 10, int64_t{1} << 30);
  f.Int("health-failure-threshold", &o.health_failure_threshold,
        "failed checks in a row that take a worker out", 1, 1000);
  f.Int("health-success-threshold", &o.health_success_threshold,
        "passed checks in a row that bring it back", 1, 1000);
  f.Int("retry-max-retries", &o.max_retries,
        "times a request is sent again, to another worker, after a 503 or a connection failure "
        "(only before any byte reached the client)",
        0, 100);
  f.Bool("disable-retries", &rf.disable_retries, "never retry (--retry-max-retries 0)");
  f.Int("cb-failure-threshold", &o.breaker.failure_threshold,
        "failed requests in a row that open a worker's circuit breaker", 1, 1'000'000);
  f.Int("cb-success-threshold", &o.breaker.success_threshold,
        "successful trial requests that close it again", 1, 1'000'000);
  f.Int("cb-timeout-duration-ms", &rf.cb_timeout_duration_ms,
        "how long an open breaker keeps the worker out before a trial request", 1,
        int64_t{1} << 40);
  f.Bool("disable-circuit-breaker", &rf.disable_circuit_breaker, "no circuit breakers");
  f.Int("request-timeout-ms", &rf.request_timeout_ms,
        "one upstream request, from connecting to its last byte", 1, int64_t{1} << 40);
  f.Int("connect-timeout-ms", &rf.connect_timeout_ms, "connecting to a worker", 1,
        int64_t{1} << 30);
  f.String("api-key", &o.api_key,
           "require 'Authorization: Bearer KEY' on /v1/* and /workers (the client's "
           "Authorization header is forwarded to the workers either way)");
  f.Int("io-threads", &rf.io_threads, "HTTP I/O threads of the front end", 1, 64);
  f.Int("max-request-body-bytes", &rf.max_request_body_bytes, "larger request bodies get 413", 1024,
        int64_t{1} << 32);
  f.Int("drain-timeout-s", &rf.drain_timeout_s,
        "SIGTERM: time in-flight requests get before they are cut off", 0, 86400);
  f.Bool("verbose", &rf.verbose, "log every request (its X-Request-Id, worker, time)");
  f.RejectEmptyStrings();
  return f;
}

Status ResolveRouterConfig(const FlagSet& f, RouterConfig* c) {
  router::RouterOptions& o = c->o;
  RouterConfig& rf = *c;
  o.max_queue_time = std::chrono::milliseconds(rf.max_queue_time_ms);
  o.health_check_interval = std::chrono::milliseconds(rf.health_check_interval_ms);
  o.health_check_timeout = std::chrono::milliseconds(rf.health_check_timeout_ms);
  o.request_timeout = std::chrono::milliseconds(rf.request_timeout_ms);
  o.connect_timeout = std::chrono::milliseconds(rf.connect_timeout_ms);
  o.breaker.open_duration = std::chrono::milliseconds(rf.cb_timeout_duration_ms);
  o.breaker.enabled = !rf.disable_circuit_breaker;
  if (rf.disable_retries) o.max_retries = 0;
  o.policy.max_entries = static_cast<size_t>(rf.max_tree_size);
  // No concurrency limit means nothing ever queues: the queue's default is moot.
  if (o.admission.max_concurrent_requests == 0 && !f.IsSet("max-queued-requests"))
    o.admission.max_queued_requests = 0;
  if (!f.IsSet("health-check-timeout-ms"))
    o.health_check_timeout = std::min(o.health_check_timeout, o.health_check_interval);
  return router::ValidateRouterOptions(o);
}

}  // namespace strata::cli
