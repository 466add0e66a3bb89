#!/usr/bin/env python3
"""Writes small tokenizer.json fixtures. Two SentencePiece-style BPE ones (the
shape of Llama 2 / Mistral tokenizers: '▁' for spaces, <0xNN> byte fallback,
<unk>):

  spm_legacy:    normalizer Prepend('▁') + Replace(' ', '▁'), no pre-tokenizer,
                 decoder Replace/ByteFallback/Fuse/Strip (Llama 2 as published).
  spm_metaspace: Metaspace pre-tokenizer (prepend_scheme 'first', split), decoder
                 ByteFallback + Metaspace, ignore_merges, and added tokens with
                 lstrip / rstrip / single_word / normalized flags.

Two small byte-level BPE ones that exercise the normalizers, pre-tokenizers
and Split behaviours the real tokenizers do not use:
  bl_misc:      NFKD, StripAccents, Lowercase, Strip, Replace(regex); Digits,
                Split MergedWithPrevious / Removed, ByteLevel with its own
                GPT-2 regex and add_prefix_space; TemplateProcessing $A <eos>.
  bl_behaviors: NFC, Replace(string); Split MergedWithNext / Contiguous /
                Removed+invert, ByteLevel without regex.
  bl_nfkc:      NFKC + Lowercase; Punctuation, WhitespaceSplit, ByteLevel;
                RobertaProcessing.
And two character-level ones for the BPE options nobody above uses:
  sfx_bpe:      end_of_word_suffix "</w>", unk without fusing, NFD +
                StripAccents, Whitespace pre-tokenizer, BPEDecoder.
  pfx_bpe:      continuing_subword_prefix "##", fused unk, WhitespaceSplit,
                no decoder (tokens joined by spaces).

The vocabularies and merges come from a tiny deterministic BPE training run on
the text below. Pure Python, no dependencies; output is deterministic.
Usage: tools/reference/make_small_tokenizers.py tests/fixtures/tokenizer
"""
import collections
import json
import os
import re
import sys

TRAIN = """The quick brown fox jumps over the lazy dog. The tokenizer splits text into tokens.
Hello world! Hello there, hello again. This is a test of the tokenizer and the decoder.
def foo(x):
    return x + 1
    if x:
        print("hello")
In the beginning the model reads the text; then it writes the answer. Café au lait.
1234567890 numbers and more numbers 2024. I'm sure you're right, don't worry.
你好 你好 世界 résumé naïve éé
"""
SPACE = "\u2581"


def train(text, num_merges):
    words = collections.Counter()
    for line in text.split("\n"):
        if not line:
            continue
        s = SPACE + line.replace(" ", SPACE)
        # SentencePiece-style words: split before every '▁' run end.
        cur = ""
        for ch in s:
            if ch == SPACE and cur and cur[-1] != SPACE:
                words[cur] += 1
                cur = ""
            cur += ch
        if cur:
            words[cur] += 1
    chars = sorted({c for w in words for c in w})
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(num_merges):
        pairs = collections.Counter()
        for w, n in words.items():
            sq = seqs[w]
            for a, b in zip(sq, sq[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        for w in words:
            sq, out, i = seqs[w], [], 0
            while i < len(sq):
                if i + 1 < len(sq) and (sq[i], sq[i + 1]) == best:
                    out.append(sq[i] + sq[i + 1])
                    i += 2
                else:
                    out.append(sq[i])
                    i += 1
            seqs[w] = out
    return chars, merges


def build(ignore_merges, extra_vocab):
    chars, merges = train(TRAIN, 260)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in chars:
        vocab.setdefault(c, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for t in extra_vocab:
        vocab.setdefault(t, len(vocab))
    return vocab, [[a, b] for a, b in merges]


def added(id_, content, special=True, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def model(vocab, merges, ignore_merges):
    return {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges}


def bos_template():
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}


def legacy():
    vocab, merges = build(False, [SPACE * 2, SPACE * 4])
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]},
        "pre_tokenizer": None,
        "post_processor": bos_template(),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": model(vocab, merges, False),
    }, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
        "add_eos_token": False, "legacy": True, "tokenizer_class": "LlamaTokenizerFast"}


def metaspace():
    vocab, merges = build(True, [SPACE + "tokenizer", SPACE + "quick" + SPACE, SPACE * 2])
    n = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>"),
                         added(n, "[MASK]", lstrip=True),
                         added(n + 1, "<sep>", special=False, rstrip=True),
                         added(n + 2, "hello", special=False, single_word=True, normalized=True),
                         added(n + 3, "<both>", special=True, lstrip=True, rstrip=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": True},
        "post_processor": bos_template(),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": True}]},
        "model": model(vocab, merges, True),
    }, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}


def byte_to_char():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bytelevel_model():
    b2c = byte_to_char()
    words = collections.Counter()
    for w in re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", TRAIN.lower()):
        words["".join(b2c[b] for b in w.encode("utf-8"))] += 1
    vocab = {b2c[b]: b for b in range(256)}
    seqs = {w: list(w) for w in words}
    merges = []
    for _ in range(200):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(seqs[w], seqs[w][1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        for w in words:
            sq, out, i = seqs[w], [], 0
            while i < len(sq):
                if i + 1 < len(sq) and (sq[i], sq[i + 1]) == best:
                    out.append(sq[i] + sq[i + 1])
                    i += 2
                else:
                    out.append(sq[i])
                    i += 1
            seqs[w] = out
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": [a + " " + b for a, b in merges]}


def bl_misc():
    m = bytelevel_model()
    n = len(m["vocab"])
    bl = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n, "<eos>"), added(n + 1, "<bos>", lstrip=True, rstrip=True)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[,;]"}, "behavior": "Removed", "invert": False},
            bl]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<eos>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<eos>": {"id": "<eos>", "ids": [n], "tokens": ["<eos>"]}}},
        "decoder": bl,
        "model": m,
    }, {"eos_token": "<eos>", "bos_token": "<bos>", "tokenizer_class": "PreTrainedTokenizerFast"}


def bl_behaviors():
    m = bytelevel_model()
    n = len(m["vocab"])
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n, "<|end|>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"String": "\t"}, "content": "    "}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[aeiou]"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[\\p{L}\\p{N} ]+"}, "behavior": "Removed", "invert": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": m,
    }, {"eos_token": "<|end|>", "tokenizer_class": "PreTrainedTokenizerFast"}


def bl_nfkc():
    m = bytelevel_model()
    n = len(m["vocab"])
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n, "<s>"), added(n + 1, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Punctuation", "behavior": "Isolated"}, {"type": "WhitespaceSplit"},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", n + 1], "cls": ["<s>", n],
                           "trim_offsets": True, "add_prefix_space": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": m,
    }, {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}


def char_model(prefix, suffix, fuse_unk):
    words = collections.Counter(re.findall(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]", TRAIN.lower()))
    seqs = {}
    for w in words:
        sq = [c if i == 0 else prefix + c for i, c in enumerate(w)]
        sq[-1] += suffix
        seqs[w] = sq
    vocab = {"[UNK]": 0}
    for sq in seqs.values():
        for t in sq:
            vocab.setdefault(t, len(vocab))
    merges = []
    for _ in range(150):
        pairs = collections.Counter()
        for w, n in words.items():
            for a, b in zip(seqs[w], seqs[w][1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merged = best[0] + best[1][len(prefix):]
        merges.append(best)
        vocab.setdefault(merged, len(vocab))
        for w in words:
            sq, out, i = seqs[w], [], 0
            while i < len(sq):
                if i + 1 < len(sq) and (sq[i], sq[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(sq[i])
                    i += 1
            seqs[w] = out
    return {"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": prefix or None,
            "end_of_word_suffix": suffix or None, "fuse_unk": fuse_unk, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]}


def sfx_bpe():
    m = char_model("", "</w>", False)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "[UNK]")],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"},
                                                           {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "BPEDecoder", "suffix": "</w>"},
        "model": m,
    }, {"unk_token": "[UNK]", "tokenizer_class": "PreTrainedTokenizerFast"}


def pfx_bpe():
    m = char_model("##", "", True)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, "[UNK]")],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": m,
    }, {"unk_token": "[UNK]", "tokenizer_class": "PreTrainedTokenizerFast"}


def main():
    out = sys.argv[1]
    for name, (tok, cfg) in (("spm_legacy", legacy()), ("spm_metaspace", metaspace()),
                             ("bl_misc", bl_misc()), ("bl_behaviors", bl_behaviors()), ("bl_nfkc", bl_nfkc()),
                             ("sfx_bpe", sfx_bpe()), ("pfx_bpe", pfx_bpe())):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=1)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
        print(name, len(tok["model"]["vocab"]), "tokens", len(tok["model"]["merges"]), "merges")


if __name__ == "__main__":
    main()
