#!/usr/bin/env python3
"""Golden outputs of Hugging Face `tokenizers` for src/model/tokenizer_test.cc.

Runs on the GPU machine (tokenizers 0.23, transformers 5; no internet):
  python3 tools/reference/tokenizer_goldens.py <tokdata> <out>
<tokdata>/<name>/tokenizer.json (+ tokenizer_config.json) for each tokenizer;
texts from tests/fixtures/tokenizer/corpus.json and corpus_extra.json. Writes <out>/<name>.golden.json:
  entries[i]: ids (encode add_special_tokens=True), ids_plain (False), decoded
              (decode(ids)), decoded_skip (skip_special_tokens=True), and
              ids_transformers (AutoTokenizer(<dir>).encode(text)) when it loads.
  random_decode: random id sequences and their decode / decode_skip (partial
              UTF-8, byte-fallback runs, specials in the middle).
  throughput: HF encode speed on the bench text (corpus joined by '\\n' and
              repeated to >= 1,000,000 UTF-8 bytes; same text as tokenizer_bench).
"""
import json
import os
import random
import sys
import time

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizer")
CORPUS = os.path.join(FIXTURES, "corpus.json")
CORPUS_EXTRA = os.path.join(FIXTURES, "corpus_extra.json")  # goldens only, not in the bench text

# Decode cases by token string (sequences whose tokens all exist in a tokenizer
# are decoded): first-token Metaspace stripping, byte-fallback runs split by
# (skipped) special tokens, incomplete byte sequences.
DECODE_CASES = [
    ["\u2581quick\u2581", "\u2581tokenizer"], ["\u2581\u2581", "\u2581quick\u2581"], ["<s>", "\u2581\u2581", "a"],
    ["\u2581\u2581", "\u2581\u2581\u2581\u2581"], ["\u2581"], ["<s>", "\u2581"], ["a", "\u2581quick\u2581"],
    ["<0xE4>", "<0xBD>", "<0xA0>", "\u2581a"], ["<0x41>", "<0x80>"], ["<0xE4>", "<s>", "<0xBD>", "<0xA0>"],
    ["<0xE4>", "</s>", "<0xBD>"], ["<0x20>", "a"], ["<s>", "<0x20>", "a"], ["<unk>", "\u2581a"],
    ["\u00e4\u00bd", "\u0142"], ["\u00e4\u00bd\u0142"], ["<|im_start|>", "\u00e4\u00bd"], ["\u00e4\u00bd", "<|im_end|>", "\u0142"],
    ["<|begin_of_text|>", "\u0120Hello"], ["\u0120", "<eos>", "\u0120"],
]


def bench_text(texts):
    parts, n = [], 0
    while n < 1_000_000:
        for t in texts:
            parts.append(t)
            n += len(t.encode("utf-8")) + 1
    return "\n".join(parts)


def best_of(n, fn):
    best = None
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def random_sequences(tok, name):
    rng = random.Random("strata-" + name)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = [i for i in (tok.token_to_id("<0x%02X>" % b) for b in range(256)) if i is not None]
    seqs = []
    for k in range(40):
        n = rng.randint(1, 24)
        seq = []
        for _ in range(n):
            r = rng.random()
            if byte_ids and r < 0.4:
                seq.append(rng.choice(byte_ids))
            elif r < 0.5:
                seq.append(rng.randrange(max(0, vocab - 300), vocab))  # added/special region
            else:
                seq.append(rng.randrange(vocab))
        seqs.append(seq)
    return [{"ids": s, "decoded": tok.decode(s, skip_special_tokens=False),
             "decoded_skip": tok.decode(s, skip_special_tokens=True)} for s in seqs]


def fixed_sequences(tok):
    out = []
    for case in DECODE_CASES:
        ids = [tok.token_to_id(t) for t in case]
        if all(i is not None for i in ids):
            out.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                        "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return out


def main():
    data, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    texts = json.load(open(CORPUS, encoding="utf-8"))["texts"]
    text = bench_text(texts)
    extra = json.load(open(CORPUS_EXTRA, encoding="utf-8"))["texts"] if os.path.exists(CORPUS_EXTRA) else []
    docs = text.split("\n")
    try:
        import transformers
        from transformers import AutoTokenizer
        tf_version = transformers.__version__
    except Exception as e:  # noqa: BLE001
        AutoTokenizer, tf_version = None, "unavailable: %r" % e
    for name in sorted(os.listdir(data)):
        path = os.path.join(data, name, "tokenizer.json")
        if not os.path.exists(path):
            continue
        tok = Tokenizer.from_file(path)
        tf, tf_error = None, None
        if AutoTokenizer is not None:
            try:
                tf = AutoTokenizer.from_pretrained(os.path.join(data, name))
            except Exception as e:  # noqa: BLE001
                tf_error = repr(e)
        entries = []
        for t in texts + extra:
            ids = tok.encode(t, add_special_tokens=True).ids
            e = {"text": t, "ids": ids, "ids_plain": tok.encode(t, add_special_tokens=False).ids,
                 "decoded": tok.decode(ids, skip_special_tokens=False),
                 "decoded_skip": tok.decode(ids, skip_special_tokens=True)}
            if tf is not None:
                try:
                    e["ids_transformers"] = tf.encode(t)
                except Exception as ex:  # noqa: BLE001
                    tf_error = repr(ex)
            entries.append(e)
        nbytes = len(text.encode("utf-8"))
        single = best_of(3, lambda: tok.encode(text, add_special_tokens=False))
        per_doc = best_of(2, lambda: [tok.encode(d, add_special_tokens=False) for d in docs])
        batch = best_of(3, lambda: tok.encode_batch(docs, add_special_tokens=False))
        ntok = len(tok.encode(text, add_special_tokens=False).ids)
        result = {
            "name": name, "tokenizers_version": tokenizers.__version__, "transformers_version": tf_version,
            "transformers_class": type(tf).__name__ if tf is not None else None, "transformers_error": tf_error,
            "entries": entries, "random_decode": random_sequences(tok, name) + fixed_sequences(tok),
            "throughput": {"bench_bytes": nbytes, "bench_tokens": ntok, "docs": len(docs),
                           "cpu_count": os.cpu_count(),
                           "encode_one_string_MBps": nbytes / single / 1e6,
                           "encode_per_doc_loop_MBps": nbytes / per_doc / 1e6,
                           "encode_batch_MBps": nbytes / batch / 1e6},
        }
        with open(os.path.join(out, name + ".golden.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, ensure_ascii=False, indent=0)
        print(name, json.dumps(result["throughput"]), "tf:", result["transformers_class"], tf_error, flush=True)


if __name__ == "__main__":
    main()
