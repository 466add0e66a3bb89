#!/usr/bin/env bash
# Quick start, part 1: install what is needed, build, and run Strata on the
# embedded demo model. Extra arguments go to `strata generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF
if [ $# -eq 0 ]; then
  set -- --chat "Tell me about the sea." --max-tokens 48
fi
exec build/strata generate "$@"
