#!/usr/bin/env python3
"""Writes the BPE test data in tests/data/bpe/ with Hugging Face `tokenizers` (PyPI), the
independent implementation crosstrain's BpeTokenizer must agree with id for id.

GPT-2's own vocabulary cannot be downloaded here, so this trains a small byte-level BPE the way
GPT-2's was made (ByteLevel pre-tokenizer with GPT-2's pattern, no prefix space, all 256 byte
stand-ins in the alphabet, <|endoftext|> special) on a varied corpus, saves it in both formats
(tokenizer.json; vocab.json + merges.txt) and records the ids `tokenizers` gives for test texts,
including texts that were not in the training corpus.

Rerun (outside the repository's build, in any venv):
  python3 -m venv /tmp/venv-bpe && /tmp/venv-bpe/bin/pip install tokenizers
  /tmp/venv-bpe/bin/python scripts/make_bpe_data.py
The committed data was made with tokenizers 0.23.3.
"""
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "bpe")
HARBOUR = os.path.join(HERE, "..", "tests", "data", "text", "harbour.txt")

CORPUS_EXTRA = [
    "The quick brown fox jumps over the lazy dog. It's 3 o'clock; we'll see, they're here, "
    "I've gone, you'd think, she's IT'S WE'LL THEY'RE.\n",
    "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text]\n\n",
    "int main(int argc, char** argv) {\n\tfor (int i = 0; i < argc; ++i) printf(\"%s\\n\", argv[i]);"
    "\n\treturn 0;\n}\n",
    "Café crème, naïve façade, Zürich, São Paulo, Ångström, Łódź.\n",
    "Ελληνικά: καλημέρα κόσμε. Русский: привет, мир! 日本語のテキストです。中文文本。한국어 텍스트.\n",
    "العربية: مرحبا بالعالم. עברית: שלום עולם. हिन्दी: नमस्ते दुनिया।\n",
    "Emoji: 🙂 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷\n",
    "Numbers: 3.14159 2,718 1e-9 0x1F 1000000 ١٢٣ ½ ².\n",
    "   leading spaces, trailing spaces   \n\n\n\t\ttabs\t and  double  spaces\r\nwindows line\r\n",
    "<|endoftext|>A new document starts here.<|endoftext|>\n",
]

CASES = [
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "trailing space ",
    "   three leading spaces",
    "a   b    c",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "tabs\tand\t\ttabs",
    "mixed \t \n whitespace \n\t ",
    "It's he's we'll they're I've you'd I'm IT'S WE'LL",
    "don't won't can't shouldn't",
    "'s's's 'll'",
    "Numbers 12345 and 3.14 and 1,000,000",
    "x = y + 2 * (z - 1)",
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Café naïve Zürich Ångström Łódź",
    "καλημέρα κόσμε",
    "привет мир",
    "日本語のテキスト",
    "中文文本测试",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Emoji 🙂 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈",
    "🤖🤖🤖",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|endoftext|><|endoftext|> double",
    "<|endoftext",
    "a<|endoftext|>\n\n<|endoftext|>b",
    "\u00a0non-breaking\u00a0space and soft\u00adhyphen",
    "control\x01\x02chars\x7f",
    "windows\r\nline\r\nendings",
    "ZWJ\u200dand zero\u200bwidth",
    "Unseen words: xylophone quizzical jabberwocky zephyr",
    "ALL CAPS SHOUTING TEXT",
    "UPPER'S lower'S",
    "",
    " ",
    "  ",
    "\t",
    "!!!???...",
    "email@example.com https://example.org/path?q=1&r=2#frag",
    # pieces longer than 24 bytes take the heap-ordered merge path
    " " * 40 + "x" + " " * 33,
    "0123456789" * 4,
    "a" * 50 + " " + "ab" * 30,
    "\n" * 30 + "end",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "the the the " * 3 + "thethethethethethethethethethe",
]


def paragraphs():
    with open(HARBOUR, encoding="utf-8") as f:
        text = f.read()
    paras = [p for p in text.split("\n\n") if p.strip()]
    return paras[:3]


def main():
    with open(HARBOUR, encoding="utf-8") as f:
        harbour = f.read()
    corpus = [harbour] * 2 + CORPUS_EXTRA * 20

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    tok.model.save(OUT)  # vocab.json, merges.txt

    texts = CASES + paragraphs()
    # A long text built from everything, to check the parallel encoder on the same ids.
    cases = [{"text": t, "ids": tok.encode(t).ids} for t in texts]
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f,
                  ensure_ascii=False, indent=1)
    # The vocab.json + merges.txt form must give the same ids in `tokenizers` too.
    from tokenizers import ByteLevelBPETokenizer
    alt = Tokenizer(models.BPE.from_file(os.path.join(OUT, "vocab.json"),
                                         os.path.join(OUT, "merges.txt")))
    alt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    alt.add_special_tokens(["<|endoftext|>"])
    for c in cases:
        assert alt.encode(c["text"]).ids == c["ids"], c["text"]
    print(f"wrote {OUT}: vocab {tok.get_vocab_size()}, {len(cases)} cases, "
          f"tokenizers {tokenizers.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
