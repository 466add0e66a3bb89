#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/decode_table.sh):
# issue 10's decode throughput table on the goal shape (Llama-3.1-8B, tiled
# random bf16 weights): `strata bench engine --device cuda --batch B` for
# B in $BATCHES (default 1 8 32 128), prompts of $PROMPT_LEN (512) and
# $GEN_LEN (128) generated tokens each, bf16 KV; then (unless SKIP_PREFILL)
# the bf16 GEMM peak (torch) and the prefill of each of $PREFILL_LENS
# tokens (default 2048) once plain and once under
# STRATA_CUDA_OP_TIMING=gated for its per-op table. JSON lines and the op
# tables go to $OUT.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.1-8b}
dir=/dev/shm/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > "$OUT/model.json"
common="bench engine --device cuda --matmul-precision bf16 --model-path $dir --json"
for b in ${BATCHES:-1 8 32 128}; do
  echo "== batch $b"
  timeout 180 ./strata $common --batch $b --prompt-len ${PROMPT_LEN:-512} --gen-len ${GEN_LEN:-128} \
    --repeats ${REPEATS:-2} 2> "$OUT/batch_$b.err" | tail -1 | tee "$OUT/batch_$b.json" ||
    tail -5 "$OUT/batch_$b.err"
done
python3 - "$OUT" ${BATCHES:-1 8 32 128} <<'PY'
import json, sys
out = sys.argv[1]
print("| batch | decode tok/s | step ms | tok/s per sequence |")
print("| --- | --- | --- | --- |")
for b in sys.argv[2:]:
    try:
        j = json.load(open(f"{out}/batch_{b}.json"))
    except Exception as e:
        print(f"| {b} | failed: {e} | | |"); continue
    print(f"| {b} | {j['decode_tok_s']:.1f} | {j['decode_step_ms']:.3f} | {j['decode_tok_s'] / int(b):.1f} |")
PY
[ -n "${SKIP_PREFILL:-}" ] && exit 0
echo "== bf16 GEMM peak (torch.matmul 8192^3, best of 20)"
python3 gemm_peak.py | tee "$OUT/gemm_peak.txt"
for n in ${PREFILL_LENS:-2048}; do
  echo "== prefill $n, plain then per-op (gated)"
  ./strata $common --prompt-len $n --gen-len 1 --repeats 3 2>/dev/null | tail -1 | tee "$OUT/prefill_$n.json"
  STRATA_CUDA_OP_TIMING=gated ./strata $common --prompt-len $n --gen-len 1 --repeats 2 \
    2> "$OUT/prefill_${n}_ops.txt" | tail -1 > /dev/null
  cat "$OUT/prefill_${n}_ops.txt" | head -60
done
