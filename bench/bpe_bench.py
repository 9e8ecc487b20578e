#!/usr/bin/env python3
"""Hugging Face `tokenizers` on the same input as bench/bpe_bench.cpp, for comparison: median MB/s
(MB of UTF-8 input) of
  - Tokenizer.encode on the whole text (one call; `tokenizers` runs it on one thread),
  - Tokenizer.encode_batch and encode_batch_fast (no offsets) over the text's lines,
each thread count in a fresh process with RAYON_NUM_THREADS=N and TOKENIZERS_PARALLELISM=true
(rayon sizes its pool once per process). Same JSON lines as bpe_bench; "tokens" of the whole-text
encode equals bpe_bench's count on the same text (the line batches may differ slightly: a line
that starts with a space is pieced differently when cut from the line before).

  python3 bench/bpe_bench.py --tokenizer DIR --text FILE [--min-mb 20] [--runs 5] [--threads 1,2]

Needs `pip install tokenizers` (the data in tests/data/bpe was made with 0.23.3). FILE is read
as bytes (no newline translation) and repeated as bpe_bench repeats it; to measure bpe_bench's
generated corpus, save it with `bpe_bench --write-text FILE --min-mb 20` and pass --min-mb 0.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def load(path, min_mb):
    with open(path, "rb") as f:
        one = f.read()
    if not one:
        sys.exit(f"bpe_bench.py: {path} is empty")
    data = one
    while len(data) < min_mb * 1e6:
        data += one
    return data.decode("utf-8")  # strict: bpe_bench and tokenizers must see the same text


def child(a):
    from tokenizers import Tokenizer

    threads = int(os.environ["RAYON_NUM_THREADS"])
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    text = load(a.text, a.min_mb)
    mb = len(text.encode("utf-8")) / 1e6
    lines = text.splitlines(keepends=True)
    runs = [("encode_batch", lambda: sum(len(e.ids) for e in tok.encode_batch(lines))),
            ("encode_batch_fast",
             lambda: sum(len(e.ids) for e in tok.encode_batch_fast(lines)))]
    if threads == 1:
        runs.insert(0, ("encode", lambda: len(tok.encode(text).ids)))
    for name, fn in runs:
        speeds, n = [], 0
        for _ in range(a.runs):
            t0 = time.perf_counter()
            n = fn()
            speeds.append(mb / (time.perf_counter() - t0))
        print(json.dumps({"impl": "tokenizers " + name, "threads": threads, "mb": round(mb, 1),
                          "tokens": n, "median_mb_per_s": round(statistics.median(speeds), 2)}),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--min-mb", type=float, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    for t in [int(x) for x in a.threads.split(",")]:
        env = dict(os.environ, RAYON_NUM_THREADS=str(t), TOKENIZERS_PARALLELISM="true")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                        "--tokenizer", a.tokenizer, "--text", a.text, "--min-mb", str(a.min_mb),
                        "--runs", str(a.runs)], env=env, check=True)


if __name__ == "__main__":
    main()
