#!/bin/bash
# Builds tools/cuda_emu/attention_emu.cc against the CUDA headers (no GPU
# needed) with AddressSanitizer + UBSan and with ThreadSanitizer, and runs
# both: PagedAttention's kernels on the host (see the .cc). Minutes on 2 cores.
#   tools/cuda_emu/run.sh [OUT_DIR]        (default /tmp/cuda_emu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$here/../../src
out=${1:-/tmp/cuda_emu}
cuda_inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -I"$src" -I"$cuda_inc" -Wall -Wno-unused-function -Wno-unknown-pragmas)
g++ "${flags[@]}" -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  "$here/attention_emu.cc" -o "$out/attention_emu_asan" -lpthread
g++ "${flags[@]}" -fsanitize=thread "$here/attention_emu.cc" -o "$out/attention_emu_tsan" -lpthread
"$out/attention_emu_asan"
TSAN_OPTIONS=halt_on_error=1 "$out/attention_emu_tsan" small
