#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/profile_decode.sh):
# where a batch-1 decode step's time goes. Profiles `strata bench engine
# --device cuda` on the Llama-3.2-1B shape at a short context with Nsight
# Systems and writes its CUDA API, kernel and memcpy summaries to $OUT.
cd "$(dirname "$0")"
R=$(cd .. && pwd)
OUT=${OUT:-/tmp/strata-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64
export UCX_MODULE_DIR=$PWD/lib/ucx
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
[ -d /tmp/l1b ] || python3 "$R/tools/bench/make_shape_model.py" --shape llama-3.2-1b \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out /tmp/l1b > /dev/null
args="bench engine --device cuda --matmul-precision ${PRECISION:-bf16} --model-path /tmp/l1b --prompt-len ${PROMPT_LEN:-16} --gen-len ${GEN_LEN:-64} --repeats 1 --json"
./strata $args 2>&1 | tail -1 | tee "$OUT/bench_noprof.json"
[ -n "$NSYS" ] || exit 0
"$NSYS" profile -o /tmp/prof --force-overwrite true --trace cuda,osrt --sample none ./strata $args > "$OUT/nsys_run.log" 2>&1
"$NSYS" stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,osrt_sum \
  --format csv --output "$OUT/prof" /tmp/prof.nsys-rep > "$OUT/nsys_stats.log" 2>&1
ls "$OUT"
