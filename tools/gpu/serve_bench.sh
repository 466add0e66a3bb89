#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/serve_bench.sh):
# issue 10's prefill and serving rows on the Llama-3.2-1B shape (SHAPE=llama-3.1-8b:
# the goal shape, tiled random weights in /dev/shm, shared with decode_table.sh).
#   1. the bf16 GEMM peak of this GPU (torch.matmul, 8192^3, best of 20);
#   2. `strata bench engine --device cuda` prefill of 2,048 and 8,192 tokens:
#      effective TFLOP/s = 2 x params x tokens / time, against that peak;
#      HF transformers (sdpa) prefill of the same lengths in the same run;
#   3. `strata serve --device cuda` (default matmul precision: bf16 on a GPU) under `strata bench serve`: N requests
#      (default 1,000) of 1,000 prompt / 1,000 output tokens, C in flight
#      (default 1,000): output tokens/s, TTFT and ITL p50/p99.
# Knobs (environment): N, C, RUNNING (--max-running-requests, default 512),
# KV (--kv-cache-dtype, default bf16: the model's dtype, as SGLang's auto picks),
# CHUNK (--chunked-prefill-size, default 8192), DURATION (bench serve
# --duration-s: start no request after it, default 240), SERVE_ARGS (more `strata serve` flags,
# e.g. "--schedule-conservativeness 0"), TAG (suffix of the result files), SKIP_PREFILL,
# SKIP_SERVE. Results to $OUT.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
TAG=${TAG:-}
N=${N:-1000} C=${C:-1000} RUNNING=${RUNNING:-512} CHUNK=${CHUNK:-8192} DURATION=${DURATION:-240}
KV=${KV:-bf16}
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.2-1b}
M=/tmp/l1b fill=()
[ "$SHAPE" != llama-3.2-1b ] && M=/dev/shm/$SHAPE fill=(--fill tiled --no-gguf)
[ -d $M ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" "${fill[@]}" \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $M > /dev/null
if [ -z "${SKIP_PREFILL:-}" ]; then  # SKIP_PREFILL=1: the serving part only
echo "== bf16 GEMM peak"
python3 gemm_peak.py | tee "$OUT/gemm_peak.txt"
echo "== prefill 2k / 8k"
for p in 2048 8192; do
  ./strata bench engine --device cuda --matmul-precision bf16 --model-path $M --prompt-len $p \
    --gen-len 1 --repeats 3 --json 2>"$OUT/prefill_$p.err" | tail -1 | tee "$OUT/prefill_$p.json"
  python3 "$R/tools/bench/hf_engine.py" --model-path $M --prompt-len $p --gen-len 1 --repeats 3 \
    --attn sdpa 2>"$OUT/hf_prefill_$p.err" | tail -1 | tee "$OUT/hf_prefill_$p.json"
done
fi
[ -n "${SKIP_SERVE:-}" ] && exit 0  # SKIP_SERVE=1: the prefill part only
echo "== serve: $N requests, 1000 in / 1000 out, $C in flight"
port=30123
./strata serve --device cuda --model-path $M --port $port --max-running-requests "$RUNNING" \
  --max-queued-requests 0 --chunked-prefill-size "$CHUNK" --kv-cache-dtype "$KV" ${SERVE_ARGS:-} \
  > "$OUT/serve$TAG.log" 2>&1 &
spid=$!
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  kill -0 $spid 2>/dev/null || break
  sleep 0.5
done
grep -E "KV|pool|GPU memory|listening|matmul" "$OUT/serve$TAG.log" | head -8
./strata bench serve --url "http://127.0.0.1:$port" --num-requests "$N" --concurrency "$C" \
  --input-len 1000 --output-len 1000 --duration-s "$DURATION" --timeout-s 560 \
  --json "$OUT/serve_bench$TAG.json" 2>&1 | tee "$OUT/serve_bench$TAG.txt" | tail -30
curl -s "http://127.0.0.1:$port/metrics" > "$OUT/serve_metrics$TAG.txt"
grep -E "^strata_(preemptions_total|admission_headroom_waits_total)" "$OUT/serve_metrics$TAG.txt"
kill -TERM $spid; wait $spid
echo "serve exit $?"
