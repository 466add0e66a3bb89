#!/usr/bin/env bash
# CPU engine vs llama.cpp: prefill and decode tokens/s of Strata and of
# llama.cpp (npm prebuilt, via node-llama-cpp) on the same random-weight bf16
# models of real shapes, same threads, runs alternated (ABBA order per round)
# so that machine drift hits both; each run sits next to a memory read
# bandwidth measurement, the batch-1 decode roofline. Prints a markdown table.
#
#   tools/bench/cpu_vs_llamacpp.sh [--shapes "qwen2.5-0.5b llama-3.2-1b"]
#       [--threads "1 2"] [--rounds 2] [--repeats 1] [--prompt-len 512]
#       [--gen-len 64] [--precisions "fp32 bf16"] [--models-dir /tmp/strata-bench-models]
#       [--build-dir build-bench] [--skip-build]
#
# Strata runs once per --precisions entry (its --matmul-precision: fp32 is the
# exact default; bf16 rounds activations to bf16 and uses AMX for prefill, the
# same arithmetic as llama.cpp's BF16 matmuls, which round activations too;
# default "fp32 bf16" where the CPU has AVX512_BF16, else "fp32").
# Each engine process warms up on a short request, then times --repeats runs
# (best kept); the table shows medians over --rounds.
#
# Needs: cmake, ninja, a C++ compiler, node + npm, /usr/bin/python3 with numpy
# (Debian python3-numpy; installed with apt-get when missing, as root) to write
# the models once (~1 GB + ~2.5 GB, each twice: safetensors and GGUF). The
# npm lock records every optional platform package, also those the registry
# here lacks, so `npm ci` accepts it. Defaults take ~15 minutes on 2 cores.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
MODELS="/tmp/strata-bench-models"
SHAPES="qwen2.5-0.5b llama-3.2-1b"
THREADS="1 2"
ROUNDS=2
REPEATS=1
PRECISIONS=""
PROMPT=512
GEN=64
SKIP_BUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shapes) SHAPES="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --precisions) PRECISIONS="$2"; shift 2 ;;
    --prompt-len) PROMPT="$2"; shift 2 ;;
    --gen-len) GEN="$2"; shift 2 ;;
    --models-dir) MODELS="$2"; shift 2 ;;
    --build-dir) BUILD="$(realpath -m "$2")"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "cpu_vs_llamacpp.sh: unknown flag '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# Strata's bf16 matmul needs AVX512_BF16 (the backend refuses it otherwise):
# by default run it only where the CPU has it.
if [[ -z $PRECISIONS ]]; then
  PRECISIONS="fp32"
  grep -qw avx512_bf16 /proc/cpuinfo && PRECISIONS="fp32 bf16"
fi

STRATA="$BUILD/strata"
LLAMA_DIR="$ROOT/tools/bench/llama_cpp"
mkdir -p "$MODELS"
LOG="$MODELS/bench.log"
: >"$LOG"

# make_shape_model.py needs numpy in the system python (Debian's python3-numpy);
# a fresh machine lacks it, so install it here rather than fail halfway.
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    echo "cpu_vs_llamacpp.sh: /usr/bin/python3 has no numpy; install it (Debian: apt-get install python3-numpy) and rerun" >&2
    exit 1
  fi
  echo "installing python3-numpy (apt) for make_shape_model.py" >&2
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-numpy; } >>"$LOG" 2>&1 ||
    { echo "cpu_vs_llamacpp.sh: apt-get install python3-numpy failed; see $LOG" >&2; exit 1; }
fi

if [[ $SKIP_BUILD == 0 ]]; then
  echo "building strata (Release) in $BUILD" >&2
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF >>"$LOG"
  ninja -C "$BUILD" strata >>"$LOG"
fi
if [[ ! -d "$LLAMA_DIR/node_modules/node-llama-cpp" ]]; then
  echo "installing node-llama-cpp (prebuilt llama.cpp) in $LLAMA_DIR" >&2
  (cd "$LLAMA_DIR" && npm ci --omit=optional --ignore-scripts >>"$LOG")
fi

# The models share the demo model's byte-level BPE tokenizer (ids < 1024);
# the prompts are random ids below that in both engines.
TOK="$MODELS/demo-tokenizer"
[[ -f "$TOK/tokenizer.json" ]] || "$STRATA" demo-model --out "$TOK" >>"$LOG"
VOCAB_HI=1024
for shape in $SHAPES; do
  if [[ ! -f "$MODELS/$shape/model-bf16.gguf" || ! -f "$MODELS/$shape/model.safetensors" ]]; then
    echo "writing the $shape model (random bf16 weights) to $MODELS/$shape" >&2
    /usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --shape "$shape" \
      --tokenizer-dir "$TOK" --out "$MODELS/$shape" >>"$LOG"
  fi
done

RESULTS="$MODELS/results-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
TREE="$(git -C "$ROOT" describe --always --dirty)"  # what the strata binary was built from
TIMES="$MODELS/time.txt"
loadavg() { cut -d' ' -f1 /proc/loadavg; }
# CPU seconds the last timed process got per wall second per thread: near 1
# means it ran uncontended (or spun); well below 1 means others took the cores.
cpu_share() { awk -v t="$1" '{ if ($3 > 0) printf "%.2f", ($1 + $2) / ($3 * t); else print 0 }' "$TIMES"; }
json_field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
weight_bytes() {  # bf16 weight bytes from the safetensors header: what decode reads per token
  /usr/bin/python3 - "$1/model.safetensors" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
print(sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__"))
EOF
}

run_strata() {  # shape threads round precision
  local la out
  la=$(loadavg)
  out=$(/usr/bin/time -o "$TIMES" -f "%U %S %e" "$STRATA" bench engine --model-path "$MODELS/$1" --threads "$2" --prompt-len "$PROMPT" \
        --gen-len "$GEN" --repeats "$REPEATS" --matmul-precision "$4" --json 2>>"$LOG")
  echo "$out" >>"$LOG"
  printf '{"shape":"%s","threads":%s,"round":%s,"engine":"strata %s matmul","prefill_tok_s":%s,"decode_tok_s":%s,"bw_gb_s":%s,"weight_bytes":%s,"loadavg":%s,"cpu_share":%s}\n' \
    "$1" "$2" "$3" "$4" "$(json_field prefill_tok_s <<<"$out")" "$(json_field decode_tok_s <<<"$out")" \
    "$(json_field read_bandwidth_gb_s <<<"$out")" "$WB" "$la" "$(cpu_share "$2")" >>"$RESULTS"
}

run_llama() {  # shape threads round; bandwidth right before and after, best kept (as Strata does)
  local la out bw1 bw2
  la=$(loadavg)
  bw1=$("$STRATA" bench bandwidth --threads "$2" --json | json_field read_bandwidth_gb_s)
  out=$(/usr/bin/time -o "$TIMES" -f "%U %S %e" node "$LLAMA_DIR/bench.mjs" --model "$MODELS/$1/model-bf16.gguf" --threads "$2" \
        --prompt-len "$PROMPT" --gen-len "$GEN" --repeats "$REPEATS" --vocab-hi "$VOCAB_HI" 2>>"$LOG")
  bw2=$("$STRATA" bench bandwidth --threads "$2" --json | json_field read_bandwidth_gb_s)
  echo "$out" >>"$LOG"
  printf '{"shape":"%s","threads":%s,"round":%s,"engine":"llama.cpp","prefill_tok_s":%s,"decode_tok_s":%s,"bw_gb_s":%s,"weight_bytes":%s,"loadavg":%s,"cpu_share":%s}\n' \
    "$1" "$2" "$3" "$(json_field prefill_tok_s <<<"$out")" "$(json_field decode_tok_s <<<"$out")" \
    "$(/usr/bin/python3 -c "print(max($bw1, $bw2))")" "$WB" "$la" "$(cpu_share "$2")" >>"$RESULTS"
}

for shape in $SHAPES; do
  WB=$(weight_bytes "$MODELS/$shape")
  for t in $THREADS; do
    for ((r = 1; r <= ROUNDS; r++)); do
      echo "$shape threads=$t round $r/$ROUNDS (load $(loadavg))" >&2
      if ((r % 2)); then
        for p in $PRECISIONS; do run_strata "$shape" "$t" "$r" "$p"; done
        run_llama "$shape" "$t" "$r"
      else
        run_llama "$shape" "$t" "$r"
        for p in $PRECISIONS; do run_strata "$shape" "$t" "$r" "$p"; done
      fi
    done
  done
done

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus; $(date -u +%FT%TZ); results: $RESULTS"
echo "strata $TREE; prompt $PROMPT tokens, decode $GEN tokens, best of $REPEATS per run after a warm-up, median of $ROUNDS rounds"
echo
/usr/bin/python3 "$ROOT/tools/bench/bench_table.py" "$RESULTS"
