#!/usr/bin/env python3
"""Structured outputs' mask cost per token next to a decode step (issue 11's goal: < 5%).

  constrain_bench --benchmark_filter='BM_ConstraintStep|BM_SampleMasked' \
      --benchmark_format=json > mask.json
  strata bench engine --device cpu|cuda ... --json | tail -1 > step.json
  tools/bench/mask_vs_step.py mask.json step.json [step2.json ...]

Masks are computed and applied on the host for every backend, so the
constraint's numbers (CPU time per token) hold against any backend's step.
"""
import json
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bench = json.load(open(sys.argv[1]))["benchmarks"]
    rows = []  # (what, us per token)
    for b in bench:
        if b["name"].startswith("BM_ConstraintStep/1/") and "per_token_us" in b:
            rows.append(("constraint " + b.get("label", b["name"]), b["per_token_us"]))
        elif b["name"].startswith("BM_SampleMasked/"):
            unit = {"us": 1, "ms": 1e3, "ns": 1e-3}[b.get("time_unit", "us")]
            rows.append(("sampler " + b.get("label", b["name"]), b["cpu_time"] * unit))
    if not rows:
        sys.exit(sys.argv[1] + ": no 151,936-vocab rows (is the Qwen3 tokenizer staged?)")
    for path in sys.argv[2:]:
        step = json.loads(open(path).read().strip().splitlines()[-1])
        step_us = 1e6 / step["decode_tok_s"]
        print(f"{path}: backend {step['backend']}, decode step {step_us:.0f} us")
        for what, us in rows:
            print(f"  {what:60s} {us:9.2f} us/token  {100 * us / step_us:6.2f}% of the step")


if __name__ == "__main__":
    main()
