#!/usr/bin/env python3
"""Writes the seed corpora of the model-file fuzz targets (src/model/fuzz/)
from the real fixtures in tests/fixtures, kept small so libFuzzer runs fast:

  tests/fuzz/safetensors/        fixture checkpoints with real tensor names,
                                 dtypes and metadata, shapes shrunk, data from
                                 the real tensors; plus edge cases
  tests/fuzz/safetensors_index/  the sharded fixture's index and variants
  tests/fuzz/hf_config/          every fixture config.json / generation_config.json
  tests/fuzz/tokenizer/          every fixture tokenizer.json with its vocabulary
                                 cut to the first ~120 tokens (merges that stay
                                 inside it kept), one with its tokenizer_config.json
  tests/fuzz/jinja/              every fixture chat template

Regression seeds (files named regress_*) are written by hand and kept.
Run from the repository root: python3 tools/fuzz/make_model_fuzz_seeds.py
"""
import glob
import json
import os
import struct

FIX = "tests/fixtures"
OUT = "tests/fuzz"


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data)


def safetensors(header, blobs):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8}


def shrink(path, max_tensors):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out, blobs, off = {}, [], 0
    if "__metadata__" in header:
        out["__metadata__"] = header["__metadata__"]
    names = [k for k in header if k != "__metadata__"][:max_tensors]
    for name in names:
        t = header[name]
        shape = [min(d, 3) for d in t["shape"]]
        count = 1
        for d in shape:
            count *= d
        nbytes = count * SIZES[t["dtype"]]
        begin = t["data_offsets"][0]
        blobs.append(data[begin:begin + nbytes])
        out[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    return safetensors(out, blobs)


def safetensors_seeds():
    for path in sorted(glob.glob(f"{FIX}/models/*/*.safetensors")):
        model = path.split("/")[-2]
        base = os.path.basename(path).replace(".safetensors", "")
        write("safetensors", f"{model}_{base}.safetensors", shrink(path, 8))
    f32 = struct.pack("<3f", 1.0, float("nan"), float("inf"))
    write("safetensors", "edge_scalar_empty_int.safetensors", safetensors(
        {"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
         "e": {"dtype": "F16", "shape": [0, 7], "data_offsets": [4, 4]},
         "i": {"dtype": "I64", "shape": [1], "data_offsets": [4, 12]}},
        [f32[:4], b"\x01" * 8]))
    write("safetensors", "edge_nan_inf_unaligned.safetensors", safetensors(
        {"h": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
         "f": {"dtype": "F32", "shape": [3], "data_offsets": [2, 14]}},
        [b"\x00\x7e", f32]))
    write("safetensors", "edge_unknown_dtype.safetensors", safetensors(
        {"q": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, [b"\x00\x00"]))


def index_seeds():
    text = open(f"{FIX}/models/llama3_rope/model.safetensors.index.json").read()
    write("safetensors_index", "llama3_rope.index.json", text)
    j = json.loads(text)
    small = {"metadata": j.get("metadata", {}), "weight_map": dict(list(j["weight_map"].items())[:4])}
    write("safetensors_index", "small.index.json", json.dumps(small))
    write("safetensors_index", "bad_shard_path.index.json",
          json.dumps({"weight_map": {"a": "../model.safetensors", "b": "x/y.safetensors"}}))
    write("safetensors_index", "bad_types.index.json",
          json.dumps({"weight_map": {"a": 1, "b": ["s.safetensors"]}}))


def config_seeds():
    for path in sorted(glob.glob(f"{FIX}/models/*/config.json")):
        write("hf_config", path.split("/")[-2] + "_config.json", open(path).read())
    for path in sorted(glob.glob(f"{FIX}/models/*/generation_config.json")):
        write("hf_config", path.split("/")[-2] + "_generation_config.json", open(path).read())


def cut_tokenizer(t, keep):
    m = t["model"]
    vocab = m["vocab"]
    kept = dict(sorted(vocab.items(), key=lambda kv: kv[1])[:keep])
    m["vocab"] = kept
    merges = []
    for mg in m.get("merges", []):
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in kept and b in kept and (a + b) in kept:
            merges.append(mg)
    m["merges"] = merges
    # Added tokens keep their ids (the post-processor names them), so the
    # id space has a hole between the cut vocabulary and them.
    t["added_tokens"] = t.get("added_tokens", [])[:8]
    return t


def tokenizer_seeds():
    paths = sorted(glob.glob(f"{FIX}/tokenizer/*/tokenizer.json")) + [
        f"{FIX}/models/llama_default/tokenizer.json"]
    for path in paths:
        name = path.split("/")[-2]
        t = cut_tokenizer(json.load(open(path)), 120)
        write("tokenizer", f"{name}.json", json.dumps(t, ensure_ascii=False))
    cfg = open(f"{FIX}/models/llama_default/tokenizer_config.json").read()
    t = cut_tokenizer(json.load(open(f"{FIX}/models/llama_default/tokenizer.json")), 120)
    write("tokenizer", "llama_default_with_config.json",
          json.dumps(t, ensure_ascii=False) + "\n--tokenizer_config.json--\n" + cfg)


def jinja_seeds():
    for path in sorted(glob.glob(f"{FIX}/chat/*.jinja")):
        write("jinja", os.path.basename(path), open(path).read())
    write("jinja", "qwen3_fixture_model.jinja", open(f"{FIX}/models/qwen3/chat_template.jinja").read())
    cfg = json.load(open(f"{FIX}/models/llama_default/tokenizer_config.json"))
    if isinstance(cfg.get("chat_template"), str):
        write("jinja", "llama_default_tokenizer_config.jinja", cfg["chat_template"])


if __name__ == "__main__":
    safetensors_seeds()
    index_seeds()
    config_seeds()
    tokenizer_seeds()
    jinja_seeds()
