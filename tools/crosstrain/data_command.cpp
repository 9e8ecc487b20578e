// crosstrain prepare-data: text -> an llm.c token file, with the tokenizer of a model folder.
#include <filesystem>
#include <memory>
#include <thread>

#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "core/train/progress.h"
#include "tools/crosstrain/cli_util.h"
#include "tools/crosstrain/commands.h"

namespace ct::cli {

Run add_prepare_data(CLI::App& app) {
  struct Opts {
    std::string tokenizer, data, output;
    int threads = 0;
    bool progress = true;
  };
  auto o = std::make_shared<Opts>();
  flag(&app, "--tokenizer", o->tokenizer,
       "folder with tokenizer.json, or vocab.json + merges.txt (a Hugging Face model folder)")
      ->required();
  flag(&app, "--data", o->data, "text file or folder of text files")->required();
  flag(&app, "--output", o->output, "the llm.c token file to write (atomically)")->required();
  flag(&app, "--threads", o->threads, "encoding threads (0 = every core)");
  app.add_flag("!--no-progress", o->progress, "no progress bar");
  return [o] {
    if (o->threads < 0)
      fail(ErrorKind::kInvalidArgument,
           "--threads " + std::to_string(o->threads) + ": must be >= 0");
    if (!std::filesystem::is_directory(o->tokenizer) || !folder_has_tokenizer(o->tokenizer))
      fail(ErrorKind::kInvalidArgument,
           "--tokenizer '" + o->tokenizer +
               "': not a folder with tokenizer.json or vocab.json + merges.txt");
    auto tok = load_bpe_tokenizer(o->tokenizer);
    const std::string text = load_text(o->data, 1);
    const int threads =
        o->threads > 0 ? o->threads : std::max(1u, std::thread::hardware_concurrency());
    std::vector<int32_t> ids;
    {
      ByteProgress bar("tokenizing", static_cast<int64_t>(text.size()), o->progress);
      ids = tok->encode_parallel(text, threads,
                                 [&](size_t done) { bar.update(static_cast<int64_t>(done)); });
      bar.finish();
    }
    write_llmc_token_file(o->output, ids);
    std::printf("%s: %zu tokens from %zu bytes (%s), vocabulary %d\n", o->output.c_str(),
                ids.size(), text.size(), tok->describe().c_str(), tok->vocab_size());
    return 0;
  };
}

}  // namespace ct::cli
