#!/usr/bin/env python3
"""Checks tests/fixtures/models/*/golden.json with an independent numpy forward pass.

Reads the checkpoint files directly (safetensors header + bf16/fp16/fp32 data,
shards, tied embeddings, both config dialects), runs a float64 Llama/Mistral/
Qwen2/Qwen3 forward pass written from the architectures' definitions (not from
transformers) and compares greedy tokens and top-5 logprobs with the goldens.
A second opinion on the fixtures and a readable statement of what they mean.

    /usr/bin/python3 tools/reference/check_model_fixtures.py [--all]

Needs only numpy (Debian: python3-numpy). Default: the first 6 steps of short
prompts and 2 of the long ones (~15 s); --all checks every step (minutes).
Exit status 1 if a token differs where the golden margin is >= 1e-3, or a
logprob differs by more than 1e-4.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "models")

def load_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); base = 8 + n
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        a, b = v["data_offsets"]; buf = raw[base + a: base + b]
        if v["dtype"] == "BF16":
            x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F16":
            x = np.frombuffer(buf, np.float16).astype(np.float32)
        else:
            x = np.frombuffer(buf, np.float32).copy()
        out[k] = x.reshape(v["shape"]).astype(np.float64)
    return out

def load_dir(d):
    W = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"): W.update(load_st(os.path.join(d, f)))
    return W

def rope_inv_freq(cfg, hd):
    if "rope_parameters" in cfg:
        rp = dict(cfg["rope_parameters"]); theta = rp["rope_theta"]; rtype = rp.get("rope_type", "default")
    else:
        theta = cfg["rope_theta"]; rp = cfg.get("rope_scaling") or {}
        rtype = rp.get("rope_type", rp.get("type", "default"))
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    if rtype == "linear":
        inv = inv / rp["factor"]
    elif rtype == "llama3":
        f, lo, hi, om = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
        wl = 2 * math.pi / inv
        lw, hw = om / lo, om / hi
        out = np.where(wl > lw, inv / f, inv)
        smooth = (om / wl - lo) / (hi - lo)
        mid = (wl <= lw) & (wl >= hw)
        out = np.where(mid, (1 - smooth) * inv / f + smooth * inv, out)
        inv = out
    return inv

def rms(x, w, eps): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

def forward(cfg, W, ids):
    H = cfg["hidden_size"]; nh = cfg["num_attention_heads"]; nkv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh; eps = cfg["rms_norm_eps"]
    T = len(ids); x = W["model.embed_tokens.weight"][ids]
    inv = rope_inv_freq(cfg, hd); ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1); sin = np.concatenate([np.sin(ang)] * 2, -1)
    def rot(t):  # t: [h, T, hd], rotate-half convention
        t1, t2 = t[..., :hd // 2], t[..., hd // 2:]
        return t * cos + np.concatenate([-t2, t1], -1) * sin
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        def proj(n):
            y = h @ W[p + f"self_attn.{n}_proj.weight"].T
            if p + f"self_attn.{n}_proj.bias" in W: y = y + W[p + f"self_attn.{n}_proj.bias"]
            return y
        q = proj("q").reshape(T, nh, hd).transpose(1, 0, 2)
        k = proj("k").reshape(T, nkv, hd).transpose(1, 0, 2)
        v = proj("v").reshape(T, nkv, hd).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in W:
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps); k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rot(q), rot(k)
        g = nh // nkv; k = np.repeat(k, g, 0); v = np.repeat(v, g, 0)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        gt = h @ W[p + "mlp.gate_proj.weight"].T; up = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x[-1], W["model.norm.weight"], eps)
    lm = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    z = lm @ x; z = z - z.max(); return z - np.log(np.exp(z).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--all", action="store_true", help="check every step of every case")
    args = ap.parse_args()
    ok = True
    for name in sorted(os.listdir(args.root)):
        d = os.path.join(args.root, name)
        if not os.path.isdir(d):
            continue
        cfg = json.load(open(os.path.join(d, "config.json")))
        W = load_dir(d)
        gold = json.load(open(os.path.join(d, "golden.json")))
        worst, checked = 0.0, 0
        for c in gold["cases"] + gold["text_cases"] + gold["chat_cases"]:
            ids = list(c["prompt_ids"])
            n = len(c["steps"]) if args.all else (6 if len(ids) < 200 else 2)
            for j, s in enumerate(c["steps"][:n]):
                lp = forward(cfg, W, ids)
                best = int(np.argmax(lp))
                if best != s["token"]:
                    if s["margin"] >= gold["near_tie"]:
                        print(f"{name}: token mismatch, prompt len {len(c['prompt_ids'])} step {j}: "
                              f"{best} != {s['token']}")
                        ok = False
                    break  # near-tie or mismatch: the rest of the sequence is not comparable
                for t, v in s["top"]:
                    worst = max(worst, abs(lp[t] - v))
                checked += 1
                ids.append(s["token"])
        print(f"{name}: {checked} steps, max |logprob diff| {worst:.2e}")
        ok = ok and worst < 1e-4
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
