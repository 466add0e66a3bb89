#!/usr/bin/env bash
# Installs the Debian packages Strata builds and tests with (docs/dependencies.md
# says why each is there). Idempotent; skips apt entirely when all are present.
set -euo pipefail
build_pkgs=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev libboost1.81-dev libtoml11-dev libucx-dev)
test_pkgs=(libgtest-dev libgmock-dev libbenchmark-dev curl nodejs npm prometheus prometheus-node-exporter systemd ucx-utils)
# tools/bench/cpu_vs_llamacpp.sh: numpy writes the models, git clones the
# llama.cpp release node-llama-cpp ships for the native peer build.
bench_pkgs=(python3-numpy git nodejs npm)
want=("${build_pkgs[@]}")
[ "${1:-}" = "--test" ] && want+=("${test_pkgs[@]}")
[ "${1:-}" = "--bench" ] && want+=("${bench_pkgs[@]}")
missing=()
for p in "${want[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node from elsewhere (e.g. a newer install) satisfies the test's needs too.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
