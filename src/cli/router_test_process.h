// Test helper: a `strata router` child process on an ephemeral port, with its
// stderr in a log file (as serve_test_process.h does for `strata serve`).
// REQUIRES: STRATA_BINARY defined by the build.
#pragma once

#include "cli/serve_test_process.h"

namespace strata::http_test {

// `strata router --port 0 ARGS...`.
class RouterProcess : public StrataProcess {
 public:
  explicit RouterProcess(const std::vector<std::string>& args)
      : StrataProcess("router", {"--port", "0"}, args, "routing on http://[^ ]+:(\\d+)",
                      std::chrono::seconds(30)) {}
};

}  // namespace strata::http_test
