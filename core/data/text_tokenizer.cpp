#include "core/data/text_tokenizer.h"

#include <filesystem>

#include "core/data/bpe_tokenizer.h"
#include "core/data/tokenizer.h"
#include "core/error.h"

namespace ct {
namespace fs = std::filesystem;

namespace {

class ByteLevel final : public TextTokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override { return tok_.encode(text); }
  std::vector<int32_t> encode_parallel(std::string_view text, int,
                                       const std::function<void(size_t)>& progress) const override {
    std::vector<int32_t> ids = tok_.encode(text);  // one byte, one token: memory-bound
    if (progress) progress(text.size());
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override { return tok_.decode(ids); }
  int vocab_size() const override { return tok_.vocab_size(); }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  std::string describe() const override { return "byte-level (256 tokens)"; }
  std::string folder() const override { return ""; }

 private:
  ByteTokenizer tok_;
};

class Bpe final : public TextTokenizer {
 public:
  Bpe(BpeTokenizer tok, std::string dir) : tok_(std::move(tok)), dir_(std::move(dir)) {}
  std::vector<int32_t> encode(std::string_view text) const override { return tok_.encode(text); }
  std::vector<int32_t> encode_parallel(std::string_view text, int threads,
                                       const std::function<void(size_t)>& progress) const override {
    return tok_.encode_parallel(text, threads, progress);
  }
  std::string decode(std::span<const int32_t> ids) const override { return tok_.decode(ids); }
  int vocab_size() const override { return tok_.vocab_size(); }
  std::optional<int32_t> end_of_text() const override { return tok_.token_to_id("<|endoftext|>"); }
  std::string describe() const override {
    return "BPE " + dir_ + " (" + std::to_string(tok_.vocab_size()) + " tokens)";
  }
  std::string folder() const override { return dir_; }

 private:
  BpeTokenizer tok_;
  std::string dir_;
};

class IdsOnly final : public TextTokenizer {
 public:
  IdsOnly(std::string dir, int vocab, std::string why)
      : dir_(std::move(dir)), vocab_(vocab), why_(std::move(why)) {}
  std::vector<int32_t> encode(std::string_view) const override {
    fail(ErrorKind::kUnsupported, "cannot encode text: " + why_);
  }
  std::vector<int32_t> encode_parallel(std::string_view text, int,
                                       const std::function<void(size_t)>&) const override {
    return encode(text);
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) s += ' ';
      s += std::to_string(ids[i]);
    }
    return s + "]";
  }
  int vocab_size() const override { return vocab_; }
  std::optional<int32_t> end_of_text() const override { return std::nullopt; }
  std::string describe() const override {
    return "token ids only (" + dir_ + "'s tokenizer is not supported)";
  }
  std::string folder() const override { return dir_; }
  bool encodes_text() const override { return false; }

 private:
  std::string dir_;
  int vocab_;
  std::string why_;
};

}  // namespace

std::unique_ptr<TextTokenizer> make_ids_only_tokenizer(const std::string& dir, int vocab_size,
                                                       const std::string& why) {
  return std::make_unique<IdsOnly>(dir, vocab_size, why);
}

std::unique_ptr<TextTokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteLevel>();
}

bool folder_has_tokenizer(const std::string& dir) {
  const fs::path d(dir);
  return fs::is_regular_file(d / "tokenizer.json") ||
         (fs::is_regular_file(d / "vocab.json") && fs::is_regular_file(d / "merges.txt"));
}

std::unique_ptr<TextTokenizer> tokenizer_for_model(const std::string& dir) {
  return folder_has_tokenizer(dir) ? load_bpe_tokenizer(dir) : make_byte_tokenizer();
}

std::unique_ptr<TextTokenizer> load_bpe_tokenizer(const std::string& dir) {
  return std::make_unique<Bpe>(BpeTokenizer::from_folder(dir), dir);
}

}  // namespace ct
