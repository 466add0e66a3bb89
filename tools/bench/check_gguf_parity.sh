#!/usr/bin/env bash
# Checks that make_shape_model.py's GGUF computes the same model as its
# safetensors twin: Strata and llama.cpp must produce the same greedy tokens
# for a 100-token prompt on tiny Qwen2 (qkv bias) and tiny Llama (rope
# permutation, llama3 rope factors past the original context) models, with
# weights large enough (std 0.25) that the argmax is never a near-tie.
#
#   tools/bench/check_gguf_parity.sh [--build-dir build-bench]   (~1 minute)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
[[ "${1:-}" == "--build-dir" ]] && BUILD="$(realpath -m "$2")"
STRATA="$BUILD/strata"
[[ -x "$STRATA" ]] || { echo "check_gguf_parity.sh: no $STRATA; build it: ninja -C $BUILD strata" >&2; exit 2; }
[[ -d "$ROOT/tools/bench/llama_cpp/node_modules/node-llama-cpp" ]] ||
  (cd "$ROOT/tools/bench/llama_cpp" && npm ci --omit=optional --ignore-scripts >/dev/null)
DIR="$(mktemp -d /tmp/strata-gguf-parity.XXXXXX)"
trap 'rm -rf "$DIR"' EXIT

"$STRATA" demo-model --out "$DIR/tok" 2>/dev/null
PROMPT=$(/usr/bin/python3 -c "import random; r=random.Random(5); print(','.join(str(r.randrange(1000)) for _ in range(100)))")
status=0
for shape in tiny tiny-llama; do
  /usr/bin/python3 "$ROOT/tools/bench/make_shape_model.py" --shape "$shape" --tokenizer-dir "$DIR/tok" \
    --out "$DIR/$shape" --weight-std 0.25 >/dev/null
  want=$(node "$ROOT/tools/bench/llama_cpp/greedy.mjs" --model "$DIR/$shape/model-bf16.gguf" \
    --prompt-ids "$PROMPT" --max-tokens 16 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  got=$("$STRATA" generate --model-path "$DIR/$shape" --prompt-ids "$PROMPT" --max-tokens 16 --ignore-eos \
    --threads 1 --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])')
  if [[ "$want" == "$got" ]]; then
    echo "ok   $shape: 16 greedy tokens agree"
  else
    echo "FAIL $shape: llama.cpp $want"
    echo "     $shape: strata    $got"
    status=1
  fi
done
exit $status
