#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/attention_ab.sh):
# decode throughput of strata variants side by side on the same GPU, the
# Llama-3.1-8B shape (tiled random bf16 weights, bf16 KV): for each batch B in
# $BATCHES (default "1 64 256") `strata bench engine --device cuda --batch B
# --prompt-len $PROMPT_LEN (1024) --gen-len $GEN_LEN (64)`, each variant in
# turn, $ROUNDS (2) times. A variant is LABEL:BINARY[:ENV=VALUE], e.g.
# VARIANTS="old:strata_old new:strata tuned:strata:STRATA_GEMM_AUTOTUNE=1"
# (default "old:strata_old new:strata"; stage a binary of the base commit as
# strata_old). The first variant is the base of the ratios. One table to
# $OUT/attention_ab.txt.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.1-8b}
dir=/dev/shm/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > /dev/null
variants=${VARIANTS:-old:strata_old new:strata}
for round in $(seq ${ROUNDS:-2}); do
  for b in ${BATCHES:-1 64 256}; do
    for v in $variants; do
      IFS=: read -r label bin envs <<< "$v"
      [ -x ./$bin ] || continue
      j=$(env $envs timeout 200 ./$bin bench engine --device cuda --matmul-precision bf16 \
        --model-path $dir --json --batch $b --prompt-len ${PROMPT_LEN:-1024} \
        --gen-len ${GEN_LEN:-64} --repeats 1 2> /tmp/ab.err | tail -1)
      echo "$label $b $j" >> "$OUT/attention_ab.jsonl"
    done
  done
done
python3 - "$OUT/attention_ab.jsonl" $variants <<'PY' | tee "$OUT/attention_ab.txt"
import json, sys, collections
labels = [v.split(":")[0] for v in sys.argv[2:]]
r = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, b, j = line.split(" ", 2)
    try:
        r[(int(b), label)].append(json.loads(j)["decode_tok_s"])
    except Exception:
        r[(int(b), label)].append(float("nan"))
print("| batch | " + " | ".join(f"{l} decode tok/s" for l in labels) + " | "
      + " | ".join(f"{l} / {labels[0]}" for l in labels[1:]) + " |")
print("|" + " --- |" * (1 + 2 * len(labels) - 1))
for b in sorted({k[0] for k in r}):
    cells = [" / ".join(f"{x:.1f}" for x in r.get((b, l), [])) for l in labels]
    base = r.get((b, labels[0]), [])
    ratios = []
    for l in labels[1:]:
        n = r.get((b, l), [])
        ratios.append(f"{max(n) / max(base):.3f}" if n and base else "nan")
    print(f"| {b} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
PY
