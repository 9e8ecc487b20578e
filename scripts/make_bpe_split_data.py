"""Writes tests/data/bpe/split_expected.json: the ids Hugging Face `tokenizers` gives for the
test texts of tests/data/bpe/expected.json (and a few more aimed at the pattern), with the
tokenizer of tests/data/bpe reshaped as Meta Llama 3's tokenizer.json is:
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": <Llama 3's pattern>}, "behavior": "Isolated",
         "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
         "use_regex": false}]},
    "model": {..., "ignore_merges": true},
    "post_processor": {"type": "Sequence", "processors": [ByteLevel, TemplateProcessing (BOS)]}
The changes are stored beside the ids ("changes"), and tests/io/bpe_tokenizer_test.cpp applies
them to tests/data/bpe/tokenizer.json and compares id for id (encode = add_special_tokens=False).
The same for Qwen2's shape ("qwen2": Llama 3's pattern with one digit a piece, ByteLevel
post-processor, and an NFC normalizer), on the same texts.

Rerun, from the repository root (any tokenizers >= 0.20 reads the committed tokenizer.json):
    python3 -m venv /work/venv-tok && /work/venv-tok/bin/pip install tokenizers==0.20.3
    /work/venv-tok/bin/python scripts/make_bpe_split_data.py
"""
import json
import os

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "tests", "data", "bpe")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's (Qwen2, Qwen2.5): Llama 3's with one digit a piece, behind an NFC normalizer.
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")


def changes():
    bos = "<|endoftext|>"
    return {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [50256], "tokens": [bos]}}}]},
        "ignore_merges": True,
    }


def qwen2_changes():
    c = changes()
    c["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2
    c["pre_tokenizer"]["pretokenizers"][1]["trim_offsets"] = False
    c["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False}
    c["ignore_merges"] = False
    c["normalizer"] = {"type": "NFC"}
    return c


def build(c):
    j = json.load(open(os.path.join(DIR, "tokenizer.json"), encoding="utf-8"))
    j["pre_tokenizer"] = c["pre_tokenizer"]
    j["post_processor"] = c["post_processor"]
    j["model"]["ignore_merges"] = c["ignore_merges"]
    if "normalizer" in c:
        j["normalizer"] = c["normalizer"]
    return Tokenizer.from_str(json.dumps(j))


def main():
    c = changes()
    tok = build(c)
    texts = [x["text"] for x in json.load(open(os.path.join(DIR, "expected.json"),
                                               encoding="utf-8"))["cases"]]
    texts += ["I'M HERE, you'Re there; THEY'LL see", "don'T  it'S ſ 'ſ 'K",
              "12345 678901 x1234y", "line one\r\nline two\n\n  indented\n",
              "a  b   c\t\td \n e", "!!!\n??? ...\r\n", "  leading and trailing  ",
              "naïve café über straße", "日本語のテキスト 123", "emoji 😀😀 x", "\u180e x \u180ey",
              # NFC at work (decomposed letters, Hangul jamo, singletons, mark reordering)
              "cafe\u0301 nai\u0308ve A\u030angstro\u0308m", "\u1100\u1161\u11a8 \u1112\u1161",
              "\u212b \u2126 \u0071\u0307\u0323 e\u0323\u0302", "x\u0301\u0301 \u0301start"]
    out = {"tokenizers_version": tokenizers.__version__, "changes": c, "cases": []}
    for t in texts:
        out["cases"].append({"text": t, "ids": tok.encode(t, add_special_tokens=False).ids})
    # add_special_tokens=True prepends the BOS: what crosstrain's encode() does not do
    out["with_special_tokens"] = {"text": texts[0],
                                  "ids": tok.encode(texts[0], add_special_tokens=True).ids}
    q = qwen2_changes()
    qtok = build(q)
    out["qwen2"] = {"changes": q, "cases": [
        {"text": t, "ids": qtok.encode(t, add_special_tokens=False).ids} for t in texts]}
    with open(os.path.join(DIR, "split_expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(len(out["cases"]), "cases")


if __name__ == "__main__":
    main()
