#!/bin/bash
# Runs on the GPU machine (staged by tools/gpu/stage.sh as .cudarun/decode_kernels.sh):
# the device time of every kernel of one batch-1 decode step, each kernel
# alone. Nsight Compute times each launch of `strata bench engine --device
# cuda` (the Llama-3.1-8B shape, tiled random bf16 weights, a $PROMPT_LEN-
# token prompt, default 512, then $GEN_LEN=4 tokens) with the one metric
# gpu__time_duration (one pass a kernel; caches and clocks left as they are),
# and the last forward (from its Embedding kernel on) is summed per kernel
# name: count, total us, mean us. Without launch gaps or timing events
# between ops, this is what the step's kernels cost on the device; the
# step's wall time minus it is launch and host cost. Table to
# $OUT/decode_kernels.txt, raw CSV not kept.
source "$(dirname "$0")/common.sh"  # cd, R, OUT, library paths
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then echo "no ncu on this machine"; exit 1; fi
./strata generate --prompt hi --max-tokens 1 > /dev/null 2>&1  # writes the demo model (tokenizer source)
SHAPE=${SHAPE:-llama-3.1-8b}
dir=/dev/shm/$SHAPE
[ -d $dir ] || python3 "$R/tools/bench/make_shape_model.py" --shape "$SHAPE" --fill tiled --no-gguf \
  --tokenizer-dir /root/.cache/strata/demo-model-v0.1.0 --out $dir > /dev/null
timeout ${TIMEOUT:-300} "$NCU" --metrics gpu__time_duration.sum --csv --page raw \
  --cache-control none --clock-control none --kernel-name-base function \
  ./strata bench engine --device cuda --matmul-precision bf16 --model-path $dir \
  --prompt-len ${PROMPT_LEN:-512} --gen-len ${GEN_LEN:-4} --repeats 1 ${EXTRA_ARGS:-} \
  > /tmp/decode_kernels.csv 2> /tmp/decode_kernels.err
echo "ncu exit $?"
python3 - /tmp/decode_kernels.csv <<'PY' | tee "$OUT/decode_kernels.txt"
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
r = list(csv.reader(rows))
head = r[0]
ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
body = r[1:]
unit = "nsecond"
if body and not body[0][0].strip().isdigit():  # the units row
    unit, body = body[0][ti], body[1:]
def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None
data = [(x[ki], num(x[ti])) for x in body if num(x[ti]) is not None]
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1e-3)
starts = [i for i, (k, _) in enumerate(data) if "Embedding" in k]
if not starts:
    print("no Embedding kernel found; kernels:", len(data)); sys.exit(0)
step = data[starts[-1]:]
agg = collections.OrderedDict()
for k, t in step:
    c, s = agg.get(k, (0, 0.0))
    agg[k] = (c + 1, s + t * scale)
total = sum(s for _, s in agg.values())
print(f"last forward: {len(step)} kernels, {total:.1f} us of kernel time (ncu, each kernel alone)")
print("| kernel | count | total us | mean us | share |")
print("| --- | --- | --- | --- | --- |")
for k, (c, s) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {k} | {c} | {s:.1f} | {s / c:.2f} | {100 * s / total:.1f}% |")
PY
