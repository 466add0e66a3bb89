#!/usr/bin/env python3
"""Adds `cached_steps` to a fixture's golden.json: the reference's own KV-cached greedy run.

  python3 tools/reference/add_cached_goldens.py tests/fixtures/models/deepseek_v4

make_model_fixtures.py records goldens by full recompute (the whole sequence
again at every step), and for most models transformers' cached generation
equals it within 1e-5 (log.txt: "kv diff"). DeepSeek V4's does not (kv diff
up to 1.15 at 1,000 tokens): its indexer's torch.topk breaks exact ties by
the entry count of the forward call, so a full recompute and a cached run
choose differently once a window closes. An engine with a KV cache runs the
cached way (one prefill of the prompt, then one token per step), so its
reference is transformers' cached run: for every greedy case this script
stores that run's step records (same format as `steps`) as `cached_steps`,
from the fixture directory as saved (fp32, eager attention, as the other
goldens). Weights and other goldens are left as they are.
Runs on the GPU machine (torch + transformers); CPU is enough for a tiny model.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model_fixtures as mmf  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    path = os.path.join(d, "golden.json")
    golden = json.load(open(path))
    ref = mmf.load_from_dir(d)
    for c in golden["cases"]:
        n = len(c["steps"])
        toks, lps = mmf.greedy_cached(ref, c["prompt_ids"], n)
        c["cached_steps"] = [mmf.step_record(lp) for lp in lps]
        first = next((i for i, (a, b) in enumerate(zip(c["steps"], c["cached_steps"]))
                      if a["token"] != b["token"]), None)
        worst = max(abs(a["logprob"] - b["logprob"]) for a, b in zip(c["steps"], c["cached_steps"]))
        print(f"prompt len {len(c['prompt_ids']):4d}: cached vs full first token diff at "
              f"{first}, max chosen-logprob diff {worst:.3g}")
    golden["cached_steps_by"] = "tools/reference/add_cached_goldens.py (greedy_cached)"
    mmf.write_golden(path, golden)


if __name__ == "__main__":
    main()
