#!/usr/bin/env bash
# KV transfer bandwidth (issue 8, item 8): Strata's UcxTransport
# (kv_transfer_bench: a sender and a receiver process on this host, writing
# KV pages of Qwen2.5-0.5B's layout the way a prefill server does) against
# `ucx_perftest -t ucp_put_bw -e` (server + client on 127.0.0.1, endpoints
# with peer error handling as ours) on the same UCX_TLS and message size, alternated (perftest, ours, perftest, ours, ...)
# so machine drift hits both. Prints a markdown table with the ratio of the
# medians and the paired ratio (median over rounds of ours / the perftest
# run just before it: steadier on a drifting machine).
#
#   tools/bench/kv_transfer.sh [--tls "tcp tcp,cma shm"] [--pages 1024] [--rounds 3]
#       [--receiver-memory ucx|heap] [--cases "4k 256k"] [--repeat 1] [--bench-args "..."]
#       [--build-dir build] [--skip-build]
#
# --repeat N: each of our repetitions writes the transfer N times (and
# perftest moves N times the bytes too): with few --pages the pages stay in
# the caches as perftest's one buffer does (--pages 1 --repeat 1024 --cases
# 4k: 192 KiB per transfer; --pages 64 --repeat 16: 12 MiB, the 256k
# case's smallest).
#
# --receiver-memory: where the bench's receiver pool lives: ucx (memory
# UCX allocated, what `strata serve --disaggregation-mode decode` uses) or
# heap (registered engine-style memory, the path before that). The last
# columns: the same copies as a plain memcpy in one process (the memory
# system's ceiling for this pattern; perftest reuses one cache-hot buffer).
#
# Cases: 4k (random pages: every put is one 4 KiB (layer, tensor, page)
# run) and 256k (runs of 64 consecutive pages: 256 KiB puts). Both move
# pages x 192 KiB per transfer. MB/s are 2^20 bytes/s, as ucx_perftest
# prints them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build"
TLS_LIST="tcp tcp,cma shm"
PAGES=1024
ROUNDS=3
SKIP_BUILD=0
RECEIVER_MEMORY=ucx
BENCH_ARGS=""
CASES="4k 256k"
REPEAT=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tls) TLS_LIST="$2"; shift 2 ;;
    --pages) PAGES="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --skip-build) SKIP_BUILD=1; shift ;;
    --receiver-memory) RECEIVER_MEMORY="$2"; shift 2 ;;
    --bench-args) BENCH_ARGS="$2"; shift 2 ;;
    --cases) CASES="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 1 ;;
  esac
done

if [[ $SKIP_BUILD == 0 ]]; then
  "$ROOT/scripts/deps.sh" --test
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DSTRATA_BUILD_BENCH=ON >/dev/null
  nice ninja -C "$BUILD" -j2 kv_transfer_bench >/dev/null
fi
BENCH="$BUILD/src/kv_transfer_bench"
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing: apt-get install ucx-utils" >&2; exit 1; }

median() { awk 'NF' | sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

# ucx_perftest ucp_put_bw: one run, prints the overall MB/s ("Final:" line, 7th field).
# With -e (endpoints with peer error handling, as UcxTransport's) and
# UCX_MM_ERROR_HANDLING=y (what UcxTransport sets for posix/sysv, without
# which -e finds no shared-memory transport), so both sides get the same
# lanes. Server and client are bounded by `timeout`: a server whose client
# never connects would otherwise wait forever.
perftest() {
  local tls="$1" size="$2" iters="$3" port=$((14000 + RANDOM % 2000)) out=""
  UCX_TLS="$tls" UCX_MM_ERROR_HANDLING=y timeout 120 ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 0.3
    if out=$(UCX_TLS="$tls" UCX_MM_ERROR_HANDLING=y timeout 100 ucx_perftest 127.0.0.1 \
               -p "$port" -e -t ucp_put_bw -s "$size" -n "$iters" -w $((iters / 10 + 1)) 2>&1); then
      break
    fi
  done
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  echo "$out" | awk '/^Final:/ {print $7}'
}

declare -A PT OURS PAIRED NOTE MEMCPY
echo "# $(date -u +%FT%TZ) $(uname -n): $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for tls in $TLS_LIST; do
  for case in $CASES; do
    if [[ $case == 4k ]]; then size=4096; else size=262144; fi
    iters=$((PAGES * REPEAT * 48 * 4096 / size))  # the same bytes as one of our repetitions
    pts=() ours=() pairs=() mcs=()
    for ((r = 0; r < ROUNDS; r++)); do
      p=$(perftest "$tls" "$size" "$iters")
      [[ -n $p ]] && pts+=("$p")
      o="" m=""
      # shellcheck disable=SC2086
      if line=$(UCX_TLS="$tls" "$BENCH" --case="$case" --pages="$PAGES" --reps=3 \
                  --receiver-memory="$RECEIVER_MEMORY" --repeat="$REPEAT" $BENCH_ARGS 2>&1); then
        o=$(echo "$line" | sed -n 's/.* mbps_median=\([0-9.]*\).*/\1/p')
        ours+=("$o")
        m=$(echo "$line" | sed -n 's/.*memcpy_mbps_median=\([0-9.]*\).*/\1/p')
        mcs+=("$m")
      else
        NOTE[$tls/$case]="ours fails: $(echo "$line" | grep -v '^\[' | tail -1)"
      fi
      if [[ -n $p && -n $o ]]; then pairs+=("$(awk -v o="$o" -v p="$p" 'BEGIN {printf "%.3f", o / p}')"); fi
      echo "  UCX_TLS=$tls $case round $r: perftest ${p:-fail} MB/s, ours ${o:-fail} MB/s, memcpy ${m:-?} MB/s" >&2
    done
    PT[$tls/$case]=$(printf '%s\n' "${pts[@]}" | median)
    OURS[$tls/$case]=$(printf '%s\n' "${ours[@]}" | median)
    PAIRED[$tls/$case]=$(printf '%s\n' "${pairs[@]}" | median)
    MEMCPY[$tls/$case]=$(printf '%s\n' "${mcs[@]}" | median)
  done
done

echo
echo "receiver memory: $RECEIVER_MEMORY, pages $PAGES, repeat $REPEAT${BENCH_ARGS:+; bench args: $BENCH_ARGS}"
echo "| UCX_TLS | case | message | ucx_perftest ucp_put_bw MB/s | Strata KV transfer MB/s | ratio of medians | paired ratio | memcpy, same pattern MB/s | ours / memcpy |"
echo "|---|---|---|---|---|---|---|---|---|"
for tls in $TLS_LIST; do
  for case in $CASES; do
    if [[ $case == 4k ]]; then msg="4 KiB"; else msg="256 KiB"; fi
    p=${PT[$tls/$case]} o=${OURS[$tls/$case]}
    ratio=$(awk -v o="$o" -v p="$p" 'BEGIN {if (o == "nan" || p == "nan" || p == 0) print "-"; else printf "%.2f", o / p}')
    [[ $o == nan ]] && o=""
    paired=${PAIRED[$tls/$case]}
    [[ $paired == nan ]] && paired="-"
    mc=${MEMCPY[$tls/$case]}
    of_mc=$(awk -v o="$o" -v m="$mc" 'BEGIN {if (o == "" || m == "nan" || m == 0) print "-"; else printf "%.2f", o / m}')
    echo "| $tls | $case | $msg | $p | $o${NOTE[$tls/$case]:+ ${NOTE[$tls/$case]}} | $ratio | $paired | $mc | $of_mc |"
  done
done
