#!/usr/bin/env bash
# Makes (once) and prints the directory of a natively compiled llama.cpp:
# node-llama-cpp 3.22.1 installed from this folder's lock file into its own
# directory, then `node-llama-cpp source download --gpu false`, its own
# source-build command, which clones the llama.cpp release the package ships
# as llama/gitRelease.bundle (no network beyond npm) and compiles it with
# cmake with GGML_NATIVE=ON (-march=native), CPU backend only.
#
#   dir=$(tools/bench/llama_cpp/native.sh [--log FILE])
#
# The build sits in ${XDG_CACHE_HOME:-~/.cache}/strata-bench/, keyed by the
# CPU's model name and flags (a -march=native binary only runs where it was
# built), so reruns and fresh clones on the same machine skip it. It is kept
# apart from the prebuilt install next to this file because node-llama-cpp
# loads a local build in preference to the prebuilt whenever one exists.
# Needs cmake, a C++ compiler, git and npm; ~15 min on 2 busy cores (nice 19).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG=/dev/stderr
[[ "${1:-}" == "--log" ]] && LOG="$2"
for tool in cmake g++ git npm; do
  command -v "$tool" >/dev/null ||
    { echo "native.sh: '$tool' not found; install it (Debian: scripts/deps.sh --bench) and rerun" >&2; exit 1; }
done
KEY=$({ grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo; } | sha256sum | cut -c1-12)
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/strata-bench/llama-native-3.22.1-$KEY"
if [[ ! -f "$DIR/built" ]]; then
  echo "native.sh: building llama.cpp natively in $DIR (once per CPU; ~15 min, nice 19)" >&2
  rm -rf "$DIR"
  mkdir -p "$DIR"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$DIR/"
  (cd "$DIR" && npm ci --omit=optional --ignore-scripts) >>"$LOG" 2>&1 ||
    { echo "native.sh: npm ci in $DIR failed; see $LOG" >&2; exit 1; }
  (cd "$DIR" && nice -n 19 npx --no node-llama-cpp source download --gpu false --noUsageExample) >>"$LOG" 2>&1 ||
    { echo "native.sh: node-llama-cpp source download failed in $DIR; see $LOG" >&2; exit 1; }
  grep -qs 'GGML_NATIVE:BOOL=ON' "$DIR"/node_modules/node-llama-cpp/llama/localBuilds/*/CMakeCache.txt ||
    { echo "native.sh: the build in $DIR is not GGML_NATIVE; see $LOG" >&2; exit 1; }
  date -u +%FT%TZ >"$DIR/built"
fi
echo "$DIR"
