// GPT-2's byte-level BPE, giving the ids Hugging Face `tokenizers` gives for the same files:
//   1. added tokens (such as <|endoftext|>) are cut out of the text first, leftmost-longest;
//   2. each remaining stretch is split by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (PCRE2 with Unicode properties, JIT-compiled);
//   3. every piece's bytes become GPT-2's printable stand-ins (byte_to_unicode: bytes that are
//      printable Latin-1 stand for themselves, the other 68 for U+0100 onwards, in byte order);
//   4. the piece is merged pairwise, the lowest-ranked merge first (leftmost among equals), until
//      no adjacent pair has a merge; the symbols are the ids.
// Input that is not UTF-8 (which `tokenizers` never sees: Python strings are Unicode) does not
// fail: the pattern matches around an invalid sequence, and its bytes form a piece of their own.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ct {

class BpeTokenizer {
 public:
  // From a folder: tokenizer.json when it is there, else vocab.json + merges.txt.
  static BpeTokenizer from_folder(const std::string& dir);
  // Hugging Face's tokenizer.json: model.type "BPE" (vocab; merges as "a b" strings or [a, b]
  // pairs; ignore_merges), added_tokens, a ByteLevel pre-tokenizer without prefix space, a
  // ByteLevel (or no) decoder and post-processor, no normalizer. Anything else -- another model
  // type, a normalizer, BPE dropout, an unknown-token fallback, an added token with lstrip/rstrip/
  // single_word -- is refused naming the file and the field.
  static BpeTokenizer from_tokenizer_json(const std::string& path);
  // GPT-2's original files; "<|endoftext|>", where the vocabulary has it, is a special token.
  static BpeTokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // encode()'s ids, computed on up to `threads` threads: the text is cut only where the pattern
  // provably starts afresh (a '\n' between two printable ASCII characters, outside added tokens).
  // `progress`, when set, is called (from any of the threads, one call at a time) with the
  // number of input bytes encoded so far.
  std::vector<int32_t> encode_parallel(
      std::string_view text, int threads,
      const std::function<void(size_t bytes_done)>& progress = {}) const;
  // The text of `ids`; an id outside the vocabulary becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids) const;

  // Largest id + 1 over the vocabulary and the added tokens.
  int vocab_size() const { return static_cast<int>(id_to_token_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const;

 private:
  BpeTokenizer();
  struct Segment {  // a stretch of text, or an added token
    std::string_view text;
    int32_t added_id = -1;
  };
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  class Regex;  // the compiled pattern (PCRE2)

  void finish(const std::string& source);  // derived tables, checks
  std::vector<Segment> split_added(std::string_view text) const;
  // Appends the ids of one stretch without added tokens.
  void encode_text(std::string_view text, std::vector<int32_t>& out, void* match_data,
                   std::unordered_map<std::string, std::vector<int32_t>>& cache) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::unordered_map<std::string, int32_t> vocab_;      // byte-level token -> id
  std::vector<std::string> id_to_token_;                // id -> token as stored ("" if unused)
  std::vector<bool> is_added_;                          // id -> an added token (decoded verbatim)
  std::vector<std::pair<std::string, int32_t>> added_;  // content, id
  std::unordered_map<uint64_t, Merge> merges_;          // (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_id_{};       // id of each byte's stand-in (-1: not in vocab)
  std::array<int16_t, 512> unicode_byte_{};  // stand-in code point -> byte (-1: none)
  bool ignore_merges_ = false;  // a piece that is a vocabulary token as a whole is not merged
  Regex* regex_ = nullptr;
};

}  // namespace ct
