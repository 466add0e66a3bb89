#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/profile_decode.sh):
# where a batch-1 decode step's time goes. Runs `strata bench engine
# --device cuda` on the Llama-3.2-1B shape (SHAPE=llama-3.1-8b: issue 10's
# goal shape, tiled random weights) at a short context three times:
# plain (bench_noprof.json), with STRATA_CUDA_OP_TIMING=1 (per-op GPU time
# from cudaEvent pairs, including waits for launches: op_timing.txt) and with
# STRATA_CUDA_OP_TIMING=gated (each step queued behind a gate, so op times
# are device time alone: op_timing_gated.txt); plain wall minus the gated
# span per step is what launches and the host cost. Then, where the image
# has Nsight Systems, its CUDA API, kernel and memcpy summaries.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.2-1b}
dir=/tmp/l1b
[ "$SHAPE" = llama-3.2-1b ] || dir=/tmp/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > /dev/null
args="bench engine --device cuda --matmul-precision ${PRECISION:-bf16} --model-path $dir --prompt-len ${PROMPT_LEN:-16} --gen-len ${GEN_LEN:-64} --repeats 1 --json"
./strata $args 2>&1 | tail -1 | tee "$OUT/bench_noprof.json"
for mode in 1 gated; do
  f=$OUT/op_timing$([ $mode = gated ] && echo _gated).txt
  STRATA_CUDA_OP_TIMING=$mode ./strata $args 2> "$f" | tail -1 | tee "${f%.txt}.json"
  cat "$f"
done
[ -n "$NSYS" ] || exit 0
"$NSYS" profile -o /tmp/prof --force-overwrite true --trace cuda,osrt --sample none ./strata $args > "$OUT/nsys_run.log" 2>&1
"$NSYS" stats --report cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,osrt_sum \
  --format csv --output "$OUT/prof" /tmp/prof.nsys-rep > "$OUT/nsys_stats.log" 2>&1
ls "$OUT"
