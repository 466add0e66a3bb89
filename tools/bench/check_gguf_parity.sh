#!/usr/bin/env bash
# Checks that make_shape_model.py's GGUF computes the same model as its
# safetensors twin: Strata and llama.cpp must produce the same greedy tokens
# for a 100-token prompt on tiny Qwen2 (qkv bias) and tiny Llama (rope
# permutation, llama3 rope factors past the original context) models, with
# weights large enough (std 0.25) that the argmax is never a near-tie.
#
#   tools/bench/check_gguf_parity.sh [--build-dir build-bench] [--native DIR] [--no-prebuilt]   (~1 minute)
#
# Checks the npm prebuilt llama.cpp, and with --native DIR also the native
# build in DIR (tools/bench/llama_cpp/native.sh); --no-prebuilt skips the
# prebuilt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-bench"
PEERS=(prebuilt)
NATIVE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD="$(realpath -m "$2")"; shift 2 ;;
    --native) NATIVE="$2"; PEERS+=(native); shift 2 ;;
    --no-prebuilt) PEERS=("${PEERS[@]/prebuilt}"); shift ;;
    *) echo "check_gguf_parity.sh: unknown flag '$1' (known: --build-dir DIR --native DIR --no-prebuilt)" >&2; exit 2 ;;
  esac
done
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
  got=$("$STRATA" generate --model-path "$DIR/$shape" --prompt-ids "$PROMPT" --max-tokens 16 --ignore-eos \
    --threads 1 --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])')
  for peer in ${PEERS[@]}; do
    native=()
    [[ $peer == native ]] && native=(--native "$NATIVE")
    want=$(node "$ROOT/tools/bench/llama_cpp/greedy.mjs" --model "$DIR/$shape/model-bf16.gguf" \
      --prompt-ids "$PROMPT" --max-tokens 16 "${native[@]}" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
    if [[ "$want" == "$got" ]]; then
      echo "ok   $shape, llama.cpp $peer: 16 greedy tokens agree"
    else
      echo "FAIL $shape: llama.cpp $peer $want"
      echo "     $shape: strata    $got"
      status=1
    fi
  done
done
exit $status
