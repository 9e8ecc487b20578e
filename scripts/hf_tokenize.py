"""Tokenizes a text file with a model folder's own tokenizer.json (Hugging Face `tokenizers`) into
an llm.c token file that `crosstrain train --data` reads: for the tokenizers crosstrain cannot
read itself yet (SmolLM, Llama 3, Qwen2, Mistral, ...; README.md, "Llama, Mistral, Qwen2").

    python3 scripts/hf_tokenize.py --model ./my-llama --text my_text.txt --out my_text.tok \
        [--eos-between-lines]

Header: 256 int32 (magic 20240520 / version 1 for uint16 ids, 20240801 / 7 for uint32 when the
vocabulary has more than 65536 ids; then the token count), then the ids, little-endian, as
core/data/token_file.h reads them. The text is encoded as one string, without special tokens
(as crosstrain encodes text); --eos-between-lines encodes each line on its own and puts the
tokenizer's eos token (config.json eos_token_id) after each.
"""
import argparse
import json
import os

import numpy as np
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="folder with tokenizer.json")
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--eos-between-lines", action="store_true")
    args = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    text = open(args.text, encoding="utf-8").read()
    if args.eos_between_lines:
        with open(os.path.join(args.model, "config.json")) as f:
            eos = json.load(f)["eos_token_id"]
        ids = []
        for line in text.splitlines(keepends=True):
            ids += tok.encode(line, add_special_tokens=False).ids + [eos]
    else:
        ids = tok.encode(text, add_special_tokens=False).ids
    wide = tok.get_vocab_size(with_added_tokens=True) > 65536
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = (20240801, 7, len(ids)) if wide else (20240520, 1, len(ids))
    with open(args.out, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, dtype="<u4" if wide else "<u2").tobytes())
    print(f"{args.out}: {len(ids):,} tokens ({'uint32' if wide else 'uint16'})")


if __name__ == "__main__":
    main()
