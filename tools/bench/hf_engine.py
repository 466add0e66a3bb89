#!/usr/bin/env python3
"""HF transformers on the same model directory and GPU as `strata bench engine`:
batch-1 prefill of --prompt-len random tokens and greedy decode of --gen-len
tokens, eager attention, bf16 weights and activations. Prints one JSON line
with the same keys strata's bench prints (prefill_tok_s, decode_tok_s), best of
--repeats, so docs/perf.md can put the two side by side from one run.

    python3 tools/bench/hf_engine.py --model-path DIR --prompt-len 512 --gen-len 128 --repeats 3
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attn", default="eager", help="attn_implementation (eager, sdpa)")
    a = ap.parse_args()

    model = AutoModelForCausalLM.from_pretrained(
        a.model_path, torch_dtype=torch.bfloat16, attn_implementation=a.attn).cuda().eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, vocab, (1, a.prompt_len), generator=g).cuda()

    best_prefill, best_decode = 0.0, 0.0
    with torch.inference_mode():
        for _ in range(a.repeats + 1):  # the first round warms up (kernels, allocator)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(prompt, use_cache=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            for _ in range(a.gen_len - 1):
                out = model(tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            best_prefill = max(best_prefill, a.prompt_len / (t1 - t0))
            best_decode = max(best_decode, (a.gen_len - 1) / (t2 - t1))
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "engine": f"transformers {__import__('transformers').__version__} ({a.attn}, bf16)",
        "gpu": torch.cuda.get_device_name(0),
        "params": params,
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "prefill_tok_s": round(best_prefill, 1),
        "decode_tok_s": round(best_decode, 1),
    }))


if __name__ == "__main__":
    main()
