#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/profile_attention.sh):
# what bounds the tensor-core attention kernel in a long prefill. Runs
# `strata bench engine --device cuda` on the Llama-3.1-8B shape (tiled
# random bf16 weights) with a $PROMPT_LEN-token prompt (default 8192) under
# Nsight Compute, profiling $COUNT (default 1) launches of MmaAttentionKernel
# after skipping $SKIP (default 8), with the speed-of-light, occupancy,
# warp-state and memory-workload sections: whether the kernel waits on
# memory, on barriers or on the tensor pipe. GEN_LEN and EXTRA_ARGS (e.g.
# "--batch 64") reach bench engine: with GEN_LEN > 1 and SKIP past the
# prefill's 32 launches, a batched decode step's launches are profiled. Report text to $OUT/ncu_attention.txt.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu on this machine"; exit 1; fi
echo "ncu: $NCU"
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.1-8b}
dir=/dev/shm/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > /dev/null
timeout ${TIMEOUT:-400} "$NCU" --kernel-name regex:MmaAttentionKernel --launch-skip ${SKIP:-8} \
  --launch-count ${COUNT:-1} --section SpeedOfLight --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats \
  ${EXTRA_SECTIONS:-} \
  ./strata bench engine --device cuda --matmul-precision bf16 --model-path $dir \
  --prompt-len ${PROMPT_LEN:-8192} --gen-len ${GEN_LEN:-1} --repeats 1 ${EXTRA_ARGS:-} \
  > "$OUT/ncu_attention.txt" 2>&1
echo "ncu exit $?"
grep -v "^\[strata" "$OUT/ncu_attention.txt" | grep -E -v "^\s*$|^    -+" | head -${LINES_SHOWN:-150}
