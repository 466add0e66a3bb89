#!/usr/bin/env python3
"""Structured outputs' mask cost per token next to a decode step (issue 11's goal: < 5%).

  constrain_bench --benchmark_filter='BM_ConstraintStep|BM_SampleMasked' \
      --benchmark_format=json > mask.json
  strata bench engine --device cpu|cuda ... --json | tail -1 > step.json
  tools/bench/mask_vs_step.py mask.json step.json [step2.json ...] \
      [--device-sampling batch_sampler_test.log]

Masks are computed on the host for every backend, so the constraint's
numbers (CPU time per token) hold against any backend's step. The host
sampler's rows (BM_SampleMasked) are what a masked token costs when it is
sampled on the host; with the CUDA backend sampling runs on the device
(Backend::SampleRows), and --device-sampling adds the per-step costs that
batch_sampler_test's DeviceSamplingCostPerStep printed ("[ device sampling ]"
lines) next to each step.
"""
import json
import sys


def main():
    args = sys.argv[1:]
    device_rows = []  # (what, us per step)
    if "--device-sampling" in args:
        i = args.index("--device-sampling")
        for line in open(args[i + 1]):
            if line.startswith("[ device sampling ]"):
                # "[ device sampling ] vocab 151936 rows 1 greedy+mask  12.3 us per step"
                f = line.split()
                device_rows.append((f"device sampler {f[8]}, {f[7]} rows (vocab {f[5]})",
                                    float(f[9])))
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    bench = json.load(open(args[0]))["benchmarks"]
    rows = []  # (what, us per token)
    for b in bench:
        if b["name"].startswith("BM_ConstraintStep/1/") and "per_token_us" in b:
            rows.append(("constraint " + b.get("label", b["name"]), b["per_token_us"]))
        elif b["name"].startswith("BM_SampleMasked/"):
            unit = {"us": 1, "ms": 1e3, "ns": 1e-3}[b.get("time_unit", "us")]
            rows.append(("sampler " + b.get("label", b["name"]), b["cpu_time"] * unit))
    if not rows:
        sys.exit(args[0] + ": no 151,936-vocab rows (is the Qwen3 tokenizer staged?)")
    for path in args[1:]:
        step = json.loads(open(path).read().strip().splitlines()[-1])
        step_us = 1e6 / step["decode_tok_s"]
        print(f"{path}: backend {step['backend']}, decode step {step_us:.0f} us")
        for what, us in rows:
            print(f"  {what:60s} {us:9.2f} us/token  {100 * us / step_us:6.2f}% of the step")
        for what, us in device_rows:
            print(f"  {what:60s} {us:9.2f} us/step   {100 * us / step_us:6.2f}% of the step")


if __name__ == "__main__":
    main()
