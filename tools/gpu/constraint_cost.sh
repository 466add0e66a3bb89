#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/constraint_cost.sh):
# what a JSON-schema constraint adds to a CUDA decode step, end to end
# (`strata bench engine --json-schema`, issue 11's goal: < 5% of the step),
# on the smallest step there is: the Qwen2.5-0.5B shape with Qwen3's real
# 151,936-token vocabulary (random bf16 weights). One line per case and run:
#   cold        the first schema a process sees, nothing walked before
#   prewarmed   the same, after the startup prewarm `strata serve` does
#   fragments   a new schema whose string fragments are known
#   warm        the schema's masks cached
# Knobs: SCHEMA (default tools/bench/person_schema.json), ROUNDS (2),
# SHAPE (qwen2.5-0.5b). Table to $OUT/constraint_cost.txt.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
SHAPE=${SHAPE:-qwen2.5-0.5b}
M=/tmp/cc-$SHAPE
[ -d $M ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --no-gguf \
  --tokenizer-dir "$PWD/qwen3-tokenizer" --out $M > /dev/null
schema=${SCHEMA:-$R/tools/bench/person_schema.json}
: > "$OUT/constraint_cost.jsonl"
for round in $(seq ${ROUNDS:-2}); do
  for c in cold prewarmed fragments warm; do
    flag=()
    case $c in
      prewarmed) flag=(--constraint-prewarmed) ;;
      fragments) flag=(--constraint-fragments-warm) ;;
      warm) flag=(--constraint-warm) ;;
    esac
    j=$(timeout 120 ./strata bench engine --device cuda --matmul-precision bf16 --model-path $M \
      --prompt-len 512 --gen-len 256 --repeats 5 --json-schema "$schema" "${flag[@]}" --json \
      2> /tmp/cc.err | tail -1)
    echo "$c $j" >> "$OUT/constraint_cost.jsonl"
  done
done
python3 - "$OUT/constraint_cost.jsonl" <<'PY' | tee "$OUT/constraint_cost.txt"
import json, sys, collections
r = collections.defaultdict(list)
step = []
for line in open(sys.argv[1]):
    case, j = line.split(" ", 1)
    try:
        d = json.loads(j)
        r[case].append(100 * d["constraint_step_cost"])
        step.append(1000.0 / d["decode_tok_s"] if d.get("decode_tok_s") else float("nan"))
    except Exception:
        r[case].append(float("nan"))
print("| case | added per decode step (goal < 5%) |")
print("| --- | --- |")
for case in ("cold", "prewarmed", "fragments", "warm"):
    print(f"| {case} | {', '.join(f'+{x:.1f}%' for x in r[case])} |")
if step:
    print(f"(plain decode step, ms: {min(step):.3f}..{max(step):.3f})")
PY
