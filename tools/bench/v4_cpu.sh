#!/usr/bin/env bash
# DeepSeek V4 on the CPU engine against a dense model of as many active
# parameters: prefill and batch-1 decode tokens/s of `strata bench engine` on
# make_shape_model.py's deepseek-v4-scaled (V4-Flash's layer structure,
# scaled; random bf16 weights) and dense-v4-active (Llama layout, same hidden
# size, vocabulary and untied head, as many parameters read per token), in
# the same run, the two alternated (order reversed every other round) so
# machine drift hits both. Prints a markdown table: medians and min-max over
# rounds, active parameters, the V4 / dense ratios, and the decode roofline
# twice: as bench engine reports it (every weight byte once per token, which
# for a MoE counts all experts) and over the bytes a token really reads
# (active parameters x 2).
#
#   tools/bench/v4_cpu.sh [--threads "1 2"] [--rounds 3] [--prompt-len 512]
#       [--gen-len 64] [--precisions "fp32 bf16"] [--models-dir /tmp/strata-v4-bench]
#       [--build-dir build-bench] [--skip-build]
#
# Needs: cmake, ninja, a C++ compiler, /usr/bin/python3 with numpy (installed
# with scripts/deps.sh --bench, as root, when missing) to write the models
# once (~1.1 GB + ~0.5 GB). --precisions takes Strata's --matmul-precision
# values: fp32, the exact default, and bf16 (activations rounded to bf16, AMX
# for prefill), which needs AVX512_BF16; default "fp32 bf16" where the CPU
# has it, else "fp32". About 8 minutes with the defaults on 2 quiet cores.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
MODELS="/tmp/strata-v4-bench"
THREADS="1 2"
ROUNDS=3
PROMPT=512
GEN=64
PRECISIONS=""
SKIP_BUILD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --prompt-len) PROMPT="$2"; shift 2 ;;
    --gen-len) GEN="$2"; shift 2 ;;
    --precisions) PRECISIONS="$2"; shift 2 ;;
    --models-dir) MODELS="$2"; shift 2 ;;
    --build-dir) BUILD="$(realpath -m "$2")"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "v4_cpu.sh: unknown flag '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z $PRECISIONS ]]; then
  PRECISIONS="fp32"
  grep -qw avx512_bf16 /proc/cpuinfo && PRECISIONS="fp32 bf16"
fi
SHAPES="deepseek-v4-scaled dense-v4-active"
STRATA="$BUILD/strata"
mkdir -p "$MODELS"
LOG="$MODELS/bench.log"
: >"$LOG"

if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "installing the benchmark's Debian packages (scripts/deps.sh --bench)" >&2
  "$ROOT/scripts/deps.sh" --bench >>"$LOG" 2>&1 ||
    { echo "v4_cpu.sh: scripts/deps.sh --bench failed (needs root or sudo); see $LOG" >&2; exit 1; }
fi
if [[ $SKIP_BUILD == 0 ]]; then
  echo "building strata (Release) in $BUILD" >&2
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF >>"$LOG"
  ninja -C "$BUILD" strata >>"$LOG"
fi
[[ -x $STRATA ]] || { echo "v4_cpu.sh: no strata binary at $STRATA (drop --skip-build or pass --build-dir)" >&2; exit 1; }

# Both models take the demo model's byte-level BPE tokenizer (ids < 1024,
# padded to the models' vocabulary); bench engine prompts random ids below it.
TOK="$MODELS/demo-tokenizer"
[[ -f "$TOK/tokenizer.json" ]] || "$STRATA" demo-model --out "$TOK" >>"$LOG"
PARAMS="$MODELS/params.jsonl"
: >"$PARAMS"
for shape in $SHAPES; do
  if [[ ! -f "$MODELS/$shape/model.safetensors" ]]; then
    echo "writing the $shape model (random bf16 weights) to $MODELS/$shape" >&2
    /usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --shape "$shape" --no-gguf \
      --tokenizer-dir "$TOK" --out "$MODELS/$shape" >>"$LOG"
  fi
  /usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --params-of "$MODELS/$shape" |
    /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); d["shape"]=sys.argv[1]; print(json.dumps(d))' "$shape" >>"$PARAMS"
done

RESULTS="$MODELS/results-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
TREE="$(git -C "$ROOT" describe --always --dirty)"  # what the strata binary was built from
TIMES="$MODELS/time.txt"
run() {  # shape threads round precision: one bench engine process, one JSON line
  local la out
  la=$(cut -d' ' -f1 /proc/loadavg)
  out=$(/usr/bin/time -o "$TIMES" -f "%U %S %e" "$STRATA" bench engine --model-path "$MODELS/$1" \
        --threads "$2" --prompt-len "$PROMPT" --gen-len "$GEN" --repeats 1 \
        --matmul-precision "$4" --json 2>>"$LOG")
  echo "$out" >>"$LOG"
  /usr/bin/python3 - "$1" "$2" "$3" "$4" "$la" "$TIMES" "$out" >>"$RESULTS" <<'EOF'
import json, sys
shape, threads, rnd, prec, la, times, out = sys.argv[1:]
u, s, e = (float(x) for x in open(times).read().split()[-3:])
r = json.loads(out)
r.update(shape=shape, round=int(rnd), precision=prec, loadavg=float(la),
         cpu_share=(u + s) / (e * int(threads)) if e > 0 else 0)
print(json.dumps(r))
EOF
}

for t in $THREADS; do
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "threads=$t round $r/$ROUNDS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    order="$SHAPES"
    ((r % 2 == 0)) && order="$(echo "$SHAPES" | tr ' ' '\n' | tac | tr '\n' ' ')"
    for shape in $order; do
      for p in $PRECISIONS; do run "$shape" "$t" "$r" "$p"; done
    done
  done
done

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cpus, SIMD: $(grep -m1 -ow -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '); $(date -u +%FT%TZ); results: $RESULTS"
echo "strata $TREE; prompt $PROMPT tokens, decode $GEN tokens, 1 timed run per process after a warm-up; median [min-max] of $ROUNDS rounds"
echo
/usr/bin/python3 - "$PARAMS" "$RESULTS" <<'EOF'
import json, statistics, sys
params = {d["shape"]: d for d in map(json.loads, open(sys.argv[1]))}
runs = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
groups = {}
for r in runs:
    groups.setdefault((r["threads"], r["precision"]), {}).setdefault(r["shape"], []).append(r)

def spread(xs, fmt):
    m = statistics.median(xs)
    return (fmt % m) + (f" [{fmt % min(xs)}-{fmt % max(xs)}]" if len(xs) > 1 else ""), m

print("| model | threads | matmul | params | active params | prefill tok/s | decode tok/s "
      "| V4 / dense (prefill, decode) | read bw GB/s | roofline, all weights tok/s "
      "| roofline, active weights tok/s | decode / active roofline | load avg | CPU share |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for (threads, prec), by_shape in sorted(groups.items()):
    med = {}
    for shape, rs in by_shape.items():
        med[shape] = {k: statistics.median(r[k] for r in rs) for k in ("prefill_tok_s", "decode_tok_s")}
    for shape, rs in by_shape.items():
        p = params[shape]
        pre, _ = spread([r["prefill_tok_s"] for r in rs], "%.1f")
        dec, d = spread([r["decode_tok_s"] for r in rs], "%.2f")
        bw = statistics.median(r["read_bandwidth_gb_s"] for r in rs)
        roof_all = statistics.median(r["decode_roofline_tok_s"] for r in rs)
        roof_act = bw * 1e9 / (2 * p["active_params"])
        ratio = "—"
        if shape.startswith("deepseek") and "dense-v4-active" in med:
            dn = med["dense-v4-active"]
            ratio = "%.2f×, %.2f×" % (med[shape]["prefill_tok_s"] / dn["prefill_tok_s"],
                                      med[shape]["decode_tok_s"] / dn["decode_tok_s"])
        la = [r["loadavg"] for r in rs]
        cs = [r["cpu_share"] for r in rs]
        print(f"| {shape} | {threads} | {prec} | {p['params'] / 1e6:.1f} M | {p['active_params'] / 1e6:.1f} M "
              f"| {pre} | {dec} | {ratio} | {bw:.1f} | {roof_all:.2f} | {roof_act:.2f} | {d / roof_act:.2f} "
              f"| {min(la):.1f}–{max(la):.1f} | {statistics.median(cs):.2f} |")
EOF
