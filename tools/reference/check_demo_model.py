#!/usr/bin/env python3
"""Loads Strata's demo model (written by WriteDemoModel / `strata demo-model`)
with Hugging Face transformers + tokenizers and prints what they make of it:
loading info (missing/unexpected tensors), tokenizer encodings, the rendered
chat template and a greedy generation with top-5 logprobs.

Run where transformers is installed (the GPU machine):
  python3 tools/reference/check_demo_model.py DEMO_DIR [OUT_JSON]
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    d = sys.argv[1]
    out_path = sys.argv[2] if len(sys.argv) > 2 else None
    result = {}

    tok = AutoTokenizer.from_pretrained(d)
    model, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, output_loading_info=True)
    model.eval()
    result["loading_info"] = {k: sorted(map(str, v)) for k, v in info.items()}
    result["model_class"] = type(model).__name__
    result["tokenizer_class"] = type(tok).__name__
    print("model:", result["model_class"], "tokenizer:", result["tokenizer_class"])
    print("loading info:", result["loading_info"])

    texts = [
        "The lighthouse keeper climbed the stairs.",
        "Hello, world! It's 2024; we're testing 12345 tokens.\n\nNew  paragraph\ttab",
        "naïve café — 東京 🙂",
        "<|begin_of_text|>special<|eot_id|> inline",
        "   leading spaces and trailing   ",
        "",
    ]
    enc = []
    for t in texts:
        with_special = tok(t).input_ids
        without = tok(t, add_special_tokens=False).input_ids
        dec = tok.decode(with_special)
        enc.append({"text": t, "ids": with_special, "ids_no_special": without,
                    "decoded": dec,
                    "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True)})
        print(repr(t), "->", with_special, "->", repr(dec))
    result["encodings"] = enc

    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "  Tell me about the lighthouse.  "}]
    chat = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat, add_special_tokens=False).input_ids
    print("chat:", repr(chat))
    result["chat"] = {"messages": msgs, "rendered": chat, "ids": chat_ids}

    gens = []
    for prompt_ids in [tok("The lighthouse keeper").input_ids, chat_ids]:
        x = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=24, do_sample=False, top_p=None,
                                 temperature=None, pad_token_id=0)
            new = out[0, len(prompt_ids):].tolist()
            logits = model(out).logits[0].float()
        steps = []
        for i in range(len(prompt_ids) - 1, out.shape[1] - 1):
            lp = torch.log_softmax(logits[i], -1)
            top = torch.topk(lp, 5)
            steps.append({"ids": top.indices.tolist(),
                          "logprobs": [round(v, 5) for v in top.values.tolist()]})
        gens.append({"prompt_ids": prompt_ids, "greedy_ids": new,
                     "text": tok.decode(new), "top5": steps})
        print("greedy:", new, repr(tok.decode(new)))
        print("  top-2 margins:", [round(s["logprobs"][0] - s["logprobs"][1], 3) for s in steps])
    result["generations"] = gens

    if out_path:
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
