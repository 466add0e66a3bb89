#include "cli/cli.h"

#include <cstdio>
#include <cstring>

namespace strata::cli {

int Main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("strata %s\n", STRATA_VERSION);
    return kExitOk;
  }
  std::fprintf(stderr, "usage: strata <command> [flags]\n");
  return kExitUsage;
}

}  // namespace strata::cli
