#!/usr/bin/env python3
"""Writes tiny random Hugging Face models plus golden greedy outputs as test fixtures.

Run on a machine with torch + transformers (5.x) + tokenizers + safetensors:

    PYTHONUNBUFFERED=1 python3 tools/reference/make_model_fixtures.py --out /tmp/fx

It writes <out>/<model>/ for every model in MODELS (config.json, safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json, golden.json, and
chat_template.jinja for the transformers-5 dialect), plus <out>/log.txt and
<out>/manifest.json describing what was written. The result is committed under
tests/fixtures/models/ (see the README there).

How the models are made (see shared/TESTING.md for why):
  * one byte-level BPE tokenizer, trained here on the embedded CORPUS, shared by all;
  * weights drawn with std 0.1 (embeddings/lm_head 0.2), norm weights 1 + 0.1*randn,
    biases 0.1*randn, so logits are not flat; embedding/lm_head rows past the
    tokenizer's vocabulary are zero (never chosen, like padded vocab rows);
  * saved in the checkpoint dtype (bf16, fp16 or fp32), then the post-processed
    directory is reloaded and goldens are computed from it in float32 with eager
    attention on the CPU;
  * every golden is cross-checked against the in-memory model (original config,
    same rounded weights), and against a KV-cache decode loop.

Everything is seeded; a failure in one model is logged and does not stop the others.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback

import torch

LOG = None
MANIFEST = {}

SPECIALS = ["<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB = 480  # trained BPE size, specials included
MODEL_VOCAB = 512      # tokenizer vocab rounded up, like padded vocabularies
PROMPT_LENGTHS = [1, 2, 5, 17, 64, 200, 511, 1000]
NEW_TOKENS = 24
TEXT_NEW_TOKENS = 16
TOP_K = 5
NEAR_TIE = 1e-3

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TEXT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Grüße aus Köln — 東京 🚀 ok?",
]

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three colours, please."},
]

CORPUS = """\
The quick brown fox jumps over the lazy dog. A serving engine batches requests,
keeps the key-value cache in pages, and streams tokens back to the client as soon
as they are sampled. When the cache runs out of pages, the scheduler preempts the
youngest request and resumes it later. Operators want clear errors, stable metrics,
and a server that sheds load instead of letting its queues grow without bound.
Once upon a time there was a little model that could only speak in random tokens.
It read the same sentence again and again, and every time it read the sentence it
learned a new merge. The merges were small at first: th, he, in, er, an, on, the.
Later they grew into whole words like request, response, token, model and cache.
Numbers appear too: 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 65536 3.14159 -1 1e-5.
Prefill processes the whole prompt at once; decode produces one token per step.
The attention of each head looks back over all previous positions in the sequence.

def add(a, b):
    return a + b

def softmax(xs):
    m = max(xs)
    exps = [math.exp(x - m) for x in xs]
    total = sum(exps)
    return [e / total for e in exps]

class Cache:
    def __init__(self, pages):
        self.pages = pages
        self.free = list(range(pages))

    def allocate(self, n):
        if n > len(self.free):
            raise MemoryError("out of pages")
        taken, self.free = self.free[:n], self.free[n:]
        return taken

int main(int argc, char** argv) {
  std::vector<int> tokens = {1, 2, 3};
  for (int i = 0; i < argc; ++i) {
    std::printf("%s\\n", argv[i]);
  }
  return 0;
}

{"model": "tiny", "layers": 2, "heads": 4, "rope_theta": 10000.0, "ok": true}

Grüße aus Köln! Schöne Straße, größere Äpfel, Übermut und Öl.
Le café est très bon, la crème brûlée aussi. ¿Dónde está la biblioteca? Ça va.
Привет, мир! Как дела? Всё хорошо, спасибо.
東京は日本の首都です。今日は良い天気ですね。大阪、京都、名古屋。
你好，世界！我们今天学习机器学习。
안녕하세요, 세계! 감사합니다.
Emoji: 🚀 🙂 🎉 ✅ ❤️ 👍🏽 — and symbols: € £ ¥ ° ± × ÷ → ← ≤ ≥ ∞ ∑ π.
"""


def log(*args):
    text = " ".join(str(a) for a in args)
    print(text, flush=True)
    if LOG is not None:
        LOG.write(text + "\n")
        LOG.flush()


# --------------------------------------------------------------------------------------
# Tokenizer


def build_tokenizer():
    """Trains the shared byte-level BPE; returns a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.splitlines(keepends=True)
    tok.train_from_iterator(lines * 3, trainer=trainer)
    bos_id = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A",
        pair="<|bos|> $A <|bos|> $B",
        special_tokens=[("<|bos|>", bos_id)],
    )
    log(f"tokenizer: trained vocab {tok.get_vocab_size()} "
        f"(specials {[tok.token_to_id(s) for s in SPECIALS]})")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# --------------------------------------------------------------------------------------
# Model specs


def model_specs(tok):
    bos = tok.convert_tokens_to_ids("<|bos|>")
    eos = tok.convert_tokens_to_ids("<|eos|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    common = dict(
        vocab_size=MODEL_VOCAB,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=bos,
        eos_token_id=eos,
        hidden_act="silu",
    )
    return [
        dict(name="llama_default", cls="LlamaForCausalLM", config_cls="LlamaConfig",
             dialect="published", save_dtype=torch.bfloat16, shard=None, seed=101,
             gen_eos=eos,
             config=dict(common, intermediate_size=128, num_hidden_layers=2, rms_norm_eps=1e-5,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
             published_rope_key=None),
        dict(name="llama_linear", cls="LlamaForCausalLM", config_cls="LlamaConfig",
             dialect="published", save_dtype=torch.float16, shard=None, seed=102,
             gen_eos=eos,
             config=dict(common, intermediate_size=128, num_hidden_layers=2, rms_norm_eps=1e-5,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                          "factor": 2.0}),
             published_rope_key="type"),
        dict(name="llama3_rope", cls="LlamaForCausalLM", config_cls="LlamaConfig",
             dialect="transformers5", save_dtype=torch.bfloat16, shard="200KB", seed=103,
             gen_eos=[eos, im_end],
             config=dict(common, intermediate_size=192, num_hidden_layers=3, rms_norm_eps=1e-5,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                          "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 256})),
        dict(name="mistral", cls="MistralForCausalLM", config_cls="MistralConfig",
             dialect="published", save_dtype=torch.float32, shard=None, seed=104,
             gen_eos=eos,
             config=dict(common, intermediate_size=128, num_hidden_layers=2, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, sliding_window=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
             published_rope_key=None),
        dict(name="qwen2", cls="Qwen2ForCausalLM", config_cls="Qwen2Config",
             dialect="published", save_dtype=torch.bfloat16, shard=None, seed=105,
             gen_eos=[im_end, eos],
             config=dict(common, intermediate_size=160, num_hidden_layers=2, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
             published_rope_key=None,
             # Real Qwen2.5 configs carry a sliding_window value that is switched off by
             # use_sliding_window=false; a small value here makes ignoring it testable.
             published_extra={"use_sliding_window": False, "sliding_window": 32,
                              "max_window_layers": 2}),
        dict(name="qwen3", cls="Qwen3ForCausalLM", config_cls="Qwen3Config",
             dialect="transformers5", save_dtype=torch.bfloat16, shard=None, seed=106,
             gen_eos=[im_end, eos],
             config=dict(common, intermediate_size=160, num_hidden_layers=2, rms_norm_eps=1e-6,
                         head_dim=32, tie_word_embeddings=False, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        # DeepSeek V3: MLA (q low-rank, latent KV, interleaved partial rope with yarn), a
        # dense first layer, then MoE layers with group-limited sigmoid routing. Published
        # dialect like the real checkpoint ("rope_scaling" with "type": "yarn"), bf16, and
        # one multi-token-prediction layer appended the way DeepSeek ships it.
        dict(name="deepseek_v3", cls="DeepseekV3ForCausalLM", config_cls="DeepseekV3Config",
             dialect="published", save_dtype=torch.bfloat16, shard=None, seed=107,
             gen_eos=eos, published_rope_key="type", mtp_layers=1,
             config=dict(common, num_key_value_heads=4, intermediate_size=128,
                         moe_intermediate_size=32, num_hidden_layers=3, first_k_dense_replace=1,
                         n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                         n_group=4, topk_group=2, routed_scaling_factor=2.5,
                         norm_topk_prob=True, kv_lora_rank=32, q_lora_rank=48,
                         qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=24,
                         rope_interleave=True, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         num_mtp_layers=1,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                          "factor": 4.0, "original_max_position_embeddings": 512,
                                          "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                          "mscale_all_dim": 1.0})),
        # The V2-Lite shape of the same architecture: no q low-rank (q_proj), default rope
        # without interleaving, no group limit, unnormalised top-k weights; fp32, v5 dialect.
        dict(name="deepseek_v3_lite", cls="DeepseekV3ForCausalLM", config_cls="DeepseekV3Config",
             dialect="transformers5", save_dtype=torch.float32, shard=None, seed=108,
             gen_eos=[im_end, eos],
             config=dict(common, num_key_value_heads=4, intermediate_size=96,
                         moe_intermediate_size=24, num_hidden_layers=3, first_k_dense_replace=2,
                         n_routed_experts=6, n_shared_experts=2, num_experts_per_tok=3,
                         n_group=1, topk_group=1, routed_scaling_factor=1.0,
                         norm_topk_prob=False, kv_lora_rank=24, q_lora_rank=None,
                         qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                         rope_interleave=False, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         num_mtp_layers=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        # DeepSeek V4 (the incident's model family): sliding window + compressed sparse
        # attention (rate 4, indexer) + heavily compressed attention (rate 128),
        # hyper-connections, hash-routed and sqrtsoftplus-routed MoE. References for the
        # V4 implementation; bf16, v5 dialect.
        dict(name="deepseek_v4", cls="DeepseekV4ForCausalLM", config_cls="DeepseekV4Config",
             dialect="transformers5", save_dtype=torch.bfloat16, shard=None, seed=109,
             gen_eos=eos,
             config=dict(common, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
                         moe_intermediate_size=32, num_hidden_layers=4,
                         layer_types=["sliding_attention", "compressed_sparse_attention",
                                      "heavily_compressed_attention",
                                      "compressed_sparse_attention"],
                         mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                         compress_rates={"compressed_sparse_attention": 4,
                                         "heavily_compressed_attention": 128},
                         n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                         routed_scaling_factor=1.5, hc_mult=2, hc_sinkhorn_iters=20,
                         sliding_window=16, o_groups=2, o_lora_rank=16, index_n_heads=2,
                         index_head_dim=16, index_topk=8, partial_rotary_factor=0.25,
                         swiglu_limit=10.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         rope_theta=10000.0, compress_rope_theta=160000.0)),
    ]


DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


# --------------------------------------------------------------------------------------
# Weights


@torch.no_grad()
def randomise(model, seed, tokenizer_vocab):
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        shape = p.shape
        if name.endswith("bias"):
            v = 0.1 * torch.randn(shape, generator=gen)
        elif "norm" in name and name.endswith("weight"):
            v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif "embed_tokens" in name or "lm_head" in name:
            v = 0.2 * torch.randn(shape, generator=gen)
            v[tokenizer_vocab:] = 0.0
        else:
            v = 0.1 * torch.randn(shape, generator=gen)
        p.copy_(v.to(p.dtype))
    # Persistent buffers that real checkpoints carry: the MoE router's score
    # correction bias (zeros would leave it untested) and V4's hash-routing table
    # (token id -> experts; distinct experts per token, like a real table).
    for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
        if name.endswith("e_score_correction_bias"):
            b.copy_((0.1 * torch.randn(b.shape, generator=gen)).to(b.dtype))
        elif name.endswith("tid2eid"):
            n_experts = model.config.n_routed_experts
            rows = [torch.randperm(n_experts, generator=gen)[: b.shape[1]] for _ in range(b.shape[0])]
            b.copy_(torch.stack(rows).to(b.dtype))


# --------------------------------------------------------------------------------------
# Golden computation


@torch.no_grad()
def last_logprobs(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return torch.log_softmax(out.logits[0, -1].float(), dim=-1)


def step_record(lp):
    vals, idx = torch.topk(lp, TOP_K)
    top = [[int(i), round(float(v), 6)] for v, i in zip(vals, idx)]
    return {"token": top[0][0], "logprob": top[0][1], "top": top,
            "margin": round(float(vals[0] - vals[1]), 6)}


@torch.no_grad()
def greedy_full(model, prompt, n):
    """Greedy decode by full recompute each step; returns step records."""
    ids = list(prompt)
    steps = []
    for _ in range(n):
        rec = step_record(last_logprobs(model, ids))
        steps.append(rec)
        ids.append(rec["token"])
    return steps


@torch.no_grad()
def greedy_cached(model, prompt, n):
    """Greedy decode with the model's KV cache; returns (tokens, per-step logprob vectors)."""
    out = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True)
    past = out.past_key_values
    lps, toks = [], []
    lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
    for i in range(n):
        tok = int(torch.argmax(lp))
        lps.append(lp)
        toks.append(tok)
        if i + 1 == n:
            break
        out = model(input_ids=torch.tensor([[tok]], dtype=torch.long), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
        lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
    return toks, lps


def compare_steps(a, b):
    """Max |logprob diff| over the top-k entries of a, and first token mismatch (or None)."""
    worst, mismatch = 0.0, None
    for i, (sa, sb) in enumerate(zip(a, b)):
        if sa["token"] != sb["token"]:
            mismatch = i
            break
        for (ia, va), (ib, vb) in zip(sa["top"], sb["top"]):
            if ia == ib:
                worst = max(worst, abs(va - vb))
    return worst, mismatch


def random_prompts(tok_len):
    gen = torch.Generator().manual_seed(20240607)
    lo = len(SPECIALS)
    return [torch.randint(lo, tok_len, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


# --------------------------------------------------------------------------------------
# Dialect post-processing


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def to_published_config(spec, d):
    cfg_path = os.path.join(d, "config.json")
    cfg = read_json(cfg_path)
    out = {}
    for k, v in cfg.items():
        if k == "dtype":
            out["torch_dtype"] = v
        elif k == "rope_parameters":
            rp = dict(v)
            out["rope_theta"] = rp.pop("rope_theta")
            rtype = rp.pop("rope_type", "default")
            if rtype == "default":
                out["rope_scaling"] = None
            else:
                key = spec.get("published_rope_key") or "rope_type"
                out["rope_scaling"] = {key: rtype, **rp}
        elif k == "layer_types" and all(t == "full_attention" for t in v):
            continue  # v5-only key; published full-attention configs do not have it
        else:
            out[k] = v
    if "rope_theta" not in out:
        raise RuntimeError(f"{cfg_path}: no rope_parameters written; keys {sorted(cfg)}")
    out["torch_dtype"] = DTYPE_NAMES[spec["save_dtype"]]
    out.update(spec.get("published_extra", {}))
    write_json(cfg_path, out)
    return cfg, out


def to_v5_config(spec, d):
    cfg_path = os.path.join(d, "config.json")
    cfg = read_json(cfg_path)
    out = dict(cfg)
    out.pop("torch_dtype", None)
    out["dtype"] = DTYPE_NAMES[spec["save_dtype"]]
    if "rope_parameters" not in out:
        raise RuntimeError(f"{cfg_path}: transformers did not write rope_parameters; keys {sorted(cfg)}")
    write_json(cfg_path, out)
    return cfg, out


def place_chat_template(d, dialect):
    """Published: template inside tokenizer_config.json. transformers 5: chat_template.jinja."""
    tc_path = os.path.join(d, "tokenizer_config.json")
    jinja_path = os.path.join(d, "chat_template.jinja")
    tc = read_json(tc_path)
    wrote = {"jinja_file": os.path.exists(jinja_path), "in_tokenizer_config": "chat_template" in tc,
             "tokenizer_class": tc.get("tokenizer_class")}
    template = tc.get("chat_template")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    if template != CHAT_TEMPLATE:
        log(f"  note: saved template differs from the source template: {template!r}")
    # Decoding must not depend on a library default that changed between versions.
    tc["clean_up_tokenization_spaces"] = False
    if dialect == "published":
        # Shape of a tokenizer_config.json written by transformers 4.x.
        tc.pop("backend", None)
        tc["added_tokens_decoder"] = {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, t in enumerate(SPECIALS)}
        tc["chat_template"] = CHAT_TEMPLATE
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
        if os.path.exists(jinja_path):
            os.remove(jinja_path)
    else:
        tc.pop("chat_template", None)
        with open(jinja_path, "w", encoding="utf-8") as f:
            f.write(CHAT_TEMPLATE)
    write_json(tc_path, tc)
    return wrote


def add_mtp_layers(d, num_layers, count, hidden, seed):
    """Appends multi-token-prediction layers the way DeepSeek's checkpoints carry them
    (model.layers.<num_layers + i>.*: a decoder layer plus enorm, hnorm, eh_proj and a
    shared head). transformers never builds them; an engine must skip them explicitly."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(d, "model.safetensors")
    tensors = load_file(path)
    gen = torch.Generator().manual_seed(seed + 1000)
    src = f"model.layers.{num_layers - 1}."
    dtype = tensors["model.embed_tokens.weight"].dtype
    for i in range(count):
        dst = f"model.layers.{num_layers + i}."
        for name in [n for n in tensors if n.startswith(src)]:
            tensors[dst + name[len(src):]] = tensors[name].clone()
        tensors[dst + "enorm.weight"] = torch.ones(hidden, dtype=dtype)
        tensors[dst + "hnorm.weight"] = torch.ones(hidden, dtype=dtype)
        tensors[dst + "eh_proj.weight"] = (0.1 * torch.randn(hidden, 2 * hidden, generator=gen)).to(dtype)
        tensors[dst + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors[dst + "shared_head.norm.weight"] = torch.ones(hidden, dtype=dtype)
        tensors[dst + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})
    log(f"  appended {count} MTP layer(s) at model.layers.{num_layers}")


def ensure_sharded(d, max_bytes):
    """If save_pretrained wrote a single file, split it into shards with an index."""
    from safetensors.torch import load_file, save_file

    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        return "transformers"
    single = os.path.join(d, "model.safetensors")
    tensors = load_file(single)
    groups, cur, cur_bytes = [], [], 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if cur and cur_bytes + nbytes > max_bytes:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += nbytes
    groups.append(cur)
    weight_map, total = {}, 0
    for i, names in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in names}, os.path.join(d, fname),
                  metadata={"format": "pt"})
        for n in names:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": weight_map})
    os.remove(single)
    return "manual"


def describe_dir(d):
    from safetensors import safe_open

    files = {}
    tensors = {}
    for fname in sorted(os.listdir(d)):
        path = os.path.join(d, fname)
        files[fname] = os.path.getsize(path)
        if fname.endswith(".safetensors"):
            with safe_open(path, framework="pt") as f:
                meta = f.metadata()
                for k in f.keys():
                    sl = f.get_slice(k)
                    tensors[k] = {"file": fname, "dtype": str(sl.get_dtype()),
                                  "shape": list(sl.get_shape())}
            files[fname + ":metadata"] = meta
    return files, tensors


# --------------------------------------------------------------------------------------
# One model


def load_from_dir(d):
    from transformers import AutoModelForCausalLM

    try:
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    return m.float().eval()


def make_model(spec, tok, root, prompts):
    import transformers
    from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

    name = spec["name"]
    d = os.path.join(root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    tok_len = len(tok)
    t0 = time.time()

    config_cls = getattr(transformers, spec["config_cls"])
    model_cls = getattr(transformers, spec["cls"])
    config = config_cls(**spec["config"])
    try:
        config._attn_implementation = "eager"
    except Exception as e:  # noqa: BLE001
        log(f"  note: cannot set eager on config: {e}")
    torch.manual_seed(spec["seed"])
    model = model_cls(config).float().eval()
    randomise(model, spec["seed"], tok_len)
    log(f"  built {spec['cls']} params={sum(p.numel() for p in model.parameters())} "
        f"rope={getattr(config, 'rope_parameters', None)}")

    # Round to the checkpoint dtype and save.
    model = model.to(spec["save_dtype"])
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=spec["gen_eos"], do_sample=False)
    if spec["shard"]:
        model.save_pretrained(d, max_shard_size=spec["shard"])
        how = ensure_sharded(d, 200 * 1024)
        log(f"  sharded by {how}")
    else:
        model.save_pretrained(d)
    if spec.get("mtp_layers"):
        add_mtp_layers(d, spec["config"]["num_hidden_layers"], spec["mtp_layers"],
                       spec["config"]["hidden_size"], spec["seed"])
    # Same generation config written regardless of what save_pretrained chose to write.
    model.generation_config.save_pretrained(d)
    tok.save_pretrained(d)
    for extra in ("special_tokens_map.json",):
        if os.path.exists(os.path.join(d, extra)):
            log(f"  tokenizer also wrote {extra}")

    # Same rounded weights and the original in-memory config, in a fresh fp32 model:
    # model.to(bf16) also rounded non-persistent buffers (rotary inv_freq), which a
    # checkpoint never carries, so `model.float()` would not be a faithful reference.
    mem_model = model_cls(config).float().eval()
    mem_model.load_state_dict({k: v.float() for k, v in model.state_dict().items()})

    if spec["dialect"] == "published":
        written, final = to_published_config(spec, d)
    else:
        written, final = to_v5_config(spec, d)
    template_info = place_chat_template(d, spec["dialect"])
    log(f"  transformers wrote config keys: {sorted(written)}")
    log(f"  final config keys: {sorted(final)}")
    log(f"  tokenizer save: {template_info}")

    # Reload the post-processed directory: that is what the engine reads.
    ref = load_from_dir(d)
    # PreTrainedTokenizerFast reads tokenizer.json as is; AutoTokenizer may pick a
    # model-specific class (it picks Qwen2Tokenizer for model_type qwen2), so it is
    # only cross-checked below.
    rtok = PreTrainedTokenizerFast.from_pretrained(d)
    atok = AutoTokenizer.from_pretrained(d)
    log(f"  reloaded {type(ref).__name__}, tokenizer {type(rtok).__name__} "
        f"(AutoTokenizer: {type(atok).__name__}), "
        f"rope={getattr(ref.config, 'rope_parameters', None)}")
    if spec["name"] == "qwen2":
        log(f"  reloaded qwen2 sliding_window={getattr(ref.config, 'sliding_window', None)} "
            f"use_sliding_window={getattr(ref.config, 'use_sliding_window', None)} "
            f"layer_types={getattr(ref.config, 'layer_types', None)}")

    # Weights identical after the save/load round trip?
    msd, rsd = mem_model.state_dict(), ref.state_dict()
    bad = [k for k in rsd if k not in msd or not torch.equal(rsd[k].float(), msd[k].float())]
    missing = [k for k in msd if k not in rsd]
    if bad or missing:
        raise RuntimeError(f"weights differ after reload: differ={bad[:5]} missing={missing[:5]}")

    warnings = []
    cases = []
    for prompt in prompts:
        steps = greedy_full(ref, prompt, NEW_TOKENS)
        mem_steps = greedy_full(mem_model, prompt, NEW_TOKENS)
        diff, mm = compare_steps(steps, mem_steps)
        if mm is not None or diff > 1e-4:
            warnings.append(f"len {len(prompt)}: reload vs in-memory diff {diff} mismatch@{mm}")
        toks, lps = greedy_cached(ref, prompt, NEW_TOKENS)
        kv_diff = 0.0
        for i, s in enumerate(steps):
            if toks[i] != s["token"]:
                if s["margin"] >= NEAR_TIE:
                    warnings.append(f"len {len(prompt)}: kv-cache token differs at step {i}")
                break
            kv_diff = max(kv_diff, max(abs(float(lps[i][t]) - v) for t, v in s["top"]))
        out_ids = [s["token"] for s in steps]
        min_margin = min(s["margin"] for s in steps)
        log(f"  prompt len {len(prompt):4d}: out {out_ids[:8]}... min margin {min_margin:.4g} "
            f"kv diff {kv_diff:.2e} mem diff {diff:.2e}")
        if any(t >= tok_len for t in out_ids):
            warnings.append(f"len {len(prompt)}: generated an id past the tokenizer vocab")
        cases.append({"prompt_ids": prompt, "output_ids": out_ids, "steps": steps})

    # Text cases: HF tokenizer (with the post-processor's bos) vs raw tokenizer.json.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    for text in [CORPUS] + TEXT_PROMPTS:
        want = raw.encode(text, add_special_tokens=True).ids
        for label, t in (("PreTrainedTokenizerFast", rtok), ("AutoTokenizer", atok)):
            got = t.encode(text, add_special_tokens=True)
            if got != want:
                warnings.append(f"{label} encode differs from tokenizer.json on {text[:30]!r}")
            if t.decode(want, skip_special_tokens=True) != raw.decode(want, skip_special_tokens=True):
                warnings.append(f"{label} decode differs from tokenizer.json on {text[:30]!r}")
    text_cases = []
    for text in TEXT_PROMPTS:
        ids = rtok.encode(text, add_special_tokens=True)
        raw_ids = raw.encode(text, add_special_tokens=True).ids
        if ids != raw_ids:
            warnings.append(f"text {text!r}: HF ids {ids} != tokenizer.json ids {raw_ids}")
        steps = greedy_full(ref, ids, TEXT_NEW_TOKENS)
        out_ids = [s["token"] for s in steps]
        out_text = rtok.decode(out_ids, skip_special_tokens=True)
        if out_text != raw.decode(out_ids, skip_special_tokens=True):
            warnings.append(f"text {text!r}: HF decode differs from tokenizer.json decode")
        text_cases.append({"prompt": text, "prompt_ids": ids, "output_ids": out_ids,
                           "output_text": out_text, "steps": steps})
        log(f"  text {text!r}: {len(ids)} ids -> {out_text!r}")

    rendered = rtok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
    chat_ids = rtok.encode(rendered, add_special_tokens=False)
    if chat_ids != raw.encode(rendered, add_special_tokens=False).ids:
        warnings.append("chat: HF ids differ from tokenizer.json ids")
    if atok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True) != rendered:
        warnings.append("chat: AutoTokenizer renders the template differently")
    steps = greedy_full(ref, chat_ids, TEXT_NEW_TOKENS)
    out_ids = [s["token"] for s in steps]
    chat_cases = [{"messages": CHAT_MESSAGES, "add_generation_prompt": True,
                   "rendered": rendered, "prompt_ids": chat_ids, "output_ids": out_ids,
                   "output_text": rtok.decode(out_ids, skip_special_tokens=True), "steps": steps}]
    log(f"  chat rendered {rendered!r} -> {len(chat_ids)} ids")

    golden = {
        "model": name,
        "architecture": spec["cls"],
        "dialect": spec["dialect"],
        "checkpoint_dtype": DTYPE_NAMES[spec["save_dtype"]],
        "compute_dtype": "float32",
        "attention": "eager",
        "top_k": TOP_K,
        "new_tokens": NEW_TOKENS,
        "tokenizer_vocab": tok_len,
        "model_vocab": MODEL_VOCAB,
        "near_tie": NEAR_TIE,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "cases": cases,
        "text_cases": text_cases,
        "chat_cases": chat_cases,
    }
    write_golden(os.path.join(d, "golden.json"), golden)

    try:
        files, tensors = describe_dir(d)
    except Exception as e:  # noqa: BLE001 - the manifest is informational
        files, tensors = {"error": repr(e)}, {}
    MANIFEST[name] = {
        "config_written_by_transformers": written,
        "config_final": final,
        "tokenizer_save": template_info,
        "files": files,
        "tensors": tensors,
        "warnings": warnings,
        "min_margin": min(s["margin"] for c in cases for s in c["steps"]),
        "seconds": round(time.time() - t0, 1),
    }
    log(f"  tensors: {sorted(tensors)}")
    log(f"  files: { {k: v for k, v in files.items() if not k.endswith(':metadata')} }")
    for w in warnings:
        log(f"  WARNING {w}")
    log(f"  done {name} in {time.time() - t0:.1f}s")


def write_golden(path, golden):
    """One case per line keeps the file diffable without one id per line."""
    head = {k: v for k, v in golden.items() if k not in ("cases", "text_cases", "chat_cases")}
    parts = ["{"]
    for k, v in head.items():
        parts.append(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
    sections = ["cases", "text_cases", "chat_cases"]
    for si, k in enumerate(sections):
        parts.append(f" {json.dumps(k)}: [")
        items = golden[k]
        for i, item in enumerate(items):
            comma = "," if i + 1 < len(items) else ""
            parts.append("  " + json.dumps(item, ensure_ascii=False, separators=(",", ":")) + comma)
        parts.append(" ]" + ("," if si + 1 < len(sections) else ""))
    parts.append("}")
    text = "\n".join(parts) + "\n"
    json.loads(text)  # must stay valid JSON
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    global LOG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="fixture root to (re)create")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "log.txt"), "w", encoding="utf-8")
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    import transformers
    import tokenizers
    log(f"torch {torch.__version__} transformers {transformers.__version__} "
        f"tokenizers {tokenizers.__version__} python {sys.version.split()[0]}")

    tok = build_tokenizer()
    prompts = random_prompts(len(tok))
    wanted = set(filter(None, args.only.split(",")))
    failed = []
    for spec in model_specs(tok):
        if wanted and spec["name"] not in wanted:
            continue
        log(f"== {spec['name']}")
        try:
            make_model(spec, tok, args.out, prompts)
        except Exception:  # noqa: BLE001 - keep going with the other models
            failed.append(spec["name"])
            log(f"FAILED {spec['name']}:\n{traceback.format_exc()}")
    write_json(os.path.join(args.out, "manifest.json"), MANIFEST)
    log(f"finished; failed: {failed or 'none'}")
    LOG.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
