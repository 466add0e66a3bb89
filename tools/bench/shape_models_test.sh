#!/usr/bin/env bash
# ctest shape_models: make_shape_model.py's DeepSeek V4 layout is what
# src/model/deepseek_v4.cc loads (every tensor bound, none missing, shapes
# as the config says), and the model runs: deepseek-v4-tiny (the
# deepseek-v4-scaled layout at toy width) through `strata generate`, with a
# prompt past the sliding window and an HCA entry (rate 128), and
# --params-of agrees with what the writer counted.
#   shape_models_test.sh STRATA_BINARY
# Exits 77 (ctest: skipped) where /usr/bin/python3 lacks numpy.
set -euo pipefail
STRATA="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
/usr/bin/python3 -c 'import numpy' 2>/dev/null || { echo "no numpy in /usr/bin/python3: skipped"; exit 77; }
DIR="$(mktemp -d)"
trap 'rm -rf "$DIR"' EXIT
"$STRATA" demo-model --out "$DIR/tok" >/dev/null
wrote=$(/usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --shape deepseek-v4-tiny \
  --tokenizer-dir "$DIR/tok" --out "$DIR/v4")
counted=$(/usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --params-of "$DIR/v4")
ids=$(/usr/bin/python3 -c 'print(",".join(str((i * 37) % 1000) for i in range(300)))')
out=$("$STRATA" generate --model-path "$DIR/v4" --prompt-ids "$ids" --max-tokens 4 --logprobs 2 --json)
/usr/bin/python3 - "$wrote" "$counted" "$out" <<'PY'
import json, math, sys
wrote, counted, out = (json.loads(a) for a in sys.argv[1:])
assert wrote["gguf"] is None, wrote
for k in ("params", "active_params"):
    assert wrote[k] == counted[k], (k, wrote[k], counted[k])
assert 0 < counted["active_params"] < counted["params"], counted
assert len(out["output_ids"]) == 4, out
for lp in out["logprobs"]:
    assert math.isfinite(lp["logprob"]), lp
print("ok:", counted, out["output_ids"])
PY
