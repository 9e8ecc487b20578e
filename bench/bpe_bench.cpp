// Encoding speed of crosstrain's GPT-2 BPE (MB/s of UTF-8 input, median of the runs) on 1 and on
// N threads; bench/bpe_bench.py measures Hugging Face `tokenizers` on the same file and tokenizer.
//
//   bpe_bench --tokenizer DIR --text FILE [--min-mb 20] [--runs 5] [--threads 2]
//
// The file is repeated until it holds at least --min-mb MB. Prints one JSON line per setting.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/data/bpe_tokenizer.h"
#include "core/io/read_file.h"

using namespace ct;

int main(int argc, char** argv) {
  std::string dir, file;
  double min_mb = 20;
  int runs = 5, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokenizer")
      dir = v;
    else if (k == "--text")
      file = v;
    else if (k == "--min-mb")
      min_mb = std::atof(v.c_str());
    else if (k == "--runs")
      runs = std::atoi(v.c_str());
    else if (k == "--threads")
      threads = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "bpe_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (dir.empty() || file.empty() || runs < 1 || threads < 1) {
    std::fprintf(stderr,
                 "usage: bpe_bench --tokenizer DIR --text FILE [--min-mb 20] [--runs 5] "
                 "[--threads 2]\n");
    return 2;
  }
  const BpeTokenizer tok = BpeTokenizer::from_folder(dir);
  const std::string one = read_file_bytes(file);
  std::string text;
  while (text.size() < min_mb * 1e6) text += one;
  for (int t : {1, threads}) {
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
    if (t == threads) break;
  }
  return 0;
}
