// GPT-2's byte-level BPE, giving the ids Hugging Face `tokenizers` gives for the same files:
//   1. added tokens (such as <|endoftext|>) are cut out of the text first, leftmost-longest (the
//      non-normalized ones, then the normalized ones in what is left, as `tokenizers` does);
//   2. with a Digits step before ByteLevel (pre_tokenizer Sequence [Digits, ByteLevel], as
//      SmolLM's and StarCoder's tokenizer.json have it) each stretch is first cut around its
//      number characters (\p{N}: one piece each with individual_digits, else one per run),
//      every part going through step 3 on its own (checked against tokenizers 0.20.3:
//      tests/data/bpe/digits_expected.json, scripts/make_bpe_digits_data.py);
//   (with an NFC normalizer, as Qwen2's tokenizer.json has, each stretch is normalized first:
//      ICU, core/data/unicode_nfc.h; its added tokens must be matched before normalization)
//   2'. or with a Split step before ByteLevel (Sequence [Split, ByteLevel], as Meta Llama 3's
//      tokenizer.json has it, behavior Isolated): the Split pattern's matches and the text
//      between them are the parts (the pattern run by PCRE2, its \s and \S spelled as
//      Oniguruma's); with ByteLevel's use_regex false (Llama 3) each part is one piece for step
//      4, else it goes through step 3 (checked against tokenizers 0.20.3 with Llama 3's pattern
//      and ignore_merges: tests/data/bpe/split_expected.json, scripts/make_bpe_split_data.py);
//   3. each remaining stretch is split by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      run by PCRE2 (UTF, Unicode properties, JIT), with \s spelled out as Oniguruma's Unicode
//      \s, [\p{Z}\t-\r\x{85}]: PCRE2's own \s also takes U+180E, which `tokenizers` does not.
//      Stretches of ASCII take a hand-written matcher that gives the pattern's pieces; it hands
//      any decision that depends on a byte >= 0x80 to PCRE2;
//   4. every piece's bytes become GPT-2's printable stand-ins (byte_to_unicode: bytes that are
//      printable Latin-1 stand for themselves, the other 68 for U+0100 onwards, in byte order);
//   5. the piece is merged pairwise, the lowest-ranked merge first (leftmost among equals), until
//      no adjacent pair has a merge; the symbols are the ids.
// Checked id for id against tokenizers 0.23.3 (tests/data/bpe, scripts/make_bpe_data.py), and on
// every Unicode scalar value in letter, digit, space and punctuation contexts.
// Input that is not UTF-8 (which `tokenizers` never sees: Python strings are Unicode) does not
// fail: the pattern matches around an invalid sequence, and each maximal run of bytes that no
// alternative can take becomes a piece of its own (merged like any other), so decode() gives the
// bytes back.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
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
  // pairs, a repeated pair taking its last rank as `tokenizers` does; ignore_merges),
  // added_tokens, a ByteLevel pre-tokenizer without prefix space (alone, or after Digits or an
  // Isolated Split), a ByteLevel (or no) decoder, a ByteLevel or TemplateProcessing
  // post-processor (encode() is add_special_tokens=False: the template's tokens are not added),
  // no normalizer but NFC, no truncation or padding. Anything else -- another model
  // type, a normalizer, BPE dropout, an unknown-token fallback, an added token with lstrip/rstrip/
  // single_word -- is refused naming the file and the field.
  static BpeTokenizer from_tokenizer_json(const std::string& path);
  // GPT-2's original files (merges.txt may start with a "#version" line); "<|endoftext|>", where
  // the vocabulary has it, is a special token. Errors name the file and the line.
  static BpeTokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  // encode()'s ids, computed on up to `threads` threads: the text is cut only where the pattern
  // provably starts afresh -- before a ' ' that follows a character that is not whitespace, or
  // after a '\n' between two such characters -- and never inside an added token; the pieces are
  // encoded in any order and put back in text order.
  // `progress`, when set, is called (from any of the threads, one call at a time) with the
  // number of input bytes encoded so far.
  std::vector<int32_t> encode_parallel(
      std::string_view text, int threads,
      const std::function<void(size_t bytes_done)>& progress = {}) const;
  // The bytes of `ids` (an added token as its content); an id outside the vocabulary becomes
  // U+FFFD. The result need not be valid UTF-8 when the ids cut a character.
  std::string decode(std::span<const int32_t> ids) const;

  // Largest id + 1 over the vocabulary and the added tokens.
  int vocab_size() const { return static_cast<int>(id_bytes_.size()); }
  // The id of an added token, or of a vocabulary token (spelled with the byte stand-ins, as in
  // vocab.json: "Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;

 private:
  BpeTokenizer();
  struct Segment {  // a stretch of text, or an added token
    std::string_view text;
    int32_t added_id = -1;
  };
  struct AddedToken {
    std::string content;
    int32_t id;
    bool normalized;  // matched in the second pass (no normalizer: the same text)
  };
  struct MergeSlot {  // one slot of the open-addressing merge table
    uint64_t key;     // left id << 32 | right id; kNoMerge when empty
    int32_t rank;
    int32_t id;  // the merged token
  };
  class Regex;   // the compiled patterns (PCRE2)
  struct State;  // one encoding thread's match data, piece cache and scratch

  // Derived tables and checks; `merges` holds (left id, right id, merged id) in rank order.
  void finish(const std::string& source, const std::vector<std::array<int32_t, 3>>& merges);
  std::vector<Segment> split_added(std::string_view text) const;
  // Appends the ids of one stretch without added tokens: split at number characters first when
  // the pre-tokenizer has a Digits step, then GPT-2's pattern (encode_pieces).
  void encode_text(std::string_view text, std::vector<int32_t>& out, State& state) const;
  // encode_text after the normalizer (NFC where the tokenizer has one).
  void encode_normalized(std::string_view text, std::vector<int32_t>& out, State& state) const;
  void encode_pieces(std::string_view text, std::vector<int32_t>& out, State& state) const;
  // One piece's ids through the piece cache (its bytes mapped to GPT-2's stand-ins and merged).
  void encode_cached(std::string_view piece, std::vector<int32_t>& out, State& state) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, State& state) const;
  // About how many ids `text` will give (a little more), to reserve.
  size_t expected_ids(std::string_view text, State& state) const;
  const MergeSlot* find_merge(int32_t left, int32_t right) const;
  // Whether the character that ends at text[i - 1] / starts at text[i] exists, is valid UTF-8 and
  // is not whitespace to the pattern.
  bool non_space_before(std::string_view text, size_t i) const;
  bool non_space_at(std::string_view text, size_t i) const;

  std::unordered_map<std::string, int32_t> vocab_;  // byte-level token -> id
  std::vector<std::string> id_bytes_;               // id -> the bytes decode() gives
  std::vector<bool> known_;                         // id -> in the vocabulary or added
  std::vector<AddedToken> added_;
  std::vector<MergeSlot> merge_table_;  // power-of-two size, at most half full
  int merge_shift_ = 64;                // 64 - log2(table size)
  std::array<int32_t, 256> byte_id_{};  // id of each byte's stand-in (-1: not in vocab)
  bool ignore_merges_ = false;  // a piece that is a vocabulary token as a whole is not merged
  // A Digits pre-tokenizer before ByteLevel (SmolLM, StarCoder): number characters (Unicode N*)
  // are pieces of their own, one each (individual_digits) or one per run.
  enum class Digits { kNone, kIndividual, kContiguous };
  Digits digits_ = Digits::kNone;
  // A Split pre-tokenizer before ByteLevel (Llama 3): its regex's matches and the text between
  // them are the parts; split_cuts_: the pattern is Llama 3's, which encode_parallel may cut.
  bool split_ = false, split_cuts_ = false;
  bool nfc_ = false;        // an NFC normalizer (Qwen2): encode_text normalizes each stretch
  bool byte_regex_ = true;  // ByteLevel's use_regex: GPT-2's pattern splits each part further
  std::unique_ptr<const Regex> regex_;
};

}  // namespace ct
