// The tokenizer a run uses, behind one interface: GPT-2's byte-level BPE when the model folder has
// Hugging Face tokenizer files, else crosstrain's byte-level tokenizer (one token per byte).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ct {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The same ids as encode(), computed on up to `threads` threads; `progress` (optional) gets
  // the input bytes done so far.
  virtual std::vector<int32_t> encode_parallel(
      std::string_view text, int threads,
      const std::function<void(size_t)>& progress = {}) const = 0;
  // Ids outside the vocabulary become U+FFFD.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  // The id of "<|endoftext|>", where the vocabulary has one.
  virtual std::optional<int32_t> end_of_text() const = 0;
  // "byte-level (256 tokens)" or "BPE <folder> (50257 tokens)".
  virtual std::string describe() const = 0;
  // The folder holding the tokenizer files ("" for the byte-level one): copied beside outputs.
  virtual std::string folder() const = 0;
  // false for make_ids_only_tokenizer's: encode() throws.
  virtual bool encodes_text() const { return true; }
};

std::unique_ptr<TextTokenizer> make_byte_tokenizer();

// Whether `dir` holds tokenizer.json, or vocab.json with merges.txt.
bool folder_has_tokenizer(const std::string& dir);

// The tokenizer of the model folder `dir`: its BPE files where folder_has_tokenizer, else the
// byte-level tokenizer.
std::unique_ptr<TextTokenizer> tokenizer_for_model(const std::string& dir);

// The BPE tokenizer of `dir` (BpeTokenizer::from_folder; errors name the file).
std::unique_ptr<TextTokenizer> load_bpe_tokenizer(const std::string& dir);

// For a run on token-file data whose model folder `dir` has tokenizer files crosstrain cannot
// read (`why`: the error that said so): token ids only. encode() throws Error(kUnsupported)
// with `why`; decode() writes the ids ("[464 318 ...]"); folder() is `dir`, so the files are
// still copied beside the outputs for transformers to use.
std::unique_ptr<TextTokenizer> make_ids_only_tokenizer(const std::string& dir, int vocab_size,
                                                       const std::string& why);

}  // namespace ct
