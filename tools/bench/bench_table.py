#!/usr/bin/env python3
"""Markdown table from cpu_vs_llamacpp.sh's JSON-lines results (stdlib only).

Each input line is one engine run:
  {"shape", "threads", "round", "engine", "prefill_tok_s", "decode_tok_s",
   "bw_gb_s", "weight_bytes", "loadavg", "cpu_share" (optional),
   "prefill_tok_per_cpu_s", "decode_tok_per_cpu_s" (optional: tokens x
   threads / CPU-seconds, what the engine did with the cores it got)}
A run's roofline is its own adjacent bandwidth / weight bytes (batch-1 decode
reads every weight once per token), and its decode read GB/s is weight bytes x
decode tok/s: what the engine streamed, to hold against the probe (a value
above the probe's means the probe is not the machine's limit). The table shows
medians over rounds, and each Strata row's ratios to the llama.cpp peers
("llama.cpp native", "llama.cpp prebuilt"; results written before the native
peer existed call the prebuilt plain "llama.cpp").
"""

import json
import statistics
import sys


def main(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    for r in runs:
        if r["engine"] == "llama.cpp":
            r["engine"] = "llama.cpp prebuilt"
    groups = {}
    for r in runs:
        groups.setdefault((r["shape"], r["threads"]), {}).setdefault(r["engine"], []).append(r)
    med = statistics.median
    print("| shape | threads | engine | prefill tok/s | decode tok/s | read bw GB/s "
          "| decode reads GB/s | decode roofline tok/s | decode / roofline | vs native (prefill, decode) "
          "| vs prebuilt (prefill, decode) | prefill, decode tok/CPU-s | runs | load avg | CPU share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (shape, threads), by_engine in groups.items():
        stats = {}
        for engine, rs in by_engine.items():
            roof = [r["bw_gb_s"] * 1e9 / r["weight_bytes"] for r in rs]
            stats[engine] = {
                "prefill": med(r["prefill_tok_s"] for r in rs),
                "decode": med(r["decode_tok_s"] for r in rs),
                "bw": med(r["bw_gb_s"] for r in rs),
                "reads": med(r["decode_tok_s"] * r["weight_bytes"] / 1e9 for r in rs),
                "roof": med(roof),
                "ratio": med(r["decode_tok_s"] / x for r, x in zip(rs, roof)),
                "n": len(rs),
                "load": (min(r["loadavg"] for r in rs), max(r["loadavg"] for r in rs)),
                "share": [r["cpu_share"] for r in rs if "cpu_share" in r],
                "pcpu": [r["prefill_tok_per_cpu_s"] for r in rs if "prefill_tok_per_cpu_s" in r],
                "dcpu": [r["decode_tok_per_cpu_s"] for r in rs if "decode_tok_per_cpu_s" in r],
            }
        def cpu_rates(s):
            if not s["pcpu"] or not s["dcpu"]:
                return "—"
            return f"{med(s['pcpu']):.1f}, {med(s['dcpu']):.2f}"

        def vs(s, peer):
            p = stats.get(peer)
            if not p or s is p:
                return "—"
            return f"{s['prefill'] / p['prefill']:.2f}×, {s['decode'] / p['decode']:.2f}×"

        for engine in sorted(stats, key=lambda e: (e.startswith("llama.cpp"), e)):
            s = stats[engine]
            print(f"| {shape} | {threads} | {engine} | {s['prefill']:.1f} | {s['decode']:.2f} "
                  f"| {s['bw']:.1f} | {s['reads']:.1f} | {s['roof']:.2f} | {s['ratio']:.2f} "
                  f"| {vs(s, 'llama.cpp native')} | {vs(s, 'llama.cpp prebuilt')} "
                  f"| {cpu_rates(s)} | {s['n']} "
                  f"| {s['load'][0]:.1f}–{s['load'][1]:.1f} "
                  f"| {med(s['share']) if s['share'] else float('nan'):.2f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_table.py RESULTS.jsonl")
    main(sys.argv[1])
