#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/decode_table.sh):
# issue 10's decode throughput table on the goal shape (Llama-3.1-8B, tiled
# random bf16 weights): `strata bench engine --device cuda --batch B` for
# B in $BATCHES (default 1 8 32 128), prompts of $PROMPT_LEN (512) and
# $GEN_LEN (128) generated tokens each, bf16 KV; then (unless SKIP_PREFILL)
# the bf16 GEMM peak (torch) and the prefill of each of $PREFILL_LENS
# tokens (default 2048) once plain and once under
# STRATA_CUDA_OP_TIMING=gated for its per-op table. JSON lines and the op
# tables go to $OUT. EXTRA_ARGS go to every bench (e.g. --decode-graphs=false);
# AB_BATCHES (default 1 8) are measured again with --decode-graphs=false.
# The device-to-device copy bandwidth is measured first: batch-1 decode is
# quoted against it (weight bytes per step / copy bandwidth).
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 copy_bandwidth.py | tee "$OUT/copy_bw.txt"
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.1-8b}
dir=/dev/shm/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > "$OUT/model.json"
common="bench engine --device cuda --matmul-precision bf16 --model-path $dir --json ${EXTRA_ARGS:-}"
run_batch() {  # batch, file tag, extra args
  echo "== batch $1 $3"
  timeout 180 ./strata $common --batch $1 --prompt-len ${PROMPT_LEN:-512} --gen-len ${GEN_LEN:-128} \
    --repeats ${REPEATS:-2} $3 2> "/tmp/batch_$1$2.err" | tail -1 | tee "$OUT/batch_$1$2.json" ||
    tail -5 "/tmp/batch_$1$2.err"
}
for b in ${BATCHES:-1 8 32 128}; do run_batch $b "" ""; done
for b in ${AB_BATCHES-1 8}; do run_batch $b _eager --decode-graphs=false; done
python3 - "$OUT" ${BATCHES:-1 8 32 128} <<'PY'
import json, os, sys
out = sys.argv[1]
bw = float(open(f"{out}/copy_bw.txt").read().split()[1]) * 1e12
print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
print("| batch | decode tok/s | step ms | tok/s per sequence | weight bytes per step / copy bw | op by op (--decode-graphs=false) |")
print("| --- | --- | --- | --- | --- | --- |")
for b in sys.argv[2:]:
    try:
        j = json.load(open(f"{out}/batch_{b}.json"))
    except Exception as e:
        print(f"| {b} | failed: {e} | | | | |"); continue
    frac = j["weight_bytes"] * j["decode_tok_s"] / int(b) / bw
    eager = ""
    if os.path.exists(f"{out}/batch_{b}_eager.json"):
        e = json.load(open(f"{out}/batch_{b}_eager.json"))
        eager = f"{e['decode_tok_s']:.1f} tok/s, {e['decode_step_ms']:.3f} ms"
    print(f"| {b} | {j['decode_tok_s']:.1f} | {j['decode_step_ms']:.3f} | {j['decode_tok_s'] / int(b):.1f} | {frac:.3f} | {eager} |")
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
