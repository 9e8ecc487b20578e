// Encoding speed of crosstrain's GPT-2 BPE (MB/s of UTF-8 input, median of the runs) on 1 and on
// N threads; bench/bpe_bench.py measures Hugging Face `tokenizers` on the same text and files.
//
//   bpe_bench --tokenizer DIR [--text FILE] [--min-mb 20] [--runs 5] [--threads 2]
//             [--write-text OUT]
//
// The text is FILE repeated until it holds at least --min-mb MB, or without --text a generated
// corpus of that size (seeded: English-like prose with names, numbers, contractions, code lines
// and some non-ASCII words). --write-text saves the exact text measured, for bpe_bench.py.
// Prints one JSON line per thread count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/data/bpe_tokenizer.h"
#include "core/io/read_file.h"

using namespace ct;

namespace {

std::string generated_corpus(size_t bytes) {
  static const char* kWords[] = {
      "the",     "of",       "and",    "to",      "in",       "a",       "is",       "that",
      "for",     "it",       "as",     "was",     "with",     "be",      "by",       "on",
      "not",     "he",       "this",   "are",     "or",       "his",     "from",     "at",
      "which",   "but",      "have",   "an",      "had",      "they",    "you",      "were",
      "their",   "one",      "all",    "we",      "can",      "her",     "has",      "there",
      "been",    "if",       "more",   "when",    "will",     "would",   "who",      "so",
      "harbour", "morning",  "boats",  "market",  "window",   "library", "question", "answer",
      "river",   "mountain", "letter", "history", "computer", "memory",  "gradient", "tokenizer",
      "it's",    "don't",    "we'll",  "they're", "I've",     "you'd",   "café",     "naïve",
      "Zürich",  "καλημέρα", "привет", "日本語",  "🙂",     "2024",    "3.14",     "1,000"};
  static const char* kSyllables[] = {"ka",  "ren", "to", "mi",  "sha", "lo",  "vin", "er",
                                     "dra", "qu",  "ix", "bel", "mon", "tes", "or",  "zu"};
  static const char* kCode[] = {"    for (int i = 0; i < n; ++i) sum += a[i] * b[i];\n",
                                "def step(self, x):\n        return self.w @ x + self.b\n",
                                "\tif (err != 0) { return -1; }  // retry later\n",
                                "    \"key\": [1, 2, 3], \"name\": \"value\",\n"};
  std::mt19937 rng(42);
  std::string text;
  text.reserve(bytes + 256);
  size_t line = 0;
  while (text.size() < bytes) {
    const uint32_t r = rng() % 100;
    std::string w;
    if (r < 80) {
      w = kWords[rng() % std::size(kWords)];
    } else if (r < 92) {  // a made-up name
      w = kSyllables[rng() % std::size(kSyllables)];
      w[0] = static_cast<char>(w[0] - 'a' + 'A');
      for (uint32_t k = rng() % 3; k > 0; --k) w += kSyllables[rng() % std::size(kSyllables)];
    } else {
      w = std::to_string(rng() % 100000);
    }
    text += w;
    line += w.size() + 1;
    const uint32_t p = rng() % 100;
    text += p < 6 ? ", " : p < 10 ? ". " : " ";
    if (line > 72) {
      text += rng() % 8 == 0 ? "\n\n" : "\n";
      if (rng() % 20 == 0) text += kCode[rng() % std::size(kCode)];
      line = 0;
    }
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, file, write_text;
  double min_mb = 20;
  int runs = 5, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokenizer") {
      dir = v;
    } else if (k == "--text") {
      file = v;
    } else if (k == "--write-text") {
      write_text = v;
    } else if (k == "--min-mb") {
      min_mb = std::atof(v.c_str());
    } else if (k == "--runs") {
      runs = std::atoi(v.c_str());
    } else if (k == "--threads") {
      threads = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "bpe_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (dir.empty() || runs < 1 || threads < 1 || (argc - 1) % 2 != 0) {
    std::fprintf(stderr,
                 "usage: bpe_bench --tokenizer DIR [--text FILE] [--min-mb 20] [--runs 5] "
                 "[--threads 2] [--write-text OUT]\n");
    return 2;
  }
  const BpeTokenizer tok = BpeTokenizer::from_folder(dir);
  std::string text;
  if (file.empty()) {
    text = generated_corpus(static_cast<size_t>(min_mb * 1e6));
  } else {
    const std::string one = read_file_bytes(file);
    if (one.empty()) {
      std::fprintf(stderr, "bpe_bench: %s is empty\n", file.c_str());
      return 2;
    }
    while (text.size() < min_mb * 1e6) text += one;
  }
  if (!write_text.empty()) {
    std::FILE* f = std::fopen(write_text.c_str(), "wb");
    if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size()) {
      std::fprintf(stderr, "bpe_bench: cannot write %s\n", write_text.c_str());
      return 1;
    }
    std::fclose(f);
  }
  std::vector<int> counts = {1};
  if (threads > 1) counts.push_back(threads);
  for (int t : counts) {
    std::vector<double> mbs;
    size_t n_ids = 0;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      n_ids = tok.encode_parallel(text, t).size();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      mbs.push_back(static_cast<double>(text.size()) / 1e6 / s);
    }
    std::sort(mbs.begin(), mbs.end());
    std::printf(
        "{\"impl\": \"crosstrain\", \"threads\": %d, \"mb\": %.1f, \"tokens\": %zu, "
        "\"median_mb_per_s\": %.2f}\n",
        t, static_cast<double>(text.size()) / 1e6, n_ids, mbs[mbs.size() / 2]);
  }
  return 0;
}
