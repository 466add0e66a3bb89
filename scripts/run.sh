#!/usr/bin/env bash
# Quick start, part 1: install what is needed, build, and run the server on
# the embedded demo model (http://127.0.0.1:8000, OpenAI-compatible). Extra
# arguments go to `strata serve`, e.g. --model-path DIR --port 8080.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF
exec build/strata serve "$@"
