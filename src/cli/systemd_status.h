// `strata status` for a deployment that systemd runs (the units `strata
// systemd` writes: strata-<service>.service): each unit's state, pid,
// restarts, uptime, last exit code and the last error line of its journal,
// in the launcher's shape (ServiceStatus, so one printer and one --json for
// both). The facts come from `systemctl show` and `journalctl`, run through
// CommandRunner so tests feed canned output (no systemd runs as PID 1 on the
// build machines).
//
// State from systemd's (ActiveState, SubState, Result, last exit):
//   active                                -> running
//   activating + SubState auto-restart    -> backoff (waiting for RestartSec=)
//   activating otherwise                  -> starting
//   failed + Result start-limit-hit       -> crashloop (StartLimitBurst= reached)
//   failed or inactive after exit code 78 -> config-error (RestartPreventExitStatus=78)
//   anything else (inactive, failed, deactivating) -> stopped
//
// Thread-safety: pure functions; a CommandRunner is used by one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli/supervisor.h"
#include "util/status.h"

namespace strata::cli {

// Runs a program (PATH search) and returns its standard output; an error
// names the command and its exit status when it does not exit 0.
class CommandRunner {
 public:
  virtual ~CommandRunner() = default;
  virtual StatusOr<std::string> Run(const std::vector<std::string>& argv) = 0;
};
std::unique_ptr<CommandRunner> MakeProcessRunner();

// True when systemd is PID 1 (its runtime directory /run/systemd/system
// exists: sd_booted(3)'s test).
bool SystemdIsPid1();

// The properties ParseSystemctlShow reads, for `systemctl show -p`.
inline constexpr const char* kSystemctlProperties =
    "Id,ActiveState,SubState,Result,MainPID,NRestarts,ExecMainCode,ExecMainStatus,"
    "ExecMainStartTimestamp,ExecStart";

// Parses `systemctl show --timestamp=unix -p <kSystemctlProperties> UNIT…`
// (blocks of KEY=VALUE separated by empty lines) into one status per
// strata-*.service unit, in order: name without "strata-" and ".service",
// host and port from the unit's `--host=`/`--port=` (serve's defaults when
// absent), role from `--disaggregation-mode=` (colocated when absent or
// null; "router" for `strata router`). `now_unix` gives the uptime. Blocks of
// other units are skipped. last_error and log_tail are left empty.
std::vector<ServiceStatus> ParseSystemctlShow(std::string_view out, double now_unix);

// Every strata-*.service unit systemd has loaded: `systemctl show` for the
// facts, then the service's own last 20 lines of its journal (`journalctl
// -u UNIT -o json`, without systemd's lines about the unit, which come from
// PID 1) for log_tail and last_error (a journal it cannot read leaves them
// empty). An error when systemctl fails; an empty list when no unit matches.
StatusOr<std::vector<ServiceStatus>> SystemdServices(CommandRunner& run, double now_unix);

}  // namespace strata::cli
