// The configuration of `strata router`: every flag's value (RouterConfig),
// their registration (MakeRouterFlagSet) and their resolution into
// router::RouterOptions with ValidateRouterOptions (ResolveRouterConfig).
// `strata router` and a deployment file's command = "router" services
// (cli/deploy_config.h) both go through these, so a command line moves into
// a file unchanged.
//
// Plain values and free functions; thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "router/router.h"
#include "util/flags.h"
#include "util/status.h"

namespace strata::cli {

struct RouterConfig {
  router::RouterOptions o;
  // Flags kept in their command-line units until ResolveRouterConfig.

  std::string host = "127.0.0.1";
  int64_t port = 30000;
  int64_t io_threads = 2;
  int64_t max_request_body_bytes = 32 << 20;
  int64_t max_queue_time_ms = 60'000;
  int64_t health_check_interval_ms = 2'000;
  int64_t health_check_timeout_ms = 2'000;
  int64_t request_timeout_ms = 1'800'000;
  int64_t connect_timeout_ms = 3'000;
  int64_t cb_timeout_duration_ms = 60'000;
  int64_t max_tree_size = 1 << 20;
  int64_t drain_timeout_s = 30;
  bool disable_retries = false;
  bool disable_circuit_breaker = false;
  bool verbose = false;
};

// Registers every router flag bound to `config` (defaults: its initial values).
FlagSet MakeRouterFlagSet(RouterConfig* config);

// After Parse: milliseconds into durations, the flags that imply others, then
// router::ValidateRouterOptions. InvalidArgument naming the flag.
Status ResolveRouterConfig(const FlagSet& flags, RouterConfig* config);

}  // namespace strata::cli
