#!/usr/bin/env bash
# PD disaggregation end to end (issue 8, item 8), two parts, printed as
# markdown tables:
#
#  1. The overhead at low load: the same `strata bench serve` load (one
#     request at a time) against a colocated `strata serve`, the router in
#     front of that server, and the router in front of a prefill/decode pair
#     (KV pages over UCX), alternated per round. TTFT p50/p99, ITL p50, e2e
#     p50 and the KV bytes the pair moved per request.
#  2. The incident: a burst far above capacity through the router to the
#     PD pair, without admission limits and with them (prefill
#     --max-queued-requests, router --max-concurrent-requests and
#     --max-queued-requests): HTTP status counts, TTFT p50/p99 of the
#     admitted requests, the longest the prefill's queue got (sampled from
#     its /metrics every 100 ms) and the time to drain.
#
#   tools/bench/pd_serve.sh [--shape qwen2.5-0.5b|demo] [--rounds 2] [--requests 20]
#       [--input-len 256] [--output-len 1] [--threads 1] [--burst 300]
#       [--models-dir /tmp/strata-bench-models] [--build-dir build-bench] [--skip-build]
#
# Part 1 runs on --shape (a random-weight model of a real shape, so the KV
# bytes per token are real); part 2 on the embedded demo model (the burst is
# about queues, not compute). Every server gets --threads cores' worth of
# threads; on a 2-core machine the colocated server and the pair's prefill
# compute with the same one thread.
#
# Needs: cmake, ninja, a C++ compiler, libucx-dev (scripts/deps.sh installs
# the build dependencies), /usr/bin/python3 with numpy for --shape.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
MODELS="/tmp/strata-bench-models"
SHAPE="qwen2.5-0.5b"
ROUNDS=2
REQUESTS=20
INPUT=256
OUTPUT=1
THREADS=1
BURST=300
SKIP_BUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shape) SHAPE="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --input-len) INPUT="$2"; shift 2 ;;
    --output-len) OUTPUT="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --burst) BURST="$2"; shift 2 ;;
    --models-dir) MODELS="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    *) echo "unknown option $1" >&2; exit 64 ;;
  esac
done
LOG="$(mktemp -d)/pd_bench.log"
echo "log: $LOG" >&2
if [[ $SKIP_BUILD == 0 ]]; then
  "$ROOT/scripts/deps.sh" >>"$LOG" 2>&1
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

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_up() {  # $1 = port
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "nothing answers on port $1; see $LOG" >&2
  exit 1
}
serve() {  # $1 = port, rest: flags; appends the pid to PIDS
  local port="$1"; shift
  "$STRATA" serve --port "$port" --threads "$THREADS" --kv-cache-dtype bf16 "$@" 2>>"$LOG" &
  PIDS+=($!)
  wait_up "$port"
}
router() {  # $1 = port, rest: flags
  local port="$1"; shift
  "$STRATA" router --port "$port" "$@" 2>>"$LOG" &
  PIDS+=($!)
  wait_up "$port"
}
stop_all() { cleanup; PIDS=(); }
metric() {  # $1 = port, $2 = series prefix: the sum of its values
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" 'index($0, n) == 1 { s += $NF } END { print s + 0 }'
}

# ---- part 1: overhead at low load ------------------------------------------
summary() {  # $1 = json, $2 = label, $3 = KV bytes per request ("-" if none)
  /usr/bin/python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
t, i, e = s["ttft_ms"], s["itl_ms"], s["e2e_ms"]
print(f"| {sys.argv[2]} | {t['p50']:.1f} | {t['p99']:.1f} | {i['p50']:.1f} | {e['p50']:.0f} | {sys.argv[3]} |")
EOF
}
load() {  # $1 = port, $2 = json out
  "$STRATA" bench serve --url "http://127.0.0.1:$1" --num-requests "$REQUESTS" --concurrency 1 \
    --input-len "$INPUT" --output-len "$OUTPUT" --seed 3 --json "$2" >>"$LOG" 2>&1
}
echo "### Overhead at low load ($SHAPE, $INPUT prompt tokens, $OUTPUT output token(s), one request at a time, $REQUESTS per run)"
echo
echo "| path | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | e2e p50 ms | KV bytes per request |"
echo "|---|---|---|---|---|---|"
J="$(mktemp)"
for _ in $(seq "$ROUNDS"); do
  # A fresh server per path: the same prompts must not hit a prefix cache.
  serve 18300 "${MODEL_ARGS[@]}"
  load 18300 "$J"; summary "$J" "colocated, direct" "-"
  stop_all
  serve 18300 "${MODEL_ARGS[@]}"
  router 18301 --worker http://127.0.0.1:18300 --policy round_robin
  load 18301 "$J"; summary "$J" "router -> colocated" "-"
  stop_all
  serve 18310 "${MODEL_ARGS[@]}" --disaggregation-mode prefill --disaggregation-bootstrap-port 18312
  serve 18311 "${MODEL_ARGS[@]}" --disaggregation-mode decode
  router 18313 --prefill http://127.0.0.1:18310 --decode http://127.0.0.1:18311 --policy round_robin
  load 18313 "$J"
  bytes="$(metric 18310 strata_kv_transfer_bytes_total)"
  summary "$J" "router -> PD pair (UCX)" "$(/usr/bin/python3 -c "print(f'{$bytes / $REQUESTS / 2**20:.2f} MiB')")"
  stop_all
done
echo

# ---- part 2: the incident's burst ------------------------------------------
burst() {  # $1 = label, $2 = limits on|off
  local pq=() rl=(--max-concurrent-requests 0)
  if [[ $2 == on ]]; then
    pq=(--max-queued-requests 8 --max-queue-time-ms 5000)
    rl=(--max-concurrent-requests 16 --max-queued-requests 16 --max-queue-time-ms 5000)
  else
    pq=(--max-queued-requests 0)
  fi
  serve 18320 --max-running-requests 8 --disaggregation-mode prefill --disaggregation-bootstrap-port 18322 "${pq[@]}"
  serve 18321 --max-running-requests 64 --disaggregation-mode decode
  router 18323 --prefill http://127.0.0.1:18320 --decode http://127.0.0.1:18321 "${rl[@]}" --disable-retries
  local peak_file; peak_file="$(mktemp)"
  # (requests waiting for their decode's pages are in the same queue)
  ( peak=0; while :; do q="$(metric 18320 strata_queued_requests)"; q=${q%.*}
      ((q > peak)) && peak=$q && echo "$peak" > "$peak_file"; sleep 0.1; done ) &
  local sampler=$!
  local t0; t0=$(date +%s.%N)
  "$STRATA" bench serve --url http://127.0.0.1:18323 --burst "$BURST" --input-len 256 --output-len 16 \
    --seed 5 --timeout-s 600 --json "$J" >>"$LOG" 2>&1
  local t1; t1=$(date +%s.%N)
  kill "$sampler" 2>/dev/null || true
  local active; active="$(curl -s http://127.0.0.1:18320/metrics | awk '/^strata_kv_pages_used.*active/ {s+=$NF} END {print s+0}')/$(curl -s http://127.0.0.1:18321/metrics | awk '/^strata_kv_pages_used.*active/ {s+=$NF} END {print s+0}')"
  /usr/bin/python3 - "$J" "$1" "$(cat "$peak_file" 2>/dev/null || echo 0)" "$t0" "$t1" "$active" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
counts = ", ".join(f"{k}: {v}" for k, v in sorted(s["by_status"].items()))
if s["connection_errors"]: counts += f", connection errors: {s['connection_errors']}"
t = s["ttft_ms"]
print(f"| {sys.argv[2]} | {counts} | {t['p50']:.0f} | {t['p99']:.0f} | {sys.argv[3]} | "
      f"{float(sys.argv[5]) - float(sys.argv[4]):.1f} | {sys.argv[6]} |")
EOF
  stop_all
}
echo "### The incident's burst: $BURST requests at once through the router to a PD pair (demo model, prefill --max-running-requests 8)"
echo
echo "| admission limits | HTTP statuses | TTFT p50 ms (200s) | TTFT p99 ms (200s) | longest prefill queue | seconds to drain | active pages after (prefill/decode) |"
echo "|---|---|---|---|---|---|---|"
burst "none (prefill and router unlimited)" off
burst "prefill queue 8 / 5 s, router 16 + 16 / 5 s" on
