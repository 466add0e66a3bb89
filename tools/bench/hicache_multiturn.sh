#!/usr/bin/env bash
# HiCache on vs off on a multi-turn workload whose working set is several
# times the device KV pool: the same `strata bench serve --turns` load against
# `strata serve` without and with --enable-hierarchical-cache, alternated
# (off on off on ...) so that machine drift hits both. Prints a markdown
# table: TTFT p50/p99, throughput and the prefix-cache share per run, and the
# working set over the device pool.
#
#   tools/bench/hicache_multiturn.sh [--shape qwen2.5-0.5b|demo] [--rounds 2]
#       [--pool-tokens 3072] [--ratio 8] [--conversations 12] [--turns 4]
#       [--input-len 256] [--output-len 16] [--max-running 2] [--threads 2]
#       [--models-dir /tmp/strata-bench-models] [--build-dir build-bench] [--skip-build]
#
# Every conversation is in flight at once (client concurrency = conversations)
# while the server runs --max-running of them: between two turns of one
# conversation the others' turns pass through the device pool, so the reuse
# distance is the whole working set (conversations x their final length),
# several times the pool.
#
# Needs: cmake, ninja, a C++ compiler, /usr/bin/python3 with numpy (Debian
# python3-numpy) to write the random-weight model of a real shape once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
MODELS="/tmp/strata-bench-models"
SHAPE="qwen2.5-0.5b"
ROUNDS=2
POOL=3072
RATIO=8
CONV=12
TURNS=4
INPUT=256
OUTPUT=16
RUNNING=2
THREADS=2
SKIP_BUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shape) SHAPE="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --pool-tokens) POOL="$2"; shift 2 ;;
    --ratio) RATIO="$2"; shift 2 ;;
    --conversations) CONV="$2"; shift 2 ;;
    --turns) TURNS="$2"; shift 2 ;;
    --input-len) INPUT="$2"; shift 2 ;;
    --output-len) OUTPUT="$2"; shift 2 ;;
    --max-running) RUNNING="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --models-dir) MODELS="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    *) echo "unknown option $1" >&2; exit 64 ;;
  esac
done
LOG="$(mktemp -d)/hicache_bench.log"
echo "log: $LOG" >&2
if [[ $SKIP_BUILD == 0 ]]; then
  command -v cmake >/dev/null && command -v ninja >/dev/null || {
    sudo apt-get install -y cmake ninja-build g++ >>"$LOG" 2>&1 || apt-get install -y cmake ninja-build g++ >>"$LOG" 2>&1; }
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF >>"$LOG"
  ninja -C "$BUILD" strata >>"$LOG"
fi
STRATA="$BUILD/strata"
MODEL_ARGS=()
if [[ $SHAPE != demo ]]; then
  TOK="$MODELS/demo-tokenizer"
  [[ -f "$TOK/tokenizer.json" ]] || "$STRATA" demo-model --out "$TOK" >>"$LOG"
  if [[ ! -f "$MODELS/$SHAPE/model.safetensors" ]]; then
    /usr/bin/python3 -c "import numpy" 2>/dev/null || apt-get install -y python3-numpy >>"$LOG" 2>&1
    /usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --shape "$SHAPE" \
      --tokenizer-dir "$TOK" --out "$MODELS/$SHAPE" >>"$LOG"
  fi
  MODEL_ARGS=(--model-path "$MODELS/$SHAPE")
fi

PORT=18190
run_one() {  # $1 = off|on; prints one table row
  local mode="$1" extra=()
  [[ $mode == on ]] && extra=(--enable-hierarchical-cache --hicache-ratio "$RATIO")
  "$STRATA" serve "${MODEL_ARGS[@]}" --port "$PORT" --threads "$THREADS" --max-total-tokens "$POOL" \
    --kv-cache-dtype bf16 --max-running-requests "$RUNNING" "${extra[@]}" 2>>"$LOG" &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || { echo "server exited; see $LOG" >&2; exit 1; }
    sleep 0.5
  done
  local json
  json="$(mktemp)"
  "$STRATA" bench serve --url "http://127.0.0.1:$PORT" --turns "$TURNS" --num-requests "$CONV" \
    --concurrency "$CONV" --input-len "$INPUT" --output-len "$OUTPUT" --seed 1 --json "$json" >>"$LOG" 2>&1
  local metrics
  metrics="$(curl -s "http://127.0.0.1:$PORT/metrics")"
  kill -TERM $pid
  wait $pid || true
  /usr/bin/python3 - "$json" "$mode" "$POOL" "$metrics" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
mode, pool, metrics = sys.argv[2], int(sys.argv[3]), sys.argv[4]
s = j["summary"]
def metric(name, label):
    tot = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "{") and label in line:
            tot += float(line.rsplit(" ", 1)[1])
    return tot
host = metric("strata_hicache_hit_tokens_total", 'tier="host"')
prompt = s.get("input_tokens", 0)
cached = s.get("cached_tokens", 0)
ttft = s["ttft_ms"]
print(f"| {mode} | {prompt:,} | {prompt / pool:.1f}x | {100.0 * cached / max(prompt, 1):.1f}% | "
      f"{100.0 * host / max(prompt, 1):.1f}% | {s['request_throughput']:.2f} | {s['input_tok_s']:.0f} | "
      f"{ttft['p50']:.0f} / {ttft['p99']:.0f} |")
EOF
  rm -f "$json"
}

echo "| HiCache | prompt tokens | prompt tokens / device pool | cached (all tiers) | from host | req/s | input tok/s | TTFT p50 / p99 ms |"
echo "|---|---|---|---|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
  run_one off
  run_one on
done
