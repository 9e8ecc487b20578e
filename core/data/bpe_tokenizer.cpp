#include "core/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>

#include "core/data/unicode_nfc.h"
#include "core/error.h"
#include "core/io/json_file.h"

namespace ct {
namespace fs = std::filesystem;

namespace {

// GPT-2's pattern with \s written out as Oniguruma's Unicode \s (the White_Space property:
// category Z, \t \n \v \f \r and NEL), which is what `tokenizers` runs. PCRE2's \s would also take
// U+180E MONGOLIAN VOWEL SEPARATOR (a space before Unicode 6.3), and split differently there.
#define CT_SPACE R"(\p{Z}\t-\r\x{85})"
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" CT_SPACE R"(\p{L}\p{N}]+|[)" CT_SPACE
    R"(]+(?![^)" CT_SPACE R"(])|[)" CT_SPACE R"(]+)";
constexpr const char* kSpaceClass = "[" CT_SPACE "]";

// A Split pre-tokenizer's pattern (Oniguruma syntax in `tokenizers`) for PCRE2: \s and \S as
// Oniguruma's, inside and outside character classes (a \S inside a class has no such spelling:
// null). The rest of the syntax Llama 3's pattern uses -- (?i:..), \p{..}, {m,n}, (?!..) -- means
// the same in both.
std::optional<std::string> onig_to_pcre2(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's')
        out += in_class ? CT_SPACE : "[" CT_SPACE "]";
      else if (e == 'S' && !in_class)
        out += "[^" CT_SPACE "]";
      else if (e == 'S')
        return std::nullopt;
      else
        out += std::string{c, e};
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ] first
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}
#undef CT_SPACE

// Llama 3's Split pattern (tokenizer.json of Meta-Llama-3 and 3.1/3.2): encode_parallel knows
// where it may cut text split by it.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Largest id accepted: ids index dense tables, and real vocabularies stay far below this.
constexpr int64_t kMaxId = (int64_t{1} << 24) - 1;
// Pieces up to this many bytes are cached; longer ones (runs of spaces or digits) are rare.
constexpr size_t kMaxCachedPiece = 64;
// Pieces of more symbols than this are merged with a heap instead of by rescanning.
constexpr size_t kMaxRescanSymbols = 64;
constexpr uint64_t kNoMerge = ~uint64_t{0};

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  fail(ErrorKind::kInvalidArgument, where + ": " + what);
}

// GPT-2's stand-in code point for each byte: the printable Latin-1 bytes stand for themselves,
// the others (controls, space, DEL, NBSP, soft hyphen) for U+0100 onwards in byte order.
const std::array<int32_t, 256>& byte_to_unicode() {
  static const std::array<int32_t, 256> table = [] {
    std::array<int32_t, 256> cp{};
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      cp[b] = printable ? b : next++;
    }
    return cp;
  }();
  return table;
}

void append_utf8(std::string& s, int32_t cp) {
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {  // stand-ins are below U+0800
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The code point at s[i], advancing i past it; -1 (advancing one byte) where s[i] does not start
// a valid UTF-8 sequence (truncated, overlong, a surrogate, beyond U+10FFFF).
int32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
  if (n == 0) {
    ++i;
    return c;
  }
  if (n < 0 || i + n >= s.size()) {
    ++i;
    return -1;
  }
  int32_t cp = c & (0x3F >> n);
  for (int k = 1; k <= n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 2) {
      ++i;
      return -1;
    }
    cp = cp << 6 | (d & 0x3F);
  }
  static constexpr int32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return -1;
  }
  i += n + 1;
  return cp;
}

// ---- the ASCII matcher ------------------------------------------------------------------------

// What the pattern sees in an ASCII byte; kHigh: a byte of a multi-byte character (or invalid).
enum : uint8_t { kHigh = 0, kLetter, kDigit, kSpace, kOther };

constexpr std::array<uint8_t, 256> kAsciiClass = [] {
  std::array<uint8_t, 256> t{};
  for (int b = 0; b < 128; ++b) {
    t[b] = ((b | 0x20) >= 'a' && (b | 0x20) <= 'z') ? kLetter
           : (b >= '0' && b <= '9')                 ? kDigit
           : (b == ' ' || (b >= '\t' && b <= '\r')) ? kSpace
                                                    : kOther;
  }
  return t;
}();

// The end of the piece the pattern matches at `pos` (< s.size()), decided from ASCII bytes
// alone, or 0 where a byte >= 0x80 takes part in the decision (a letter? a space?): then PCRE2
// decides. It follows the alternatives in order:
//   's|'t|'re|'ve|'m|'ll|'d     -> the contraction
//   ' ?' then letters / digits / others (not space, letter or digit) -> the longest run
//   whitespace: the longest run if it ends the text; else the run less its last character,
//   which (?!\S) needs as lookahead, when that leaves one or more; else the one character.
size_t ascii_piece_end(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto run = [&](size_t i, uint8_t cls) -> size_t {  // the run of `cls` from i
    while (i < n && kAsciiClass[p[i]] == cls) ++i;
    return i < n && p[i] >= 0x80 ? 0 : i;
  };
  const unsigned char c = p[pos];
  switch (kAsciiClass[c]) {
    case kLetter:
      return run(pos + 1, kLetter);
    case kDigit:
      return run(pos + 1, kDigit);
    case kOther:
      if (c == '\'' && pos + 1 < n) {
        const unsigned char d = p[pos + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return pos + 2;
        if (pos + 2 < n && ((d == 'r' && p[pos + 2] == 'e') || (d == 'v' && p[pos + 2] == 'e') ||
                            (d == 'l' && p[pos + 2] == 'l')))
          return pos + 3;
      }
      return run(pos + 1, kOther);
    case kSpace: {
      if (c == ' ' && pos + 1 < n) {
        const uint8_t next = kAsciiClass[p[pos + 1]];
        if (next == kHigh) return 0;
        if (next != kSpace) return run(pos + 2, next);
      }
      size_t i = pos + 1;
      while (i < n && kAsciiClass[p[i]] == kSpace) ++i;
      if (i == n) return n;
      if (p[i] >= 0x80) return 0;
      return i - pos >= 2 ? i - 1 : i;
    }
    default:
      return 0;
  }
}

// ---- tables -----------------------------------------------------------------------------------

uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

// A hash of a piece's bytes.
uint64_t hash_piece(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull * (n + 1);
  while (n > 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix64(h ^ w);
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + n - 4, 4);
    w = uint64_t{a} << 32 | b;
  } else if (n > 0) {
    const auto* u = reinterpret_cast<const unsigned char*>(p);
    w = uint64_t{u[0]} << 16 | uint64_t{u[n >> 1]} << 8 | u[n - 1];
  }
  return mix64(h ^ w ^ 0x5851F42D4C957F2Dull) | 1;
}

// Piece bytes -> ids, one per encoding thread. Most lookups touch one cache line: the slots are
// 4 bytes (an 8-bit hash tag and an entry index), and an entry of 64 bytes holds the key and the
// ids of a piece of up to 22 bytes and 10 ids; other pieces go to a map beside it. Cleared when
// full, which bounds its memory (about 20 MB, and 64Ki pieces of up to kMaxCachedPiece bytes) on
// text with ever new pieces.
class PieceCache {
 public:
  PieceCache() { slots_.resize(size_t{1} << 12); }

  // On a hit, appends the piece's ids to `out` and returns true.
  bool append(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const {
    if (piece.size() > kKeyMax) return append_long(piece, out);
    const size_t mask = slots_.size() - 1;
    const uint32_t tag = static_cast<uint32_t>(hash >> 56) << 24;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const uint32_t s = slots_[i];
      if (s == 0) return append_long(piece, out);  // a short piece of many ids (CJK)
      if ((s & 0xFF000000u) != tag) continue;
      const Entry& e = entries_[(s & 0xFFFFFFu) - 1];
      if (e.key_len != piece.size() || !same_bytes(e.key, piece)) continue;
      for (int k = 0; k < e.n_ids; ++k) out.push_back(e.ids[k]);
      return true;
    }
  }

  void insert(std::string_view piece, uint64_t hash, const int32_t* ids, size_t n_ids) {
    if (piece.size() > kKeyMax || n_ids > kIdsMax) {
      if (long_.size() >= kMaxLong) long_.clear();
      long_.emplace(std::string(piece), std::vector<int32_t>(ids, ids + n_ids));
      return;
    }
    if (entries_.size() >= kMaxEntries) {
      std::fill(slots_.begin(), slots_.end(), 0u);
      entries_.clear();
    } else if ((entries_.size() + 1) * 2 > slots_.size()) {
      std::vector<uint32_t> old(slots_.size() * 2, 0u);
      old.swap(slots_);
      for (size_t k = 0; k < entries_.size(); ++k)
        place(hash_piece(entries_[k].key, entries_[k].key_len), k);
    }
    Entry& e = entries_.emplace_back();
    e.key_len = static_cast<uint8_t>(piece.size());
    e.n_ids = static_cast<uint8_t>(n_ids);
    std::memcpy(e.key, piece.data(), piece.size());
    std::copy(ids, ids + n_ids, e.ids);
    place(hash, entries_.size() - 1);
  }

 private:
  static constexpr size_t kKeyMax = 22, kIdsMax = 10;
  static constexpr size_t kMaxEntries = size_t{1} << 18, kMaxLong = size_t{1} << 16;
  struct alignas(64) Entry {
    uint8_t key_len, n_ids;
    char key[kKeyMax];
    int32_t ids[kIdsMax];
  };
  static_assert(sizeof(Entry) == 64);

  bool append_long(std::string_view piece, std::vector<int32_t>& out) const {
    if (long_.empty()) return false;
    auto it = long_.find(piece);
    if (it == long_.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  static bool same_bytes(const char* key, std::string_view piece) {
    for (size_t k = 0; k < piece.size(); ++k)
      if (key[k] != piece[k]) return false;
    return true;
  }
  void place(uint64_t hash, size_t entry) {
    const size_t mask = slots_.size() - 1;
    size_t i = hash & mask;
    while (slots_[i] != 0) i = (i + 1) & mask;
    slots_[i] = static_cast<uint32_t>(hash >> 56) << 24 | static_cast<uint32_t>(entry + 1);
  }

  std::vector<uint32_t> slots_;
  std::vector<Entry> entries_;
  struct Hash {  // std::hash of the bytes, for lookups by string_view
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> long_;
};

}  // namespace

// ---- the patterns -------------------------------------------------------------------------------

class BpeTokenizer::Regex {
 public:
  // `split`: a Split pre-tokenizer's pattern (null: none); `where` names it in errors.
  explicit Regex(const std::string* split = nullptr, const std::string& where = "") {
    // MATCH_INVALID_UTF: invalid UTF-8 matches nothing (and is skipped) instead of being an
    // error or, with the JIT, undefined behaviour.
    if (split) {
      int err = 0;
      PCRE2_SIZE offset = 0;
      split_ =
          pcre2_compile(reinterpret_cast<PCRE2_SPTR>(split->data()), split->size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
      if (split_ == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        fail(ErrorKind::kInvalidArgument, where + ": the pattern does not compile (PCRE2, at " +
                                              std::to_string(offset) +
                                              "): " + reinterpret_cast<const char*>(msg));
      }
      split_jit_ = pcre2_jit_compile(split_, PCRE2_JIT_COMPLETE) == 0;
    }
    code_ = compile(kPattern, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF);
    space_ = compile(kSpaceClass, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED);
    number_ = compile("\\p{N}+", PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF);
    number_jit_ = pcre2_jit_compile(number_, PCRE2_JIT_COMPLETE) == 0;
    // Without the JIT (not built in, or no executable memory) pcre2_match interprets.
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() {
    pcre2_code_free(split_);  // (null is allowed)
    pcre2_code_free(code_);
    pcre2_code_free(space_);
    pcre2_code_free(number_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const pcre2_code* code() const { return code_; }

  // The first match at or after `pos`: pcre2_match's result, the match in md's ovector.
  int match(std::string_view text, size_t pos, pcre2_match_data* md) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    return jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, 0, md, nullptr)
                : pcre2_match(code_, subject, text.size(), pos, 0, md, nullptr);
  }

  // The first run of number characters (\p{N}+) at or after `pos`, in md's ovector.
  int match_number(std::string_view text, size_t pos, pcre2_match_data* md) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    return number_jit_ ? pcre2_jit_match(number_, subject, text.size(), pos, 0, md, nullptr)
                       : pcre2_match(number_, subject, text.size(), pos, 0, md, nullptr);
  }

  // The Split pattern's first match at or after `pos`, in md's ovector.
  int match_split(std::string_view text, size_t pos, pcre2_match_data* md) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    return split_jit_ ? pcre2_jit_match(split_, subject, text.size(), pos, 0, md, nullptr)
                      : pcre2_match(split_, subject, text.size(), pos, 0, md, nullptr);
  }

  // Whether the one valid UTF-8 character `ch` is whitespace to the pattern.
  bool is_space(std::string_view ch) const {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    CT_CHECK(md != nullptr, "out of memory");
    const int rc = pcre2_match(space_, reinterpret_cast<PCRE2_SPTR>(ch.data()), ch.size(), 0,
                               PCRE2_NO_UTF_CHECK, md, nullptr);
    pcre2_match_data_free(md);
    return rc > 0;
  }

 private:
  static pcre2_code* compile(const char* pattern, uint32_t options) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     options, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(ErrorKind::kInternal, std::string("GPT-2's pattern does not compile in PCRE2 at ") +
                                     std::to_string(offset) + ": " +
                                     reinterpret_cast<const char*>(msg));
    }
    return code;
  }

  pcre2_code* code_ = nullptr;
  pcre2_code* space_ = nullptr;
  pcre2_code* number_ = nullptr;
  pcre2_code* split_ = nullptr;
  bool jit_ = false, number_jit_ = false, split_jit_ = false;
};

struct BpeTokenizer::State {
  explicit State(const Regex& regex)
      : md(pcre2_match_data_create_from_pattern(regex.code(), nullptr)),
        md_number(pcre2_match_data_create(1, nullptr)),
        md_split(pcre2_match_data_create(1, nullptr)) {
    CT_CHECK(md != nullptr && md_number != nullptr && md_split != nullptr, "out of memory");
  }
  ~State() {
    pcre2_match_data_free(md);
    pcre2_match_data_free(md_number);
    pcre2_match_data_free(md_split);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  pcre2_match_data* md;
  pcre2_match_data* md_number;
  pcre2_match_data* md_split;  // one pair: pcre2_match returns 0 for a match with groups
  PieceCache cache;
  std::vector<int32_t> sym, ranks, merged, ids;  // encode_piece's scratch
};

// ---- loading ------------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer() : regex_(std::make_unique<Regex>()) {}
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

BpeTokenizer BpeTokenizer::from_folder(const std::string& dir) {
  const fs::path d(dir);
  if (fs::is_regular_file(d / "tokenizer.json"))
    return from_tokenizer_json((d / "tokenizer.json").string());
  if (fs::is_regular_file(d / "vocab.json") && fs::is_regular_file(d / "merges.txt"))
    return from_files((d / "vocab.json").string(), (d / "merges.txt").string());
  fail(ErrorKind::kInvalidArgument,
       dir + ": no tokenizer.json, and no vocab.json with merges.txt, to read a tokenizer from");
}

namespace {

void read_vocab(const nlohmann::json& v, const std::string& where,
                std::unordered_map<std::string, int32_t>& vocab) {
  if (!v.is_object()) bad(where, "the vocabulary is not a JSON object of token: id");
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxId)
      bad(where, "token " + nlohmann::json(token).dump() + " has id " + id.dump() +
                     ", not an integer in [0, " + std::to_string(kMaxId) + "]");
    vocab.emplace(token, id.get<int32_t>());
  }
}

}  // namespace

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  if (!j.is_object()) bad(path, "not a JSON object");
  auto refuse = [&](const std::string& field, const nlohmann::json& value, const char* why) {
    bad(path, "'" + field + "': " + value.dump() + " is not supported (" + why + ")");
  };
  bool nfc = false;  // Qwen2's: Unicode NFC before the pre-tokenizer
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    if (!j["normalizer"].is_object() || j["normalizer"].value("type", "") != "NFC")
      refuse("normalizer", j["normalizer"], "only none or NFC");
    nfc = true;
  }
  nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  Digits digits = Digits::kNone;
  std::optional<std::string> split;  // a Split step's pattern
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    const nlohmann::json steps = pre.value("pretokenizers", nlohmann::json());
    const std::string first = steps.is_array() && !steps.empty() && steps[0].is_object()
                                  ? steps[0].value("type", "")
                                  : "";
    if (!steps.is_array() || steps.size() != 2 || (first != "Digits" && first != "Split") ||
        !steps[1].is_object() || steps[1].value("type", "") != "ByteLevel")
      refuse("pre_tokenizer", pre, "a Sequence only as [Digits, ByteLevel] or [Split, ByteLevel]");
    const nlohmann::json& s0 = steps[0];
    if (first == "Digits") {  // SmolLM's / StarCoder's
      if (!s0.contains("individual_digits") || !s0["individual_digits"].is_boolean())
        refuse("pre_tokenizer.pretokenizers[0].individual_digits",
               s0.value("individual_digits", nlohmann::json()), "must be true or false");
      digits = s0["individual_digits"].get<bool>() ? Digits::kIndividual : Digits::kContiguous;
    } else {  // Llama 3's: a regex whose matches and the text between them are the pieces
      const nlohmann::json pat = s0.value("pattern", nlohmann::json());
      if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
        refuse("pre_tokenizer.pretokenizers[0].pattern", pat, "only {\"Regex\": ...}");
      if (s0.value("behavior", "") != "Isolated")
        refuse("pre_tokenizer.pretokenizers[0].behavior", s0.value("behavior", nlohmann::json()),
               "only Isolated");
      if (s0.value("invert", false))
        refuse("pre_tokenizer.pretokenizers[0].invert", s0["invert"], "only false");
      split = pat["Regex"].get<std::string>();
    }
    pre = steps[1];
  }
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel")
    refuse("pre_tokenizer", pre, "only ByteLevel, or Digits or Split then ByteLevel");
  if (pre.value("add_prefix_space", false))
    refuse("pre_tokenizer.add_prefix_space", pre["add_prefix_space"], "GPT-2 adds no space");
  const bool byte_regex = pre.value("use_regex", true);
  if (!byte_regex && digits != Digits::kNone)
    refuse("pre_tokenizer.use_regex", pre["use_regex"], "after Digits, GPT-2's pattern splits");
  if (j.contains("decoder") && !j["decoder"].is_null() &&
      !(j["decoder"].is_object() && j["decoder"].value("type", "") == "ByteLevel"))
    refuse("decoder", j["decoder"], "only ByteLevel or none");
  // The post-processor adds special tokens around a whole input (Llama 3's TemplateProcessing:
  // <|begin_of_text|> first); encode() is `tokenizers`' encode(text, add_special_tokens=False),
  // the ids of the text alone, so a ByteLevel or template post-processor does not change them.
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    const nlohmann::json& pp = j["post_processor"];
    auto plain = [](const nlohmann::json& p) {
      const std::string t = p.is_object() ? p.value("type", "") : "";
      return t == "ByteLevel" || t == "TemplateProcessing";
    };
    bool ok = plain(pp);
    if (pp.is_object() && pp.value("type", "") == "Sequence" && pp.contains("processors") &&
        pp["processors"].is_array())
      ok = std::all_of(pp["processors"].begin(), pp["processors"].end(), plain);
    if (!ok)
      refuse("post_processor", pp, "only ByteLevel, TemplateProcessing or a Sequence of them");
  }
  for (const char* part : {"truncation", "padding"}) {
    if (j.contains(part) && !j[part].is_null())
      refuse(part, j[part], "encode() returns every token of the text, unpadded");
  }
  if (!j.contains("model") || !j["model"].is_object()) bad(path, "no 'model' object");
  const nlohmann::json& m = j["model"];
  if (m.value("type", "BPE") != "BPE") refuse("model.type", m["type"], "only BPE");
  if (m.contains("dropout") && !m["dropout"].is_null())
    refuse("model.dropout", m["dropout"], "BPE dropout is for training tokenizers");
  if (m.contains("unk_token") && !m["unk_token"].is_null())
    refuse("model.unk_token", m["unk_token"], "a byte-level vocabulary has no unknown token");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && m[key] != "")
      refuse(std::string("model.") + key, m[key], "not used by byte-level BPE");
  }
  if (m.value("byte_fallback", false))
    refuse("model.byte_fallback", m["byte_fallback"], "a byte-level vocabulary needs none");

  BpeTokenizer t;
  t.ignore_merges_ = m.value("ignore_merges", false);
  t.digits_ = digits;
  t.byte_regex_ = byte_regex;
  t.nfc_ = nfc;
  if (split) {
    const std::optional<std::string> pcre = onig_to_pcre2(*split);
    if (!pcre)
      refuse("pre_tokenizer.pretokenizers[0].pattern", *split, "\\S inside a character class");
    t.regex_ = std::make_unique<Regex>(&*pcre, path + ": pre_tokenizer.pretokenizers[0].pattern");
    t.split_ = true;
    t.split_cuts_ = *split == kLlama3Pattern;
  }
  if (!m.contains("vocab")) bad(path, "no 'model.vocab'");
  read_vocab(m["vocab"], path + ": model.vocab", t.vocab_);
  if (!m.contains("merges") || !m["merges"].is_array()) bad(path, "no 'model.merges' list");
  const nlohmann::json& merges = m["merges"];
  std::vector<std::array<int32_t, 3>> triples;
  triples.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& e = merges[i];
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
          s.find(' ', sp + 1) != std::string::npos)
        bad(path, where + " " + e.dump() + " is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      bad(path, where + " " + e.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto id = [&](const std::string& tok) {
      auto it = t.vocab_.find(tok);
      if (it == t.vocab_.end())
        bad(path, where + ": token " + nlohmann::json(tok).dump() + " is not in model.vocab");
      return it->second;
    };
    triples.push_back({id(a), id(b), id(a + b)});
  }
  if (j.contains("added_tokens")) {
    const nlohmann::json& added = j["added_tokens"];
    if (!added.is_array()) bad(path, "'added_tokens' is not a list");
    for (size_t i = 0; i < added.size(); ++i) {
      const nlohmann::json& a = added[i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > kMaxId || !a.contains("content") ||
          !a["content"].is_string() || a["content"].get<std::string>().empty())
        bad(path, where + " needs an integer 'id' in [0, " + std::to_string(kMaxId) +
                      "] and a non-empty 'content'");
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(flag, false))
          refuse(where + "." + flag, a[flag], "added tokens match their content exactly");
      }
      // `tokenizers` defaults: special tokens are matched before normalization, others after.
      const bool special = a.value("special", false);
      // (matched in the text before NFC: only tokens that are matched there are supported)
      if (nfc && a.value("normalized", !special))
        refuse(where + ".normalized", a.value("normalized", !special),
               "with an NFC normalizer, added tokens must be matched before normalization");
      t.added_.push_back({a["content"].get<std::string>(), a["id"].get<int32_t>(),
                          a.value("normalized", !special)});
    }
  }
  t.finish(path, triples);
  return t;
}

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_json,
                                      const std::string& merges_txt) {
  BpeTokenizer t;
  read_vocab(read_json_file(vocab_json), vocab_json, t.vocab_);
  std::ifstream f(merges_txt, std::ios::binary);
  if (!f) fail(ErrorKind::kIo, "cannot read " + merges_txt);
  std::vector<std::array<int32_t, 3>> triples;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      bad(merges_txt,
          "line " + std::to_string(line_no) + " is not two tokens separated by a space");
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    auto id = [&](const std::string& tok) {
      auto it = t.vocab_.find(tok);
      if (it == t.vocab_.end())
        bad(merges_txt, "line " + std::to_string(line_no) + ": token " +
                            nlohmann::json(tok).dump() + " is not in " + vocab_json);
      return it->second;
    };
    triples.push_back({id(a), id(b), id(a + b)});
  }
  if (f.bad()) fail(ErrorKind::kIo, "cannot read " + merges_txt);
  auto eot = t.vocab_.find("<|endoftext|>");
  if (eot != t.vocab_.end()) t.added_.push_back({eot->first, eot->second, false});
  t.finish(vocab_json, triples);
  return t;
}

void BpeTokenizer::finish(const std::string& source,
                          const std::vector<std::array<int32_t, 3>>& merges) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) max_id = std::max(max_id, id);
  for (const AddedToken& a : added_) max_id = std::max(max_id, a.id);
  if (max_id < 0) bad(source, "the vocabulary is empty");
  std::vector<std::string> token(static_cast<size_t>(max_id) + 1);  // as stored
  std::vector<bool> in_vocab(token.size(), false);
  for (const auto& [tok, id] : vocab_) {
    if (in_vocab[id])
      bad(source, "id " + std::to_string(id) + " belongs to both " +
                      nlohmann::json(token[id]).dump() + " and " + nlohmann::json(tok).dump());
    in_vocab[id] = true;
    token[id] = tok;
  }
  for (const AddedToken& a : added_) {
    if (in_vocab[a.id] && token[a.id] != a.content)
      bad(source, "added token " + nlohmann::json(a.content).dump() + " has id " +
                      std::to_string(a.id) + ", which the vocabulary gives " +
                      nlohmann::json(token[a.id]).dump());
  }

  // What decode() gives for each id: an added token's content; a vocabulary token's characters
  // mapped back to the bytes they stand for (a character that stands for none, which GPT-2's
  // files do not have, as it is).
  const std::array<int32_t, 256>& cp = byte_to_unicode();
  std::array<int16_t, 512> unicode_byte;
  unicode_byte.fill(-1);
  for (int b = 0; b < 256; ++b) unicode_byte[cp[b]] = static_cast<int16_t>(b);
  id_bytes_.assign(token.size(), std::string());
  known_.assign(token.size(), false);
  for (size_t id = 0; id < token.size(); ++id) {
    if (!in_vocab[id]) continue;
    known_[id] = true;
    const std::string& tok = token[id];
    for (size_t i = 0; i < tok.size();) {
      const size_t at = i;
      const int32_t c = next_code_point(tok, i);
      if (c >= 0 && c < 512 && unicode_byte[c] >= 0)
        id_bytes_[id].push_back(static_cast<char>(unicode_byte[c]));
      else
        id_bytes_[id].append(tok, at, i - at);
    }
  }
  for (const AddedToken& a : added_) {
    known_[a.id] = true;
    id_bytes_[a.id] = a.content;
  }

  // The merge table: a repeated pair keeps its last rank, as in `tokenizers` (a map built in
  // order, later entries replacing earlier ones).
  size_t size = 16;
  while (size < merges.size() * 2) size *= 2;
  merge_table_.assign(size, MergeSlot{kNoMerge, 0, 0});
  merge_shift_ = 64 - std::countr_zero(size);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b, id] = merges[rank];
    const uint64_t key = uint64_t{static_cast<uint32_t>(a)} << 32 | static_cast<uint32_t>(b);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    while (merge_table_[i].key != kNoMerge && merge_table_[i].key != key) i = (i + 1) & (size - 1);
    merge_table_[i] = MergeSlot{key, static_cast<int32_t>(rank), id};
  }

  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, cp[b]);
    auto it = vocab_.find(s);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : added_)
    if (a.content == token) return a.id;
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

// ---- encoding -----------------------------------------------------------------------------------

namespace {

// Appends to `out` the stretches of `text` and the occurrences of `tokens` (content, id), found
// leftmost-longest as `tokenizers` (Aho-Corasick, LeftmostLongest) finds them.
void split_by(std::string_view text,
              const std::vector<std::pair<std::string_view, int32_t>>& tokens,
              std::vector<std::pair<std::string_view, int32_t>>& out) {
  if (tokens.empty()) {
    if (!text.empty()) out.emplace_back(text, -1);
    return;
  }
  // next[k]: where tokens[k] next occurs at or after the last search (npos: nowhere); it stays
  // valid while it is not behind the current position.
  std::vector<size_t> next(tokens.size());
  for (size_t k = 0; k < tokens.size(); ++k) next[k] = text.find(tokens[k].first);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string_view::npos, best_len = 0;
    int32_t best_id = -1;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos)
        next[k] = text.find(tokens[k].first, pos);
      const size_t at = next[k];
      if (at == std::string_view::npos) continue;
      if (at < best || (at == best && tokens[k].first.size() > best_len)) {
        best = at;
        best_len = tokens[k].first.size();
        best_id = tokens[k].second;
      }
    }
    if (best == std::string_view::npos) break;
    if (best > pos) out.emplace_back(text.substr(pos, best - pos), -1);
    out.emplace_back(text.substr(best, best_len), best_id);
    pos = best + best_len;
  }
  if (pos < text.size()) out.emplace_back(text.substr(pos), -1);
}

}  // namespace

std::vector<BpeTokenizer::Segment> BpeTokenizer::split_added(std::string_view text) const {
  std::vector<std::pair<std::string_view, int32_t>> first, second;
  for (const AddedToken& a : added_) (a.normalized ? second : first).emplace_back(a.content, a.id);
  std::vector<std::pair<std::string_view, int32_t>> pass1, pass2;
  split_by(text, first, pass1);
  for (const auto& [s, id] : pass1) {
    if (id >= 0)
      pass2.emplace_back(s, id);
    else
      split_by(s, second, pass2);
  }
  std::vector<Segment> out;
  out.reserve(pass2.size());
  for (const auto& [s, id] : pass2) out.push_back({s, id});
  return out;
}

const BpeTokenizer::MergeSlot* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = uint64_t{static_cast<uint32_t>(left)} << 32 | static_cast<uint32_t>(right);
  const size_t mask = merge_table_.size() - 1;
  for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;; i = (i + 1) & mask) {
    const MergeSlot& s = merge_table_[i];
    if (s.key == key) return &s;
    if (s.key == kNoMerge) return nullptr;
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out,
                                State& state) const {
  if (ignore_merges_) {
    std::string whole;
    for (char c : piece) append_utf8(whole, byte_to_unicode()[static_cast<unsigned char>(c)]);
    auto it = vocab_.find(whole);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols start as the bytes' stand-ins; a byte without one (not in the vocabulary) is dropped,
  // as `tokenizers` drops a character it has no id for when there is no unknown token.
  std::vector<int32_t>& sym = state.sym;
  sym.clear();
  for (char c : piece) {
    const int32_t id = byte_id_[static_cast<unsigned char>(c)];
    if (id >= 0) sym.push_back(id);
  }
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  if (sym.size() <= kMaxRescanSymbols) {
    // Short pieces (nearly all): the rank of every adjacent pair, kept up to date; merge the
    // lowest (leftmost among equals) until none is left.
    std::vector<int32_t>& ranks = state.ranks;
    std::vector<int32_t>& merged = state.merged;
    const size_t n = sym.size();
    if (n < 2) {
      out.insert(out.end(), sym.begin(), sym.end());
      return;
    }
    ranks.resize(n - 1);
    merged.resize(n - 1);
    auto set_pair = [&](size_t i) {
      const MergeSlot* m = find_merge(sym[i], sym[i + 1]);
      ranks[i] = m != nullptr ? m->rank : kNone;
      merged[i] = m != nullptr ? m->id : -1;
    };
    for (size_t i = 0; i + 1 < n; ++i) set_pair(i);
    size_t len = n;
    while (len > 1) {
      size_t at = 0;
      for (size_t i = 1; i + 1 < len; ++i)
        if (ranks[i] < ranks[at]) at = i;
      if (ranks[at] == kNone) break;
      sym[at] = merged[at];
      std::copy(sym.begin() + at + 2, sym.begin() + len, sym.begin() + at + 1);
      std::copy(ranks.begin() + at + 1, ranks.begin() + len - 1, ranks.begin() + at);
      std::copy(merged.begin() + at + 1, merged.begin() + len - 1, merged.begin() + at);
      --len;
      if (at > 0) set_pair(at - 1);
      if (at + 1 < len) set_pair(at);
    }
    out.insert(out.end(), sym.begin(), sym.begin() + len);
    return;
  }
  // Long pieces (runs of spaces or digits): the same order -- lowest rank, then leftmost -- from a
  // heap of candidate pairs over a linked list, O(n log n). A popped pair is stale when either
  // symbol has changed since it was pushed.
  const int n = static_cast<int>(sym.size());
  std::vector<int> next(n), prev(n);
  for (int i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] >= n) return;
    if (const MergeSlot* m = find_merge(sym[i], sym[next[i]]))
      heap.push({m->rank, i, sym[i], sym[next[i]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> dead(n, false);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (dead[c.pos] || next[c.pos] >= n || sym[c.pos] != c.left || sym[next[c.pos]] != c.right)
      continue;
    const int j = next[c.pos];
    sym[c.pos] = find_merge(c.left, c.right)->id;
    dead[j] = true;
    next[c.pos] = next[j];
    if (next[j] < n) prev[next[j]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i < n; i = next[i]) out.push_back(sym[i]);
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out,
                               State& state) const {
  if (nfc_ && nfc_may_change(text)) {  // the normalizer, then the rest on its output
    std::string normalized;
    append_nfc(text, normalized);
    encode_normalized(normalized, out, state);
    return;
  }
  encode_normalized(text, out, state);
}

void BpeTokenizer::encode_normalized(std::string_view text, std::vector<int32_t>& out,
                                     State& state) const {
  // ByteLevel's own step: GPT-2's pattern, or (use_regex false) the part as one piece
  auto byte_level = [&](std::string_view part) {
    if (byte_regex_)
      encode_pieces(part, out, state);
    else if (!part.empty())
      encode_cached(part, out, state);
  };
  if (split_) {
    // tokenizers' Split, behavior Isolated: every match, and the text between matches, is a part
    size_t pos = 0;
    while (pos < text.size()) {
      const int rc = regex_->match_split(text, pos, state.md_split);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      CT_CHECK(rc >= 0, "the Split pattern failed");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.md_split);
      if (ov[1] == ov[0]) {  // an empty match: no part; go on after the next character
        size_t next = std::max<size_t>(ov[0], pos);
        next_code_point(text, next);
        if (next > pos) byte_level(text.substr(pos, next - pos));
        pos = next;
        continue;
      }
      if (ov[0] > pos) byte_level(text.substr(pos, ov[0] - pos));
      byte_level(text.substr(ov[0], ov[1] - ov[0]));
      pos = ov[1];
    }
    if (pos < text.size()) byte_level(text.substr(pos));
    return;
  }
  if (digits_ == Digits::kNone) {
    byte_level(text);
    return;
  }
  // tokenizers' Digits step: the text between runs of number characters, and the runs (whole,
  // or one character each), go through the ByteLevel step separately.
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = regex_->match_number(text, pos, state.md_number);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    CT_CHECK(rc > 0, "the number pattern failed");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.md_number);
    if (ov[0] > pos) encode_pieces(text.substr(pos, ov[0] - pos), out, state);
    if (digits_ == Digits::kContiguous) {
      encode_pieces(text.substr(ov[0], ov[1] - ov[0]), out, state);
    } else {
      for (size_t i = ov[0]; i < ov[1];) {
        size_t next = i;
        next_code_point(text, next);  // valid UTF-8: the pattern matched it
        encode_pieces(text.substr(i, next - i), out, state);
        i = next;
      }
    }
    pos = ov[1];
  }
  if (pos < text.size()) encode_pieces(text.substr(pos), out, state);
}

void BpeTokenizer::encode_cached(std::string_view p, std::vector<int32_t>& out,
                                 State& state) const {
  if (p.size() == 1) {  // one byte: its stand-in, nothing to merge
    const int32_t id = byte_id_[static_cast<unsigned char>(p[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (p.size() > kMaxCachedPiece) {
    encode_piece(p, out, state);
    return;
  }
  const uint64_t h = hash_piece(p.data(), p.size());
  if (state.cache.append(p, h, out)) return;
  state.ids.clear();
  encode_piece(p, state.ids, state);
  state.cache.insert(p, h, state.ids.data(), state.ids.size());
  out.insert(out.end(), state.ids.begin(), state.ids.end());
}

void BpeTokenizer::encode_pieces(std::string_view text, std::vector<int32_t>& out,
                                 State& state) const {
  auto piece = [&](size_t from, size_t to) {
    encode_cached(text.substr(from, to - from), out, state);
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = ascii_piece_end(text, pos);
    if (end == 0) {
      const int rc = regex_->match(text, pos, state.md);
      if (rc == PCRE2_ERROR_NOMATCH) {  // only invalid UTF-8 is left
        piece(pos, text.size());
        break;
      }
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail(ErrorKind::kInternal, "GPT-2's pattern failed at byte " + std::to_string(pos) + ": " +
                                       reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.md);
      if (ov[0] > pos) piece(pos, ov[0]);  // bytes no alternative takes: invalid UTF-8
      CT_CHECK(ov[1] > ov[0], "GPT-2's pattern matched nothing");
      pos = ov[0];
      end = ov[1];
    }
    piece(pos, end);
    pos = end;
  }
}

size_t BpeTokenizer::expected_ids(std::string_view text, State& state) const {
  // A long text's ids are reserved at once: growing by doubling would copy (and page in) the
  // ids, up to a third of the time for a small vocabulary. The rate is that of its first 64 KiB.
  constexpr size_t kSample = size_t{1} << 16;
  if (text.size() < 16 * kSample) return text.size() / 3 + 16;
  std::vector<int32_t> ids;
  for (const Segment& s : split_added(text.substr(0, kSample))) {
    if (s.added_id >= 0)
      ids.push_back(s.added_id);
    else
      encode_text(s.text, ids, state);
  }
  const double rate = static_cast<double>(ids.size()) / kSample;
  return std::min(text.size(), static_cast<size_t>(static_cast<double>(text.size()) * rate * 1.1)) +
         16;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  State state(*regex_);
  std::vector<int32_t> out;
  out.reserve(expected_ids(text, state));
  for (const Segment& s : split_added(text)) {
    if (s.added_id >= 0)
      out.push_back(s.added_id);
    else
      encode_text(s.text, out, state);
  }
  return out;
}

bool BpeTokenizer::non_space_before(std::string_view text, size_t i) const {
  if (i == 0) return false;
  size_t start = i - 1;
  while (start > 0 && i - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
    --start;
  size_t end = start;
  const int32_t cp = next_code_point(text, end);
  if (cp < 0 || end != i) return false;
  if (cp < 0x80) return kAsciiClass[cp] != kSpace;
  return !regex_->is_space(text.substr(start, i - start));
}

bool BpeTokenizer::non_space_at(std::string_view text, size_t i) const {
  if (i >= text.size()) return false;
  size_t end = i;
  const int32_t cp = next_code_point(text, end);
  if (cp < 0) return false;
  if (cp < 0x80) return kAsciiClass[cp] != kSpace;
  return !regex_->is_space(text.substr(i, end - i));
}

std::vector<int32_t> BpeTokenizer::encode_parallel(
    std::string_view text, int threads, const std::function<void(size_t)>& progress) const {
  threads = std::max(threads, 1);
  if (!progress && (threads == 1 || text.size() < (size_t{1} << 16))) return encode(text);
  // Chunks of about `target` bytes, encoded independently and concatenated in order. A stretch
  // between added tokens is cut only where every piece stays the same:
  //  - before a ' ' that follows a character c that is not whitespace: no alternative takes a
  //    space after a non-space character, so a piece ends at c; both before and after the cut the
  //    pattern restarts at the ' ' with the same text ahead; and the pieces that end at c end
  //    there whatever follows c (a space is none of the runs c could be in);
  //  - after a '\n' between two such characters: the '\n' is a piece of its own either way
  //    (\s+(?!\S) when it ends the chunk, \s+ when the non-space follows), and the pattern restarts
  //    at the next character.
  // Nothing looks behind, and chunks are cut at ASCII bytes, so never inside a character.
  // With Llama 3's Split pattern (the pieces: contractions, an optional non-letter then letters,
  // 1-3 digits, punctuation runs, whitespace runs), only before a ' ' between two ASCII letters:
  // no piece holds a letter and a following space, so one ends at the letter, and at the ' ' the
  // pattern restarts with the same text ahead (' ' then letters), before and after the cut.
  const size_t target = std::clamp<size_t>(text.size() / (static_cast<size_t>(threads) * 16),
                                           size_t{1} << 16, size_t{1} << 22);
  std::vector<Segment> parts;       // added tokens and stretches, in text order
  std::vector<size_t> chunk_begin;  // index into parts of each chunk's first part
  std::vector<size_t> chunk_bytes;  // input bytes of each chunk
  size_t in_chunk = target;         // bytes in the current chunk (start a new one at once)
  auto add = [&](Segment s) {
    if (in_chunk >= target) {
      chunk_begin.push_back(parts.size());
      chunk_bytes.push_back(0);
      in_chunk = 0;
    }
    parts.push_back(s);
    in_chunk += s.text.size();
    chunk_bytes.back() += s.text.size();
  };
  for (const Segment& s : split_added(text)) {
    if (s.added_id >= 0) {
      add(s);
      continue;
    }
    std::string_view rest = s.text;
    for (;;) {
      const size_t room = in_chunk >= target ? target : target - in_chunk;
      if (rest.size() <= room + target / 4) break;  // fits (a little over is fine)
      size_t cut = std::string_view::npos;          // the first safe cut once the chunk is full
      for (size_t i = std::max<size_t>(room, 1); i < rest.size(); ++i) {
        if (split_) {  // Llama 3's pattern: see above; any other Split pattern is not cut
          if (split_cuts_ && rest[i] == ' ' && i + 1 < rest.size() && ascii_letter(rest[i - 1]) &&
              ascii_letter(rest[i + 1])) {
            cut = i;
            break;
          }
          continue;
        }
        if ((rest[i] == ' ' && non_space_before(rest, i)) ||
            (rest[i - 1] == '\n' && non_space_at(rest, i) && non_space_before(rest, i - 1))) {
          cut = i;
          break;
        }
      }
      if (cut == std::string_view::npos) break;
      add({rest.substr(0, cut), -1});
      in_chunk = target;  // the chunk is full
      rest = rest.substr(cut);
    }
    if (!rest.empty()) add({rest, -1});
  }
  chunk_begin.push_back(parts.size());
  const size_t n_chunks = chunk_bytes.size();

  double rate;  // ids per byte, to reserve each chunk's ids
  {
    State probe(*regex_);
    rate = static_cast<double>(expected_ids(text, probe)) / static_cast<double>(text.size() + 1);
  }
  std::vector<std::vector<int32_t>> ids(n_chunks);
  std::atomic<size_t> next_chunk{0};
  std::mutex progress_mu;
  size_t bytes_done = 0;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto work = [&](size_t t) {
    try {
      State state(*regex_);
      for (size_t c; (c = next_chunk.fetch_add(1)) < n_chunks;) {
        ids[c].reserve(static_cast<size_t>(static_cast<double>(chunk_bytes[c]) * rate) + 16);
        for (size_t i = chunk_begin[c]; i < chunk_begin[c + 1]; ++i) {
          if (parts[i].added_id >= 0)
            ids[c].push_back(parts[i].added_id);
          else
            encode_text(parts[i].text, ids[c], state);
        }
        if (progress) {
          std::lock_guard<std::mutex> lock(progress_mu);
          bytes_done += chunk_bytes[c];
          progress(bytes_done);
        }
      }
    } catch (...) {
      errors[t] = std::current_exception();
      next_chunk.store(n_chunks);  // the others stop after their chunk
    }
  };
  const size_t n_threads = std::min(static_cast<size_t>(threads), std::max<size_t>(n_chunks, 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  size_t total = 0;
  for (const auto& p : ids) total += p.size();
  std::vector<int32_t> out;
  out.reserve(total);
  for (auto& p : ids) {
    out.insert(out.end(), p.begin(), p.end());
    std::vector<int32_t>().swap(p);
  }
  return out;
}

// ---- decoding -----------------------------------------------------------------------------------

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && static_cast<size_t>(id) < known_.size() && known_[id])
      out += id_bytes_[id];
    else
      out += "\xEF\xBF\xBD";  // U+FFFD
  }
  return out;
}

}  // namespace ct
