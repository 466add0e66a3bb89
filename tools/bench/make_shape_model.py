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

DeepSeek V4 shapes (deepseek-v4-scaled) get the safetensors directory only:
no GGUF (llama.cpp has no converter naming for it), and an I64 hash-routing
table (tid2eid: distinct experts per token) for their hash_moe layers.

  make_shape_model.py --params-of DIR   prints the model's parameter count and
                                        its active parameters per token (below)

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
    # DeepSeek-V4-Flash's layer structure at 1/4 of its width, 8 of its 43
    # layers and 32 of its 256 experts (~0.55 B parameters, ~0.19 B active),
    # in transformers 5.17's config dialect (tests/fixtures/models/deepseek_v4).
    # Published V4-Flash values (deepseek-ai/DeepSeek-V4-Flash, 284 B total,
    # 13 B active; read here from NeMo AutoModel's DeepseekV4Config defaults,
    # which state the release's config, from the yarn block of
    # trl-internal-testing/tiny-DeepseekV4ForCausalLM, and the layer pattern
    # from antirez/ds4's MODEL_CARD.md and a 5-layer cut of the release,
    # compress_ratios [0, 0, 4, 128, 4]; not from the Hub file itself), KEPT:
    #   head_dim 512, num_key_value_heads 1 (one shared K=V head), partial
    #   rotary 64 of 512 dims (factor 0.125), rope_theta 1e4 (sliding layers),
    #   compress rope: theta 1.6e5, yarn factor 16 over 65,536, beta 32 / 1;
    #   sliding_window 128, compress rates 4 (CSA, with indexer) and 128 (HCA);
    #   the layer pattern: layers 0-1 sliding only, then CSA on even and HCA on
    #   odd layers; num_hash_layers 3 (hash-routed MoE), the rest routed;
    #   experts per token 6 + 1 shared, sqrtsoftplus scores, routed_scaling 1.5,
    #   swiglu_limit 10; hc_mult 4 with 20 Sinkhorn iterations, hc_eps 1e-6;
    #   o_groups 8; index_head_dim 128; rms_norm_eps 1e-6; untied head;
    #   1 MTP layer in the config (no MTP weights written: Strata skips them,
    #   transformers ignores them).
    # SCALED (published -> here):
    #   hidden_size 4096 -> 1024, num_attention_heads 64 -> 16 (so heads x
    #   head_dim stays 8 x hidden), q_lora_rank 1024 -> 256, o_lora_rank 1024
    #   -> 256, moe_intermediate_size 2048 -> 512, index_n_heads 64 -> 16,
    #   vocab_size 129280 -> 32320 (all / 4); num_hidden_layers 43 -> 8
    #   (2 sliding, 3 CSA, 3 HCA); n_routed_experts 256 -> 32 (so a 512-token
    #   prefill still spreads ~100 tokens over each expert); index_topk 512 ->
    #   64 (512 of the published 1M-token context's 262k compressed entries;
    #   64 of a 512-token prompt's 128 keep the indexer's choice real).
    "deepseek-v4-scaled": {
        "architectures": ["DeepseekV4ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "compress_rates": {"compressed_sparse_attention": 4,
                           "heavily_compressed_attention": 128},
        "compress_rope_theta": 160000.0,
        "dtype": "bfloat16",
        "eos_token_id": 1,
        "hc_eps": 1e-06,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "head_dim": 512,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "index_head_dim": 128,
        "index_n_heads": 16,
        "index_topk": 64,
        "initializer_range": 0.02,
        "layer_types": ["sliding_attention", "sliding_attention"]
                       + ["compressed_sparse_attention", "heavily_compressed_attention"] * 3,
        "max_position_embeddings": 1048576,
        "mlp_bias": False,
        "mlp_layer_types": ["hash_moe"] * 3 + ["moe"] * 5,
        "model_type": "deepseek_v4",
        "moe_intermediate_size": 512,
        "n_routed_experts": 32,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 8,
        "num_key_value_heads": 1,
        "num_nextn_predict_layers": 1,
        "o_groups": 8,
        "o_lora_rank": 256,
        "partial_rotary_factor": 0.125,
        "q_lora_rank": 256,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "main": {"partial_rotary_factor": 0.125, "rope_theta": 10000.0,
                     "rope_type": "default"},
            "compress": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                         "original_max_position_embeddings": 65536,
                         "partial_rotary_factor": 0.125, "rope_theta": 160000.0,
                         "rope_type": "yarn"},
        },
        "rope_theta": 10000.0,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "sliding_window": 128,
        "swiglu_limit": 10.0,
        "tie_word_embeddings": False,
        "transformers_version": "5.17.0",
        "use_cache": True,
        "vocab_size": 32320,
    },
    # The dense yardstick for deepseek-v4-scaled: a Llama layout with the same
    # hidden size, vocabulary and untied head, and as many parameters read per
    # token (~0.19 B, --params-of): 12 layers, intermediate 3.5 x hidden,
    # 16 heads of 64 with 4 KV heads.
    "dense-v4-active": {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": 0,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 16,
        "num_hidden_layers": 12,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 32320,
    },
}

# deepseek-v4-scaled's layout at toy width (same layer types, hash layers,
# hyper-connections, compress rates): for the test that make_shape_model.py
# writes what src/model/deepseek_v4.cc loads (tools/bench/shape_models_test.sh).
SHAPES["deepseek-v4-tiny"] = {
    **SHAPES["deepseek-v4-scaled"],
    "hidden_size": 64, "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 8,
    "q_lora_rank": 32,
    "o_lora_rank": 16, "moe_intermediate_size": 32, "n_routed_experts": 8,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8, "sliding_window": 16,
    "vocab_size": 2048,
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
        self.kind = kind  # "matrix" | "norm" | "bias" | "hash" (I64 expert ids)
        self.permute_heads = permute_heads  # >0: llama rope layout for GGUF

    @property
    def numel(self):
        return int(np.prod(self.shape))

    @property
    def dtype(self):
        return "I64" if self.kind == "hash" else "BF16"

    @property
    def nbytes(self):
        return self.numel * (8 if self.kind == "hash" else 2)


def layout(cfg):
    """Tensors in file order (the order safetensors writers use is irrelevant)."""
    if cfg["model_type"] == "deepseek_v4":
        return layout_deepseek_v4(cfg)
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


def layout_deepseek_v4(cfg):
    """The tensors src/model/deepseek_v4.cc binds (names and shapes as
    transformers 5.17 saves DeepseekV4ForCausalLM); no GGUF names."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    nh, hd = cfg["num_attention_heads"], cfg["head_dim"]
    n, ql = cfg["hc_mult"], cfg["q_lora_rank"]
    og, ol = cfg["o_groups"], cfg["o_lora_rank"]
    ih, idim = cfg["index_n_heads"], cfg["index_head_dim"]
    e, k, ff = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    rates = cfg["compress_rates"]
    mix = (2 + n) * n  # hyper-connection outputs: pre, post, and the n x n comb

    def t(name, shape, kind):
        return Tensor(name, shape, None, kind)

    def mlp(p):
        return [t(p + "w1.weight", [ff, h], "matrix"), t(p + "w3.weight", [ff, h], "matrix"),
                t(p + "w2.weight", [h, ff], "matrix")]

    def compressor(p, dim, rate, overlap):
        width = 2 * dim if overlap else dim
        return [t(p + "wkv.weight", [width, h], "matrix"), t(p + "wgate.weight", [width, h], "matrix"),
                t(p + "ape", [rate, width], "bias"), t(p + "norm.weight", [dim], "norm")]

    ts = [t("model.embed_tokens.weight", [v, h], "matrix"),
          t("model.hc_head.hc_fn", [n, n * h], "matrix"),
          t("model.hc_head.hc_base", [n], "bias"),
          t("model.hc_head.hc_scale", [1], "bias")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a, f = p + "attn.", p + "ffn."
        kind = cfg["layer_types"][i]
        ts += [t(p + "attn_norm.weight", [h], "norm"), t(p + "ffn_norm.weight", [h], "norm")]
        for block in ("attn", "ffn"):
            ts += [t(p + f"hc_{block}_fn", [mix, n * h], "matrix"),
                   t(p + f"hc_{block}_base", [mix], "bias"),
                   t(p + f"hc_{block}_scale", [3], "bias")]
        ts += [t(a + "wq_a.weight", [ql, h], "matrix"), t(a + "q_norm.weight", [ql], "norm"),
               t(a + "wq_b.weight", [nh * hd, ql], "matrix"), t(a + "wkv.weight", [hd, h], "matrix"),
               t(a + "norm.weight", [hd], "norm"),
               t(a + "wo_a.weight", [og * ol, nh * hd // og], "matrix"),
               t(a + "wo_b.weight", [h, og * ol], "matrix"), t(a + "attn_sink", [nh], "bias")]
        if kind == "compressed_sparse_attention":
            rate = rates["compressed_sparse_attention"]
            ts += compressor(a + "compressor.", hd, rate, True)
            ts += compressor(a + "indexer.compressor.", idim, rate, True)
            ts += [t(a + "indexer.wq_b.weight", [ih * idim, ql], "matrix"),
                   t(a + "indexer.weights_proj.weight", [ih, h], "matrix")]
        elif kind == "heavily_compressed_attention":
            ts += compressor(a + "compressor.", hd, rates["heavily_compressed_attention"], False)
        ts.append(t(f + "gate.weight", [e, h], "matrix"))
        if cfg["mlp_layer_types"][i] == "hash_moe":
            ts.append(t(f + "gate.tid2eid", [v, k], "hash"))
        else:
            ts.append(t(f + "gate.bias", [e], "bias"))  # e_score_correction_bias
        ts += mlp(f + "shared_experts.")
        for x in range(e):
            ts += mlp(f + f"experts.{x}.")
    ts.append(t("model.norm.weight", [h], "norm"))
    if not cfg["tie_word_embeddings"]:
        ts.append(t("head.weight", [v, h], "matrix"))
    return ts


def active_params(cfg, shapes):
    """(parameters, parameters read per decoded token) of a model's float
    tensors {name: shape}: everything, except that the embedding table
    counts one row and each routed expert num_experts_per_tok / n_routed
    (the shared expert counts whole). Integer tables (tid2eid) are lookups,
    not parameters."""
    total = active = 0.0
    frac = cfg.get("num_experts_per_tok", 0) / cfg.get("n_routed_experts", 1)
    for name, shape in shapes.items():
        numel = int(np.prod(shape))
        total += numel
        if "embed_tokens" in name:
            active += shape[-1]
            if cfg.get("tie_word_embeddings"):
                active += numel  # the same table is the head
        elif ".experts." in name:
            active += numel * frac
        else:
            active += numel
    return int(total), int(active)


def params_of(model_dir):
    """--params-of: counts from a model directory's config and safetensors headers."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    shapes = {}
    for name in sorted(os.listdir(model_dir)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for k, meta in header.items():
            if k != "__metadata__" and meta["dtype"] in ("BF16", "F16", "F32"):
                shapes[k] = meta["shape"]
    if not shapes:
        sys.exit(f"{model_dir}: no float tensors in *.safetensors")
    total, active = active_params(cfg, shapes)
    print(json.dumps({"dir": model_dir, "architecture": cfg["architectures"][0],
                      "params": total, "active_params": active}))


def generate(t, seed, std, cfg):
    """Yields the tensor's bf16 bits in row-major chunks; deterministic per name."""
    rng = np.random.default_rng([seed, zlib.crc32(t.hf_name.encode())])
    if t.kind == "hash":  # token id -> k distinct experts, like a real table
        rows, k = t.shape
        for r0 in range(0, rows, 4096):
            keys = rng.random((min(4096, rows - r0), cfg["n_routed_experts"]), dtype=np.float32)
            yield np.argsort(keys, axis=1)[:, :k].astype("<i8")
        return
    left = t.numel
    while left:
        n = min(left, CHUNK)
        yield values(rng, n, t.kind, std)
        left -= n


_tiles = {}


def generate_tiled(t, seed, std, cfg):
    """Like generate(), but every tensor of a kind repeats one random block of
    TILE values, entered at an offset from the tensor's name: 8 B parameters
    in seconds (numpy draws ~0.2 G values/s) and disk-bound. Fine for speed;
    rows repeat every TILE / cols rows, so not for anything that needs
    independent weights."""
    if t.kind == "hash":  # a routing table, not values: drawn as generate() does
        yield from generate(t, seed, std, cfg)
        return
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


def write(shape, out, tok_dir, seed, std, gguf, fill="random"):
    cfg = {k: v for k, v in SHAPES[shape].items() if v is not None}
    gguf = gguf and cfg["model_type"] in ("qwen2", "llama")  # the GGUF writer knows these
    os.makedirs(out, exist_ok=True)
    tensors = layout(cfg)
    gen = generate_tiled if fill == "tiled" else generate

    # safetensors header: offsets follow the tensor order.
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        header[t.hf_name] = {"dtype": t.dtype, "shape": t.shape,
                             "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    st_bytes = off

    st_path = os.path.join(out, "model.safetensors")
    gg_path = os.path.join(out, "model-bf16.gguf")
    if gguf:
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
        meta = gguf_model_kvs(cfg, f"random {shape}") + gguf_tokenizer_kvs(tok_dir, cfg)
        ghead = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta)
        for name, dims, ggml_type, o in infos:
            ghead += g_str(name) + struct.pack("<I", len(dims))
            ghead += b"".join(struct.pack("<Q", d) for d in dims)
            ghead += struct.pack("<IQ", ggml_type, o)
        ghead += b"\0" * (align(len(ghead)) - len(ghead))

    with open(st_path + ".tmp", "wb") as st, \
            open(gg_path + ".tmp" if gguf else os.devnull, "wb") as gg:
        st.write(struct.pack("<Q", len(hjson)) + hjson)
        if not gguf:
            for t in tensors:
                for bits in gen(t, seed, std, cfg):
                    st.write(memoryview(bits))
        else:
            gg.write(ghead)
            gbase = gg.tell()
            for t, (_, _, ggml_type, o) in zip(tensors, infos):
                assert gg.tell() - gbase == o
                as_gguf = (lambda b: b) if ggml_type == GGML_BF16 else bf16_to_f32
                if t.permute_heads:  # small (q/k): materialise, permute rows for GGUF
                    bits = np.concatenate(list(gen(t, seed, std, cfg)))
                    st.write(memoryview(bits))
                    rows = bits.reshape(t.shape[0], -1)
                    gg.write(memoryview(as_gguf(np.ascontiguousarray(
                        rope_interleave(rows, t.permute_heads)).reshape(-1))))
                else:
                    for bits in gen(t, seed, std, cfg):
                        st.write(memoryview(bits))
                        gg.write(memoryview(as_gguf(bits)))
                gg.write(b"\0" * (align(gg.tell() - gbase) - (gg.tell() - gbase)))
            for (name, arr), (_, _, _, o) in zip(extra, infos[len(tensors):]):
                assert gg.tell() - gbase == o
                gg.write(arr.astype("<f4").tobytes())
                gg.write(b"\0" * (align(gg.tell() - gbase) - (gg.tell() - gbase)))
    os.replace(st_path + ".tmp", st_path)
    if gguf:
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
    params, active = active_params(cfg, {t.hf_name: t.shape for t in tensors if t.kind != "hash"})
    print(json.dumps({"shape": shape, "dir": out, "gguf": gg_path if gguf else None,
                      "params": params, "active_params": active, "weight_bytes_bf16": st_bytes}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params-of", metavar="DIR",
                    help="print the parameters and active parameters per token of the model "
                         "in DIR (config.json + *.safetensors) and exit")
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--out", help="model directory to write (GGUF goes inside)")
    ap.add_argument("--tokenizer-dir",
                    help="directory with a byte-level BPE tokenizer.json + tokenizer_config.json "
                         "(e.g. from `strata demo-model --out DIR`)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weight-std", type=float, default=WEIGHT_STD,
                    help="std of the matrices (default 0.02, like trained checkpoints)")
    ap.add_argument("--no-gguf", action="store_true",
                    help="write the safetensors directory only (DeepSeek V4 shapes never get a GGUF)")
    ap.add_argument("--fill", choices=["random", "tiled"], default="random",
                    help="random: every value drawn (the default; minutes for billions of "
                         "parameters); tiled: one random block per kind repeated (seconds, "
                         "disk-bound; for speed benchmarks of large shapes)")
    a = ap.parse_args()
    if a.params_of:
        params_of(a.params_of)
        return
    if not (a.shape and a.out and a.tokenizer_dir):
        ap.error("--shape, --out and --tokenizer-dir are required (or --params-of DIR)")
    write(a.shape, a.out, a.tokenizer_dir, a.seed, a.weight_std, not a.no_gguf, a.fill)


if __name__ == "__main__":
    main()
