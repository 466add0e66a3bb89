#!/usr/bin/env bash
# Runs the model-file fuzz targets once each for 10^7 executions, in
# parallel, from the repository root: ./tools/fuzz/run_model_fuzzers.sh OUTDIR
# Targets whose single process is too slow for 10^7 in the time given run in
# libFuzzer's fork mode (-fork=N: N worker processes, -runs counts them all).
# Logs go to OUTDIR/<target>.log, crash/leak/timeout inputs to
# OUTDIR/artifacts/<target>/; new corpus inputs to OUTDIR/corpus/<target>/.
# Env: BIN (default build-fuzz), TIME (max seconds per target, default 540),
# FORK_<target> (workers), RUNS (default 10000000), CORPUS (where new inputs
# go, default OUTDIR/corpus).
set -u
out=${1:?usage: $0 OUTDIR}
bin=${BIN:-build-fuzz}
runs=${RUNS:-10000000}
time=${TIME:-540}
corpus=${CORPUS:-$out/corpus}
mkdir -p "$out"
pids=()
for t in safetensors safetensors_index hf_config tokenizer jinja; do
  mkdir -p "$out/artifacts/$t" "$corpus/$t"
  var="FORK_$t"
  fork=${!var:-0}
  extra=()
  [ "$fork" -gt 0 ] && extra+=(-fork="$fork")
  nice -n 19 "$bin/${t}_fuzz" -runs="$runs" -max_total_time="$time" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" "${extra[@]}" \
    "$corpus/$t" "tests/fuzz/$t" > "$out/$t.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for t in safetensors safetensors_index hf_config tokenizer jinja; do
  echo "== $t: $(grep -E '^#[0-9]+' "$out/$t.log" | tail -n 1)"
  grep -E 'stat::number_of_executed_units|fuzzed for|ERROR|SUMMARY|Done [0-9]+ runs|check failed' \
    "$out/$t.log" | head -n 5
done
exit $rc
