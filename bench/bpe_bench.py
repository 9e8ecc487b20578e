#!/usr/bin/env python3
"""Hugging Face `tokenizers` on the same input as bench/bpe_bench.cpp: median MB/s of
Tokenizer.encode over the whole text (one thread) and of encode_batch over its lines on N
threads (RAYON_NUM_THREADS). Same JSON lines as bpe_bench.

  RAYON_NUM_THREADS=2 python3 bench/bpe_bench.py --tokenizer DIR --text FILE [--min-mb 20]
"""
import argparse
import json
import os
import statistics
import time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--min-mb", type=float, default=20)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
    one = open(a.text, encoding="utf-8").read()
    text = one
    while len(text.encode()) < a.min_mb * 1e6:
        text += one
    mb = len(text.encode()) / 1e6
    lines = text.splitlines(keepends=True)
    threads = int(os.environ.get("RAYON_NUM_THREADS", "0")) or os.cpu_count()
    for name, fn, t in [("encode", lambda: len(tok.encode(text).ids), 1),
                        ("encode_batch", lambda: sum(len(e.ids) for e in tok.encode_batch(lines)),
                         threads)]:
        speeds, n = [], 0
        for _ in range(a.runs):
            t0 = time.perf_counter()
            n = fn()
            speeds.append(mb / (time.perf_counter() - t0))
        print(json.dumps({"impl": "tokenizers " + name, "threads": t, "mb": round(mb, 1),
                          "tokens": n, "median_mb_per_s": round(statistics.median(speeds), 2)}))


if __name__ == "__main__":
    main()
