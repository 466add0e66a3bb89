// The subcommands of `strata`. Each takes its arguments after the command
// name and returns a process exit code (cli.h).
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

using Args = std::vector<std::string>;

int ServeCommand(const Args& args);
int RouterCommand(const Args& args);  // strata router (cmd_router.cc)
int GenerateCommand(const Args& args);
int DemoModelCommand(const Args& args);
int BenchCommand(const Args& args);
int CheckCommand(const Args& args);       // strata check (cmd_check.cc)
int SystemdCommand(const Args& args);     // strata systemd (cmd_systemd.cc)
int LaunchCommand(const Args& args);      // strata launch (cmd_launch.cc)
int StatusCommand(const Args& args);      // strata status (cmd_status.cc)
int BenchServeCommand(const Args& args);  // strata bench serve (cmd_bench_serve.cc)

}  // namespace strata::cli
