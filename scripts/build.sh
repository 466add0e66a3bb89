#!/usr/bin/env bash
# Configures and builds Strata into build/ (Release-with-debug-info).
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
[ -f build/CMakeCache.txt ] && gen=()
cmake -S . -B build "${gen[@]}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
