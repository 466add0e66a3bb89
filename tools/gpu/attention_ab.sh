#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/attention_ab.sh):
# decode throughput of two strata binaries side by side on the same GPU, the
# Llama-3.1-8B shape (tiled random bf16 weights, bf16 KV): for each batch B in
# $BATCHES (default "1 64 256") `strata bench engine --device cuda --batch B
# --prompt-len $PROMPT_LEN (1024) --gen-len $GEN_LEN (64)`, first with
# ./strata_old (stage a binary of the base commit there), then ./strata,
# alternating, $ROUNDS (2) times. One table to $OUT/attention_ab.txt.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.1-8b}
dir=/dev/shm/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > /dev/null
for round in $(seq ${ROUNDS:-2}); do
  for b in ${BATCHES:-1 64 256}; do
    for bin in strata_old strata; do
      [ -x ./$bin ] || continue
      j=$(timeout 200 ./$bin bench engine --device cuda --matmul-precision bf16 --model-path $dir \
        --json --batch $b --prompt-len ${PROMPT_LEN:-1024} --gen-len ${GEN_LEN:-64} --repeats 1 \
        2> /tmp/ab.err | tail -1)
      echo "$bin $b $j" >> "$OUT/attention_ab.jsonl"
    done
  done
done
python3 - "$OUT/attention_ab.jsonl" <<'PY' | tee "$OUT/attention_ab.txt"
import json, sys, collections
r = collections.defaultdict(list)
for line in open(sys.argv[1]):
    bin_, b, j = line.split(" ", 2)
    try:
        r[(int(b), bin_)].append(json.loads(j)["decode_tok_s"])
    except Exception:
        r[(int(b), bin_)].append(float("nan"))
print("| batch | old decode tok/s | new decode tok/s | new / old |")
print("| --- | --- | --- | --- |")
for b in sorted({k[0] for k in r}):
    o, n = r.get((b, "strata_old"), []), r.get((b, "strata"), [])
    ratio = max(n) / max(o) if o and n else float("nan")
    print(f"| {b} | {' / '.join(f'{x:.1f}' for x in o)} | {' / '.join(f'{x:.1f}' for x in n)} | {ratio:.3f} |")
PY
