#include "cli/cli.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"

namespace strata::cli {
namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args&);
};

constexpr Command kCommands[] = {
    {"serve", "OpenAI-compatible server with continuous batching and admission control",
     &ServeCommand},
    {"router", "route requests to serve workers or PD pairs: policies, health, retries, limits",
     &RouterCommand},
    {"check", "check a deployment file (or serve flags) against the models and this machine",
     &CheckCommand},
    {"launch", "run and supervise the services of a deployment file", &LaunchCommand},
    {"status", "the services of a running `strata launch`: state, restarts, last error",
     &StatusCommand},
    {"systemd", "write systemd units for a deployment file", &SystemdCommand},
    {"generate", "offline generation from a prompt, token ids or a chat message", &GenerateCommand},
    {"demo-model", "write the embedded demo model (real Hugging Face format) to a directory",
     &DemoModelCommand},
    {"bench", "benchmarks: `strata bench engine` (prefill/decode tokens/s)", &BenchCommand},
};

void PrintUsage(std::FILE* out) {
  std::fprintf(out,
               "strata %s — LLM serving engine\n\n"
               "usage: strata <command> [flags]     (strata <command> --help for its flags)\n\n"
               "commands:\n",
               STRATA_VERSION);
  for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "\n  --version    print the version\n");
}

}  // namespace

int Main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::printf("strata %s\n", STRATA_VERSION);
    return kExitOk;
  }
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    PrintUsage(stdout);
    return kExitOk;
  }
  Args args(argv + 2, argv + argc);
  for (const Command& c : kCommands)
    if (cmd == c.name) return c.run(args);
  std::fprintf(stderr, "strata: unknown command '%s'\n\n", cmd.c_str());
  PrintUsage(stderr);
  return kExitUsage;
}

}  // namespace strata::cli
