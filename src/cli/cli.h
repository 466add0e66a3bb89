// `strata` command line: subcommand dispatch. Each subcommand lives in its
// own file (cli/cmd_<name>.cc) and registers a CommandSpec here.
#pragma once

namespace strata::cli {

// Exit codes (sysexits.h), shared by every subcommand.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 64;   // bad command line
constexpr int kExitData = 65;    // bad input data (a corrupt model file)
constexpr int kExitNoInput = 66; // a file that should exist does not
constexpr int kExitConfig = 78;  // invalid configuration: supervisors must not restart

int Main(int argc, char** argv);

}  // namespace strata::cli
