#!/usr/bin/env bash
# CPU engine vs llama.cpp: prefill and decode tokens/s of Strata and of
# llama.cpp on the same random-weight bf16 models of real shapes, same
# threads, runs alternated (order reversed every other round) so that machine
# drift hits all; each run sits next to a memory read bandwidth measurement,
# the batch-1 decode roofline. Prints a markdown table.
#
#   tools/bench/cpu_vs_llamacpp.sh [--shapes "qwen2.5-0.5b llama-3.2-1b"]
#       [--threads "1 2"] [--rounds 2] [--repeats 1] [--prompt-len 512]
#       [--gen-len 64] [--precisions "fp32 bf16"] [--peers "native prebuilt"]
#       [--models-dir /tmp/strata-bench-models] [--build-dir build-bench] [--skip-build]
#
# Two llama.cpp peers, both node-llama-cpp 3.22.1 (tools/bench/llama_cpp/):
# "prebuilt", the npm package's CPU libraries, and "native", the same
# release compiled here with -march=native by the package's own source-build
# command (llama_cpp/native.sh; ~15 min once per CPU, cached in ~/.cache).
# Before timing, check_gguf_parity.sh checks that each peer and Strata agree
# on greedy tokens of the GGUF/safetensors twins.
#
# Strata runs once per --precisions entry (its --matmul-precision: fp32 is the
# exact default; bf16 rounds activations to bf16 and uses AMX for prefill, the
# same arithmetic as llama.cpp's BF16 matmuls, which round activations too;
# default "fp32 bf16" where the CPU has AVX512_BF16, else "fp32").
# Each engine process warms up on a short request, then times --repeats runs
# (best kept); the table shows medians over --rounds.
#
# Needs: cmake, ninja, a C++ compiler, git, node + npm, /usr/bin/python3 with
# numpy (Debian python3-numpy; the missing ones of these are installed with
# scripts/deps.sh --bench, as root) to write the models once (~1 GB + ~2.5 GB,
# each twice: safetensors and GGUF). The npm lock records every optional
# platform package, also those the registry here lacks, so `npm ci` accepts
# it. Defaults take ~25 minutes on 2 quiet cores, plus the native build once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
MODELS="/tmp/strata-bench-models"
SHAPES="qwen2.5-0.5b llama-3.2-1b"
THREADS="1 2"
ROUNDS=2
REPEATS=1
PRECISIONS=""
PEERS="native prebuilt"
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
    --peers) PEERS="$2"; shift 2 ;;
    --prompt-len) PROMPT="$2"; shift 2 ;;
    --gen-len) GEN="$2"; shift 2 ;;
    --models-dir) MODELS="$2"; shift 2 ;;
    --build-dir) BUILD="$(realpath -m "$2")"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
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

for p in $PEERS; do
  [[ $p == native || $p == prebuilt ]] ||
    { echo "cpu_vs_llamacpp.sh: unknown peer '$p' in --peers (known: native prebuilt)" >&2; exit 2; }
done

# make_shape_model.py needs numpy in the system python (Debian's
# python3-numpy), the native llama.cpp build git (to clone the bundled
# release); a fresh machine may lack them, so install here rather than fail
# halfway.
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null || ! command -v git >/dev/null; then
  echo "installing the benchmark's Debian packages (scripts/deps.sh --bench)" >&2
  "$ROOT/scripts/deps.sh" --bench >>"$LOG" 2>&1 ||
    { echo "cpu_vs_llamacpp.sh: scripts/deps.sh --bench failed (needs root or sudo); see $LOG" >&2; exit 1; }
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
NATIVE=""
[[ " $PEERS " == *" native "* ]] && NATIVE=$("$LLAMA_DIR/native.sh" --log "$LOG")
PARITY_ARGS=(--build-dir "$BUILD")
[[ -n $NATIVE ]] && PARITY_ARGS+=(--native "$NATIVE")
[[ " $PEERS " == *" prebuilt "* ]] || PARITY_ARGS+=(--no-prebuilt)
echo "checking that the GGUF and safetensors twins agree in every engine (check_gguf_parity.sh)" >&2
"$ROOT/tools/bench/check_gguf_parity.sh" "${PARITY_ARGS[@]}" >&2 ||
  { echo "cpu_vs_llamacpp.sh: Strata and llama.cpp disagree on the same weights; the comparison would not be like-for-like" >&2; exit 1; }

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
  printf '{"shape":"%s","threads":%s,"round":%s,"engine":"strata %s matmul","prefill_tok_s":%s,"decode_tok_s":%s,"prefill_tok_per_cpu_s":%s,"decode_tok_per_cpu_s":%s,"bw_gb_s":%s,"weight_bytes":%s,"loadavg":%s,"cpu_share":%s}\n' \
    "$1" "$2" "$3" "$4" "$(json_field prefill_tok_s <<<"$out")" "$(json_field decode_tok_s <<<"$out")" \
    "$(json_field prefill_tok_per_cpu_s <<<"$out")" "$(json_field decode_tok_per_cpu_s <<<"$out")" \
    "$(json_field read_bandwidth_gb_s <<<"$out")" "$WB" "$la" "$(cpu_share "$2")" >>"$RESULTS"
}

run_llama() {  # shape threads round peer; bandwidth right before and after, best kept (as Strata does)
  local la out bw1 bw2 native=()
  [[ $4 == native ]] && native=(--native "$NATIVE")
  la=$(loadavg)
  bw1=$("$STRATA" bench bandwidth --threads "$2" --json | json_field read_bandwidth_gb_s)
  out=$(/usr/bin/time -o "$TIMES" -f "%U %S %e" node "$LLAMA_DIR/bench.mjs" --model "$MODELS/$1/model-bf16.gguf" --threads "$2" \
        --prompt-len "$PROMPT" --gen-len "$GEN" --repeats "$REPEATS" --vocab-hi "$VOCAB_HI" "${native[@]}" 2>>"$LOG")
  bw2=$("$STRATA" bench bandwidth --threads "$2" --json | json_field read_bandwidth_gb_s)
  echo "$out" >>"$LOG"
  printf '{"shape":"%s","threads":%s,"round":%s,"engine":"llama.cpp %s","prefill_tok_s":%s,"decode_tok_s":%s,"prefill_tok_per_cpu_s":%s,"decode_tok_per_cpu_s":%s,"bw_gb_s":%s,"weight_bytes":%s,"loadavg":%s,"cpu_share":%s}\n' \
    "$1" "$2" "$3" "$4" "$(json_field prefill_tok_s <<<"$out")" "$(json_field decode_tok_s <<<"$out")" \
    "$(json_field prefill_tok_per_cpu_s <<<"$out")" "$(json_field decode_tok_per_cpu_s <<<"$out")" \
    "$(/usr/bin/python3 -c "print(max($bw1, $bw2))")" "$WB" "$la" "$(cpu_share "$2")" >>"$RESULTS"
}

for shape in $SHAPES; do
  WB=$(weight_bytes "$MODELS/$shape")
  for t in $THREADS; do
    for ((r = 1; r <= ROUNDS; r++)); do
      echo "$shape threads=$t round $r/$ROUNDS (load $(loadavg))" >&2
      # Odd rounds: Strata's precisions, then the peers; even rounds reversed.
      runs=()
      for p in $PRECISIONS; do runs+=("strata $p"); done
      for p in $PEERS; do runs+=("llama $p"); done
      if ((r % 2 == 0)); then
        for ((i = 0, j = ${#runs[@]} - 1; i < j; i++, j--)); do
          tmp="${runs[i]}"; runs[i]="${runs[j]}"; runs[j]="$tmp"
        done
      fi
      for run in "${runs[@]}"; do
        read -r kind arg <<<"$run"
        "run_$kind" "$shape" "$t" "$r" "$arg"
      done
    done
  done
done

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cpus, SIMD: $(grep -m1 -ow -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '); $(date -u +%FT%TZ); results: $RESULTS"
echo "strata $TREE; prompt $PROMPT tokens, decode $GEN tokens, best of $REPEATS per run after a warm-up, median of $ROUNDS rounds"
echo
/usr/bin/python3 "$ROOT/tools/bench/bench_table.py" "$RESULTS"
