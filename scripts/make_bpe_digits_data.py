"""Writes tests/data/bpe/digits_expected.json: the ids Hugging Face `tokenizers` gives for the
test texts of tests/data/bpe/expected.json that hold a number character (Unicode N*), with the
tokenizer of tests/data/bpe behind a Digits pre-tokenizer, as SmolLM's and StarCoder's
tokenizer.json have it:
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true|false}, {"type": "ByteLevel", ...}]}
tests/io/bpe_tokenizer_test.cpp builds the same tokenizer.json and compares id for id.

Rerun, from the repository root (any tokenizers >= 0.20 reads the committed tokenizer.json):
    python3 -m venv /work/venv-tok && /work/venv-tok/bin/pip install tokenizers==0.20.3
    /work/venv-tok/bin/python scripts/make_bpe_digits_data.py
"""
import json
import os
import unicodedata

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "tests", "data", "bpe")


def with_digits(individual):
    j = json.load(open(os.path.join(DIR, "tokenizer.json"), encoding="utf-8"))
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": individual}, j["pre_tokenizer"]]}
    return Tokenizer.from_str(json.dumps(j))


def main():
    cases = json.load(open(os.path.join(DIR, "expected.json"), encoding="utf-8"))["cases"]
    texts = [c["text"] for c in cases
             if any(unicodedata.category(ch).startswith("N") for ch in c["text"])]
    texts += ["2024-11-25 12:34:56", " 1 22 333 4444 ", "x1y22z333", "٣٤ ² Ⅻ ½1", "99 bottles"]
    out = {"tokenizers_version": tokenizers.__version__, "cases": []}
    tok = {True: with_digits(True), False: with_digits(False)}
    for t in texts:
        out["cases"].append({"text": t,
                             "individual": tok[True].encode(t, add_special_tokens=False).ids,
                             "contiguous": tok[False].encode(t, add_special_tokens=False).ids})
    with open(os.path.join(DIR, "digits_expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(len(out["cases"]), "cases")


if __name__ == "__main__":
    main()
