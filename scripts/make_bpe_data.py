#!/usr/bin/env python3
"""Writes the BPE test data in tests/data/bpe/ with Hugging Face `tokenizers` (PyPI), the
independent implementation crosstrain's BpeTokenizer must agree with id for id.

GPT-2's own vocabulary cannot be downloaded here, so this trains a small byte-level BPE the way
GPT-2's was made (ByteLevel pre-tokenizer with GPT-2's pattern, no prefix space, all 256 byte
stand-ins in the alphabet, <|endoftext|> special) on a varied corpus, saves it in both formats
(tokenizer.json; vocab.json + merges.txt) and records in expected.json the ids `tokenizers` gives
for test texts: hand-picked ones (most of them not in the training corpus), longer texts that
were not trained on, and seeded random strings over characters the pattern treats differently
(letters, digits, Unicode spaces, U+180E, combining marks, emoji, apostrophes, added tokens).

The model (vocabulary 1111: 256 bytes, 854 merges, <|endoftext|>) is relied on elsewhere
(tests/tools/cli_test.cpp, tests/train/hf_checkpoint_test.cpp). Training is deterministic, so a
rerun writes the same tokenizer.json, vocab.json and merges.txt; change the training corpus only
together with those tests.

Rerun, from the repository root, with a virtual environment outside the repository:
  python3 -m venv /work/venv-tok && /work/venv-tok/bin/pip install tokenizers==0.23.3
  /work/venv-tok/bin/python scripts/make_bpe_data.py
The committed data was made with tokenizers 0.23.3 (CPython 3.11).
"""
import json
import os
import random
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
    # Unicode whitespace: the pattern's \s is Oniguruma's (White_Space), without U+180E
    "  \u180e1 a\u180eb \u180e ",
    "NEL\u0085line\u2028sep\u2029para",
    "ideographic\u3000space\u3000\u3000x \u3000",
    "\u00a0\u00a0x y \u00a0 z\u00a0",
    "thin\u2009space\u202fnarrow\u205fmath\u1680ogham",
    "\x0b\x0cform feed\x1c\x1d\x1e\x1fseparators\x00nul",
    # Unicode letters and numbers (\p{L}, \p{N}), and characters that are neither
    "Roman \u216b numerals, \u00bd fractions, x\u00b2, \u0661\u0662\u0663, \U0001d7d8\U0001d7d9",
    "cafe\u0301 e\u0301te\u0301 combining, \u01c5 \u02b0 \u3005 \u3007",
    "\u0e01\u0e31\u0e19 \u0915\u093e\u0903 marks",
    "private\ue000use \U0010fffd and \u0378 unassigned",
    # apostrophes: only the ASCII one, lower case, starts a contraction
    "\u2019s \u2018quoted\u2019 's'S'RE'Ve'M'D",
    "rock'n'roll O'Neil's ''' 'tis",
    "x's y're z'll 1's !'s  's\n's",
    # whitespace around line ends
    "a \n b",
    "x  \n\ny",
    "end \t",
    "\t\n \t\n",
    "\n\n   \n",
    " " * 100 + "\n" * 5 + "\t" * 10 + "x",
    "3" * 100,
    # added tokens next to everything
    " <|endoftext|> ",
    "<|endoftext|>'s",
    "<|endoftext|<|endoftext|>>",
    "x\n<|endoftext|>\n   <|endoftext|>   y",
]

# Longer texts, none of them in the training corpus.
UNSEEN = [
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n"
    "    println!(\"{:?}\", v);\n}\n",
    "Die Stra\u00dfenbahn f\u00e4hrt \u00fcber die Br\u00fccke. L'\u00e9t\u00e9 dernier, nous "
    "sommes all\u00e9s \u00e0 la plage; \u00bfQu\u00e9 tal? \u00a1Muy bien! \u0396\u03ce\u03bd\u03b7.",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u4eba\u53e3\u306f"
    "\u7d041400\u4e07\u4eba\u3002 Tokyo is big; \ud55c\uad6d\uc5b4\ub3c4 \uc788\uc5b4\uc694.",
    "| name | value |\n|------|-------|\n| alpha | 0.001 |\n| beta  | 2e-5  |\n",
    '{"id": 42, "tags": ["a", "b"], "nested": {"ok": true, "pi": 3.14159}}\n',
    "  indented line\n\tTabbed line   \n\n\n    # comment\n  \n",
    "THE END'S NEAR, ISN'T IT? We'd've known; they'll've left. 1,234,567.89 + 10% = \u20ac99",
]

# Characters for the seeded random strings.
PALETTE = (list("abcXYZ019.,;!?-_()'\"`") + [
    " ", " ", " ", "\t", "\n", "\r", "\x0b", "\x00", "\x7f", "\x85", "\xa0", "\xad", "\u1680",
    "\u180e", "\u2000", "\u2028", "\u3000", "\u200b", "\u200d", "\ufeff", "\u0301", "\u00e9",
    "\u00df", "\u03a9", "\u0436", "\u65e5", "\u0627", "\u0661", "\u00b2", "\u00bd", "\u216b",
    "\U0001f642", "\U0001f3fd", "\ufe0f", "\u2019", "'s", "'re", "'LL", "<|endoftext|>", "<|endo",
])


def paragraphs():
    with open(HARBOUR, encoding="utf-8", newline="") as f:
        text = f.read()
    paras = [p for p in text.split("\n\n") if p.strip()]
    return paras[:3]


def main():
    with open(HARBOUR, encoding="utf-8", newline="") as f:
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

    rnd = random.Random(13)
    fuzz = ["".join(rnd.choice(PALETTE) for _ in range(rnd.randint(1, 24))) for _ in range(150)]
    texts = CASES + paragraphs() + UNSEEN + fuzz
    cases = [{"text": t, "ids": tok.encode(t).ids} for t in texts]
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f,
                  ensure_ascii=False, indent=1)
    # The vocab.json + merges.txt form must give the same ids in `tokenizers` too.
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
