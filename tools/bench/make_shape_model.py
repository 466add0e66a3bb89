#!/usr/bin/python3
"""Writes a random-weight model of a real model's shape, for benchmarks.

One pass writes the same bf16 weights twice:
  OUT/                       a Hugging Face model directory for Strata
    config.json              the published checkpoint's config (dialect of the Hub files)
    generation_config.json
    model.safetensors        bf16, deterministic (seed + tensor name)
    tokenizer.json, tokenizer_config.json   copied from --tokenizer-dir
  OUT/model-bf16.gguf        the same weights as GGUF v3 for llama.cpp: matrices
                             BF16, 1-D tensors (norms, biases) F32 like llama.cpp's
                             own converter, the tokenizer of --tokenizer-dir padded
                             to the model's vocabulary.

Weight values are irrelevant to speed but kept sane (uniform, std 0.02 for
matrices, norms near 1) so activations stay finite through all layers.

Usage:
  /usr/bin/python3 tools/bench/make_shape_model.py --shape qwen2.5-0.5b \
      --tokenizer-dir DEMO_MODEL_DIR --out /tmp/strata-bench/qwen2.5-0.5b
  # Issue 10's 8 B goal shape on the GPU machine, safetensors only, tiled fill:
  python3 tools/bench/make_shape_model.py --shape llama-3.1-8b --fill tiled --no-gguf \
      --tokenizer-dir DEMO_MODEL_DIR --out /tmp/l8b

Needs only numpy (Debian: python3-numpy). The GGUF writer follows the spec
at https://github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import zlib

import numpy as np

# Published configs (Hub dialect: rope_scaling + rope_theta, torch_dtype).
SHAPES = {
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 896,
        "initializer_range": 0.02,
        "intermediate_size": 4864,
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_hidden_layers": 24,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 8192,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
    # Issue 10's goal shape (meta-llama/Llama-3.1-8B's config.json): 8.03 B
    # parameters, 16.06 GB in bf16, untied head. Use --fill tiled --no-gguf
    # on the GPU machine (seconds instead of minutes).
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    },
    # Llama layout (rope permutation in GGUF, llama3 rope factors), tiny dims.
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "bos_token_id": None,
        "eos_token_id": 0,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "intermediate_size": 256,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 64,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 2048,
    },
    # Smoke tests of the pipeline in seconds: Qwen2 layout (qkv bias), tiny dims.
    "tiny": {
        "architectures": ["Qwen2ForCausalLM"],
        "bos_token_id": None,
        "eos_token_id": 0,
        "hidden_act": "silu",
        "hidden_size": 128,
        "intermediate_size": 256,
        "max_position_embeddings": 4096,
        "max_window_layers": 2,
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 2048,
    },
}

WEIGHT_STD = 0.02  # --weight-std; larger (0.1-0.3) gives decisive logits for parity checks
CHUNK = 1 << 24  # elements generated at a time (64 MiB of float32)
TILE = 1 << 22  # --fill tiled: elements of the one random block per kind (8 MiB of bf16)


def to_bf16(x):
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = x.view(np.uint32)  # in place: x is scratch
    lsb = u >> np.uint32(16)
    lsb &= np.uint32(1)
    lsb += np.uint32(0x7FFF)
    u += lsb
    u >>= np.uint32(16)
    return u.astype(np.uint16)


def bf16_to_f32(b):
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


class Tensor:
    """One weight: HF name/shape, its GGUF name, how to fill it."""

    def __init__(self, hf_name, shape, gguf_name, kind, permute_heads=0):
        self.hf_name = hf_name
        self.shape = list(shape)
        self.gguf_name = gguf_name
        self.kind = kind  # "matrix" | "norm" | "bias"
        self.permute_heads = permute_heads  # >0: llama rope layout for GGUF

    @property
    def numel(self):
        return int(np.prod(self.shape))


def layout(cfg):
    """Tensors in file order (the order safetensors writers use is irrelevant)."""
    h = cfg["hidden_size"]
    ff = cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    llama_rope = cfg["model_type"] == "llama"  # GGUF llama: interleaved rope pairs
    ts = [Tensor("model.embed_tokens.weight", [cfg["vocab_size"], h], "token_embd.weight", "matrix")]
    for i in range(cfg["num_hidden_layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        ts.append(Tensor(p + "input_layernorm.weight", [h], g + "attn_norm.weight", "norm"))
        ts.append(Tensor(p + "self_attn.q_proj.weight", [nh * hd, h], g + "attn_q.weight", "matrix",
                         nh if llama_rope else 0))
        ts.append(Tensor(p + "self_attn.k_proj.weight", [nkv * hd, h], g + "attn_k.weight", "matrix",
                         nkv if llama_rope else 0))
        ts.append(Tensor(p + "self_attn.v_proj.weight", [nkv * hd, h], g + "attn_v.weight", "matrix"))
        if qkv_bias:
            ts.append(Tensor(p + "self_attn.q_proj.bias", [nh * hd], g + "attn_q.bias", "bias",
                             nh if llama_rope else 0))
            ts.append(Tensor(p + "self_attn.k_proj.bias", [nkv * hd], g + "attn_k.bias", "bias",
                             nkv if llama_rope else 0))
            ts.append(Tensor(p + "self_attn.v_proj.bias", [nkv * hd], g + "attn_v.bias", "bias"))
        ts.append(Tensor(p + "self_attn.o_proj.weight", [h, nh * hd], g + "attn_output.weight", "matrix"))
        ts.append(Tensor(p + "post_attention_layernorm.weight", [h], g + "ffn_norm.weight", "norm"))
        ts.append(Tensor(p + "mlp.gate_proj.weight", [ff, h], g + "ffn_gate.weight", "matrix"))
        ts.append(Tensor(p + "mlp.up_proj.weight", [ff, h], g + "ffn_up.weight", "matrix"))
        ts.append(Tensor(p + "mlp.down_proj.weight", [h, ff], g + "ffn_down.weight", "matrix"))
    ts.append(Tensor("model.norm.weight", [h], "output_norm.weight", "norm"))
    if not cfg["tie_word_embeddings"]:
        ts.append(Tensor("lm_head.weight", [cfg["vocab_size"], h], "output.weight", "matrix"))
    return ts


def values(rng, n, kind, std):
    """n bf16 values of a tensor of `kind`: uniform with unit variance (half the
    cost of normal samples, same scale; the values only need to keep
    activations finite), scaled for the kind."""
    x = rng.random(n, dtype=np.float32)
    x -= np.float32(0.5)
    x *= np.float32(math.sqrt(12.0))
    if kind == "matrix":
        x *= np.float32(std)
    elif kind == "norm":
        x = np.float32(1.0) + np.float32(0.1) * x
    else:
        x *= np.float32(0.1)
    return to_bf16(x)


def generate(t, seed, std):
    """Yields the tensor's bf16 bits in row-major chunks; deterministic per name."""
    rng = np.random.default_rng([seed, zlib.crc32(t.hf_name.encode())])
    left = t.numel
    while left:
        n = min(left, CHUNK)
        yield values(rng, n, t.kind, std)
        left -= n


_tiles = {}


def generate_tiled(t, seed, std):
    """Like generate(), but every tensor of a kind repeats one random block of
    TILE values, entered at an offset from the tensor's name: 8 B parameters
    in seconds (numpy draws ~0.2 G values/s) and disk-bound. Fine for speed;
    rows repeat every TILE / cols rows, so not for anything that needs
    independent weights."""
    key = (seed, t.kind, std)
    if key not in _tiles:
        _tiles[key] = values(np.random.default_rng([seed, zlib.crc32(t.kind.encode())]), TILE,
                             t.kind, std)
    tile = _tiles[key]
    start = zlib.crc32(t.hf_name.encode()) % TILE
    left = t.numel
    first = tile[start:start + left]
    yield first
    left -= first.size
    while left:
        n = min(left, TILE)
        yield tile[:n]
        left -= n


def rope_interleave(rows, n_heads):
    """HF q/k rows (per head: first half, second half) -> llama.cpp's layout
    (per head: pairs interleaved), which llama.cpp's 'llama' rope expects."""
    shape = rows.shape
    return (rows.reshape(n_heads, 2, shape[0] // n_heads // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def llama3_rope_factors(cfg):
    """Per-frequency divisors of llama3 rope scaling (GGUF tensor rope_freqs.weight)."""
    rs = cfg["rope_scaling"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    out = []
    for i in range(0, hd, 2):
        freq = 1.0 / (cfg["rope_theta"] ** (i / hd))
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / hi:
            out.append(1.0)
        elif wavelen > old_ctx / lo:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# ---- GGUF v3 writer -------------------------------------------------------

GGUF_ALIGN = 32
GGML_F32, GGML_BF16 = 0, 30
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9


def g_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def g_value(vtype, v):
    if vtype == T_UINT32:
        return struct.pack("<I", v)
    if vtype == T_INT32:
        return struct.pack("<i", v)
    if vtype == T_FLOAT32:
        return struct.pack("<f", v)
    if vtype == T_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if vtype == T_STRING:
        return g_str(v)
    raise ValueError(f"unsupported GGUF value type {vtype}")


def g_kv(key, vtype, v):
    return g_str(key) + struct.pack("<I", vtype) + g_value(vtype, v)


def g_array(key, elem_type, values):
    if elem_type == T_INT32:
        body = np.asarray(values, dtype="<i4").tobytes()
    else:
        body = b"".join(g_value(elem_type, v) for v in values)
    return (g_str(key) + struct.pack("<I", T_ARRAY) + struct.pack("<IQ", elem_type, len(values))
            + body)


def align(n):
    return n + (GGUF_ALIGN - n % GGUF_ALIGN) % GGUF_ALIGN


def gguf_tokenizer_kvs(tok_dir, cfg):
    """The tokenizer of tok_dir (byte-level BPE tokenizer.json) as GGUF 'gpt2'
    metadata, padded with unused tokens to the model's vocabulary size."""
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    if model.get("type") != "BPE":
        sys.exit(f"{tok_dir}/tokenizer.json: model.type is {model.get('type')!r}; "
                 "need a byte-level BPE tokenizer (e.g. `strata demo-model --out DIR`)")
    n_vocab = cfg["vocab_size"]
    tokens = [None] * n_vocab
    types = [5] * n_vocab  # UNUSED
    for text, i in model["vocab"].items():
        if i >= n_vocab:
            sys.exit(f"{tok_dir}: token id {i} >= model vocab_size {n_vocab}; "
                     "use a smaller tokenizer or a larger shape")
        tokens[i], types[i] = text, 1  # NORMAL
    specials = {}
    for a in tj.get("added_tokens", []):
        i = a["id"]
        if i >= n_vocab:
            sys.exit(f"{tok_dir}: added token id {i} >= model vocab_size {n_vocab}")
        tokens[i], types[i] = a["content"], 3 if a.get("special") else 4  # CONTROL / USER_DEFINED
        specials[a["content"]] = i
    for i in range(n_vocab):
        if tokens[i] is None:
            tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    # bos/eos of the tokenizer we ship (the config's published ids are padding here).
    with open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)

    def special_id(field):
        v = tc.get(field)
        if isinstance(v, dict):
            v = v.get("content")
        return specials.get(v) if v else None

    kvs = [g_kv("tokenizer.ggml.model", T_STRING, "gpt2"),
           g_kv("tokenizer.ggml.pre", T_STRING,
                "qwen2" if cfg["model_type"] == "qwen2" else "llama-bpe"),
           g_array("tokenizer.ggml.tokens", T_STRING, tokens),
           g_array("tokenizer.ggml.token_type", T_INT32, types),
           g_array("tokenizer.ggml.merges", T_STRING, merges)]
    eos = special_id("eos_token")
    bos = special_id("bos_token")
    if eos is not None:
        kvs.append(g_kv("tokenizer.ggml.eos_token_id", T_UINT32, eos))
    if bos is not None:
        kvs.append(g_kv("tokenizer.ggml.bos_token_id", T_UINT32, bos))
    kvs.append(g_kv("tokenizer.ggml.add_bos_token", T_BOOL, False))
    return kvs


def gguf_model_kvs(cfg, name):
    arch = "qwen2" if cfg["model_type"] == "qwen2" else "llama"
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or h // nh
    kvs = [g_kv("general.architecture", T_STRING, arch),
           g_kv("general.name", T_STRING, name),
           g_kv("general.file_type", T_UINT32, 32),  # LLAMA_FTYPE_MOSTLY_BF16
           g_kv("general.alignment", T_UINT32, GGUF_ALIGN),
           g_kv(f"{arch}.context_length", T_UINT32, cfg["max_position_embeddings"]),
           g_kv(f"{arch}.embedding_length", T_UINT32, h),
           g_kv(f"{arch}.block_count", T_UINT32, cfg["num_hidden_layers"]),
           g_kv(f"{arch}.feed_forward_length", T_UINT32, cfg["intermediate_size"]),
           g_kv(f"{arch}.attention.head_count", T_UINT32, nh),
           g_kv(f"{arch}.attention.head_count_kv", T_UINT32, cfg["num_key_value_heads"]),
           g_kv(f"{arch}.attention.key_length", T_UINT32, hd),
           g_kv(f"{arch}.attention.value_length", T_UINT32, hd),
           g_kv(f"{arch}.rope.dimension_count", T_UINT32, hd),
           g_kv(f"{arch}.rope.freq_base", T_FLOAT32, cfg["rope_theta"]),
           g_kv(f"{arch}.attention.layer_norm_rms_epsilon", T_FLOAT32, cfg["rms_norm_eps"]),
           g_kv(f"{arch}.vocab_size", T_UINT32, cfg["vocab_size"])]
    return kvs


# ---- main -----------------------------------------------------------------


def write(shape, out, tok_dir, seed, std, fill="random", gguf=True):
    cfg = {k: v for k, v in SHAPES[shape].items() if v is not None}
    os.makedirs(out, exist_ok=True)
    tensors = layout(cfg)
    gen = generate_tiled if fill == "tiled" else generate

    # safetensors header: offsets follow the tensor order.
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        header[t.hf_name] = {"dtype": "BF16", "shape": t.shape,
                             "data_offsets": [off, off + 2 * t.numel]}
        off += 2 * t.numel
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    st_bytes = off

    # GGUF tensor infos: matrices BF16, 1-D F32 (what llama.cpp's converter
    # emits; ggml's CPU add/mul want F32 there). Dimensions innermost first.
    extra = []  # (name, float32 array) written after the model tensors
    if cfg.get("rope_scaling", {}).get("rope_type") == "llama3":
        extra.append(("rope_freqs.weight", llama3_rope_factors(cfg)))
    infos, goff = [], 0
    for t in tensors:
        ggml_type = GGML_BF16 if len(t.shape) == 2 else GGML_F32
        nbytes = t.numel * (2 if ggml_type == GGML_BF16 else 4)
        infos.append((t.gguf_name, t.shape[::-1], ggml_type, goff))
        goff = align(goff + nbytes)
    for name, arr in extra:
        infos.append((name, [arr.size], GGML_F32, goff))
        goff = align(goff + arr.nbytes)

    st_path = os.path.join(out, "model.safetensors")
    gg_path = os.path.join(out, "model-bf16.gguf")
    gg = None
    with open(st_path + ".tmp", "wb") as st:
        st.write(struct.pack("<Q", len(hjson)) + hjson)
        if gguf:
            meta = gguf_model_kvs(cfg, f"random {shape}") + gguf_tokenizer_kvs(tok_dir, cfg)
            ghead = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta)
            for name, dims, ggml_type, o in infos:
                ghead += g_str(name) + struct.pack("<I", len(dims))
                ghead += b"".join(struct.pack("<Q", d) for d in dims)
                ghead += struct.pack("<IQ", ggml_type, o)
            ghead += b"\0" * (align(len(ghead)) - len(ghead))
            gg = open(gg_path + ".tmp", "wb")
            gg.write(ghead)
            gbase = gg.tell()
        for t, (_, _, ggml_type, o) in zip(tensors, infos):
            if gg is None:
                for bits in gen(t, seed, std):
                    st.write(memoryview(bits))
                continue
            assert gg.tell() - gbase == o
            as_gguf = (lambda b: b) if ggml_type == GGML_BF16 else bf16_to_f32
            if t.permute_heads:  # small (q/k): materialise, permute rows for GGUF
                bits = np.concatenate(list(gen(t, seed, std)))
                st.write(memoryview(bits))
                rows = bits.reshape(t.shape[0], -1)
                gg.write(memoryview(as_gguf(np.ascontiguousarray(
                    rope_interleave(rows, t.permute_heads)).reshape(-1))))
            else:
                for bits in gen(t, seed, std):
                    st.write(memoryview(bits))
                    gg.write(memoryview(as_gguf(bits)))
            gg.write(b"\0" * (align(gg.tell() - gbase) - (gg.tell() - gbase)))
        if gg is not None:
            for (name, arr), (_, _, _, o) in zip(extra, infos[len(tensors):]):
                assert gg.tell() - gbase == o
                gg.write(arr.astype("<f4").tobytes())
                gg.write(b"\0" * (align(gg.tell() - gbase) - (gg.tell() - gbase)))
            gg.close()
    os.replace(st_path + ".tmp", st_path)
    if gg is not None:
        os.replace(gg_path + ".tmp", gg_path)

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = {"_from_model_config": True, "do_sample": False,
           "eos_token_id": cfg["eos_token_id"], "transformers_version": "4.45.0"}
    if "bos_token_id" in cfg:
        gen["bos_token_id"] = cfg["bos_token_id"]
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(out, name))
    params = sum(t.numel for t in tensors)
    print(json.dumps({"shape": shape, "dir": out, "gguf": gg_path if gguf else None, "params": params,
                      "weight_bytes_bf16": st_bytes}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, help="model directory to write (GGUF goes inside)")
    ap.add_argument("--tokenizer-dir", required=True,
                    help="directory with a byte-level BPE tokenizer.json + tokenizer_config.json "
                         "(e.g. from `strata demo-model --out DIR`)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weight-std", type=float, default=WEIGHT_STD,
                    help="std of the matrices (default 0.02, like trained checkpoints)")
    ap.add_argument("--fill", choices=["random", "tiled"], default="random",
                    help="random: every value drawn (the default; minutes for billions of "
                         "parameters); tiled: one random block per kind repeated (seconds, "
                         "disk-bound; for speed benchmarks of large shapes)")
    ap.add_argument("--no-gguf", action="store_true",
                    help="write only the Hugging Face directory (no model-bf16.gguf)")
    a = ap.parse_args()
    write(a.shape, a.out, a.tokenizer_dir, a.seed, a.weight_std, a.fill, not a.no_gguf)


if __name__ == "__main__":
    main()
