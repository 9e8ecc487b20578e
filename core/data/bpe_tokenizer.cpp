#include "core/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>

#include "core/error.h"
#include "core/io/json_file.h"
#include "core/io/read_file.h"

namespace ct {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

// The code point at s[i] (advancing i), or -1 for a byte that does not start a valid sequence.
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
  i += n + 1;
  return cp;
}

bool is_ascii_graph(char c) {
  return c > 0x20 && c < 0x7F;
}

}  // namespace

// ---- the pattern ----------------------------------------------------------------------------

class BpeTokenizer::Regex {
 public:
  Regex() {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(ErrorKind::kInternal,
           std::string("GPT-2 pattern does not compile: ") + reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
  }
  ~Regex() { pcre2_code_free(code_); }
  pcre2_code* code() const { return code_; }

 private:
  pcre2_code* code_ = nullptr;
};

namespace {
struct MatchData {
  explicit MatchData(const pcre2_code* code)
      : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
  pcre2_match_data* md;
};
}  // namespace

// ---- loading --------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer() : regex_(new Regex) {}
BpeTokenizer::~BpeTokenizer() {
  delete regex_;
}
BpeTokenizer::BpeTokenizer(BpeTokenizer&& o) noexcept
    : vocab_(std::move(o.vocab_)),
      id_to_token_(std::move(o.id_to_token_)),
      is_added_(std::move(o.is_added_)),
      added_(std::move(o.added_)),
      merges_(std::move(o.merges_)),
      byte_id_(o.byte_id_),
      unicode_byte_(o.unicode_byte_),
      ignore_merges_(o.ignore_merges_),
      regex_(o.regex_) {
  o.regex_ = nullptr;
}
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&& o) noexcept {
  if (this != &o) {
    delete regex_;
    vocab_ = std::move(o.vocab_);
    id_to_token_ = std::move(o.id_to_token_);
    is_added_ = std::move(o.is_added_);
    added_ = std::move(o.added_);
    merges_ = std::move(o.merges_);
    byte_id_ = o.byte_id_;
    unicode_byte_ = o.unicode_byte_;
    ignore_merges_ = o.ignore_merges_;
    regex_ = o.regex_;
    o.regex_ = nullptr;
  }
  return *this;
}

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
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad(where, "token " + nlohmann::json(token).dump() + " has id " + id.dump() +
                     ", not a non-negative 32-bit integer");
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
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    refuse("normalizer", j["normalizer"], "GPT-2's tokenizer has no normalizer");
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  if (!pre.is_object() || pre.value("type", "") != "ByteLevel")
    refuse("pre_tokenizer", pre, "only the ByteLevel pre-tokenizer");
  if (pre.value("add_prefix_space", false))
    refuse("pre_tokenizer.add_prefix_space", pre["add_prefix_space"], "GPT-2 adds no space");
  if (!pre.value("use_regex", true))
    refuse("pre_tokenizer.use_regex", pre["use_regex"], "GPT-2 splits with its pattern");
  for (const char* part : {"decoder", "post_processor"}) {
    if (j.contains(part) && !j[part].is_null() &&
        !(j[part].is_object() && j[part].value("type", "") == "ByteLevel"))
      refuse(part, j[part], "only ByteLevel or none");
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
  if (!m.contains("vocab")) bad(path, "no 'model.vocab'");
  read_vocab(m["vocab"], path + ": model.vocab", t.vocab_);
  if (!m.contains("merges") || !m["merges"].is_array()) bad(path, "no 'model.merges' list");
  const nlohmann::json& merges = m["merges"];
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& e = merges[i];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
          s.find(' ', sp + 1) != std::string::npos)
        bad(path, "model.merges[" + std::to_string(i) + "] " + e.dump() +
                      " is not two tokens separated by one space");
      pairs.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      pairs.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      bad(path, "model.merges[" + std::to_string(i) + "] " + e.dump() +
                    " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    auto id = [&](const std::string& tok) {
      auto it = t.vocab_.find(tok);
      if (it == t.vocab_.end())
        bad(path, "model.merges[" + std::to_string(i) + "]: token " + nlohmann::json(tok).dump() +
                      " is not in model.vocab");
      return it->second;
    };
    const int32_t a = id(pairs[i].first), b = id(pairs[i].second);
    const int32_t merged = id(pairs[i].first + pairs[i].second);
    t.merges_.emplace(static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b),
                      Merge{static_cast<int32_t>(i), merged});
  }
  if (j.contains("added_tokens")) {
    const nlohmann::json& added = j["added_tokens"];
    if (!added.is_array()) bad(path, "'added_tokens' is not a list");
    for (size_t i = 0; i < added.size(); ++i) {
      const nlohmann::json& a = added[i];
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          a["id"].get<int64_t>() < 0 || !a.contains("content") || !a["content"].is_string() ||
          a["content"].get<std::string>().empty())
        bad(path, where + " needs a non-negative integer 'id' and a non-empty 'content'");
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(flag, false))
          refuse(where + "." + flag, a[flag], "added tokens match their content exactly");
      }
      t.added_.emplace_back(a["content"].get<std::string>(), a["id"].get<int32_t>());
    }
  }
  t.finish(path);
  return t;
}

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_json,
                                      const std::string& merges_txt) {
  BpeTokenizer t;
  read_vocab(read_json_file(vocab_json), vocab_json, t.vocab_);
  std::ifstream f(merges_txt, std::ios::binary);
  if (!f) fail(ErrorKind::kIo, "cannot read " + merges_txt);
  std::string line;
  int64_t line_no = 0, rank = 0;
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
    const int32_t ia = id(a), ib = id(b), merged = id(a + b);
    t.merges_.emplace(static_cast<uint64_t>(ia) << 32 | static_cast<uint32_t>(ib),
                      Merge{static_cast<int32_t>(rank++), merged});
  }
  auto eot = t.vocab_.find("<|endoftext|>");
  if (eot != t.vocab_.end()) t.added_.emplace_back(eot->first, eot->second);
  t.finish(vocab_json);
  return t;
}

void BpeTokenizer::finish(const std::string& source) {
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) max_id = std::max(max_id, id);
  for (const auto& [content, id] : added_) max_id = std::max(max_id, id);
  if (max_id < 0) bad(source, "the vocabulary is empty");
  id_to_token_.assign(static_cast<size_t>(max_id) + 1, std::string());
  is_added_.assign(id_to_token_.size(), false);
  for (const auto& [tok, id] : vocab_) {
    if (!id_to_token_[id].empty())
      bad(source, "id " + std::to_string(id) + " belongs to both " +
                      nlohmann::json(id_to_token_[id]).dump() + " and " +
                      nlohmann::json(tok).dump());
    id_to_token_[id] = tok;
  }
  for (const auto& [content, id] : added_) {
    if (!id_to_token_[id].empty() && id_to_token_[id] != content)
      bad(source, "added token " + nlohmann::json(content).dump() + " has id " +
                      std::to_string(id) + ", which the vocabulary gives " +
                      nlohmann::json(id_to_token_[id]).dump());
    id_to_token_[id] = content;
    is_added_[id] = true;
  }
  const std::array<int32_t, 256> cp = byte_to_unicode();
  unicode_byte_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    unicode_byte_[cp[b]] = static_cast<int16_t>(b);
    std::string s;
    append_utf8(s, cp[b]);
    auto it = vocab_.find(s);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  for (const auto& [content, id] : added_)
    if (content == token) return id;
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

// ---- encoding -------------------------------------------------------------------------------

std::vector<BpeTokenizer::Segment> BpeTokenizer::split_added(std::string_view text) const {
  std::vector<Segment> out;
  if (added_.empty()) {
    out.push_back({text, -1});
    return out;
  }
  // Next occurrence of each added token at or after `from` (npos: none left).
  std::vector<size_t> next(added_.size(), 0);
  std::vector<bool> fresh(added_.size(), false);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string_view::npos;
    size_t best_len = 0;
    int32_t best_id = -1;
    for (size_t k = 0; k < added_.size(); ++k) {
      if (!fresh[k] || (next[k] != std::string_view::npos && next[k] < pos)) {
        next[k] = text.find(added_[k].first, pos);
        fresh[k] = true;
      }
      const size_t at = next[k];
      if (at == std::string_view::npos) continue;
      // leftmost, then longest
      if (at < best || (at == best && added_[k].first.size() > best_len)) {
        best = at;
        best_len = added_[k].first.size();
        best_id = added_[k].second;
      }
    }
    if (best == std::string_view::npos) break;
    if (best > pos) out.push_back({text.substr(pos, best - pos), -1});
    out.push_back({text.substr(best, best_len), best_id});
    pos = best + best_len;
  }
  if (pos < text.size()) out.push_back({text.substr(pos), -1});
  return out;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
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
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_id_[static_cast<unsigned char>(c)];
    if (id >= 0) sym.push_back(id);
  }
  if (sym.size() <= 24) {
    // Short pieces (nearly all): rescan for the lowest-ranked pair after every merge.
    while (sym.size() > 1) {
      int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
      size_t best_at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const Merge* m = find_merge(sym[i], sym[i + 1]);
        if (m != nullptr && m->rank < best_rank) {
          best_rank = m->rank;
          best_id = m->id;
          best_at = i;
        }
      }
      if (best_id < 0) break;
      sym[best_at] = best_id;
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
    }
    out.insert(out.end(), sym.begin(), sym.end());
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
    if (const Merge* m = find_merge(sym[i], sym[next[i]]))
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

const BpeTokenizer::Merge* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(static_cast<uint64_t>(left) << 32 | static_cast<uint32_t>(right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out, void* match_data,
                               std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  auto* md = static_cast<pcre2_match_data*>(match_data);
  auto piece = [&](std::string_view p) {
    if (p.size() > 64) {  // long pieces (whitespace runs) are rare: not worth caching
      encode_piece(p, out);
      return;
    }
    auto it = cache.find(std::string(p));
    if (it == cache.end()) {
      std::vector<int32_t> ids;
      encode_piece(p, ids);
      it = cache.emplace(std::string(p), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  };
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(regex_->code(), subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) {  // no match in the rest: only invalid UTF-8 can be left
      piece(text.substr(pos));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > pos) piece(text.substr(pos, ov[0] - pos));  // skipped invalid bytes
    if (ov[1] == ov[0]) {  // the pattern cannot match empty; guard against a stall anyway
      piece(text.substr(ov[0], 1));
      pos = ov[0] + 1;
      continue;
    }
    piece(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  MatchData md(regex_->code());
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  for (const Segment& s : split_added(text)) {
    if (s.added_id >= 0)
      out.push_back(s.added_id);
    else
      encode_text(s.text, out, md.md, cache);
  }
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_parallel(
    std::string_view text, int threads, const std::function<void(size_t)>& progress) const {
  if (!progress && (threads <= 1 || text.size() < (1u << 16))) return encode(text);
  threads = std::max(threads, 1);
  // Work items: added tokens, and stretches of text cut at safe points into ~equal parts. A cut
  // right after a '\n' with a printable ASCII character on each side changes no piece: the
  // pattern matches that '\n' alone either way (no alternative takes a '\n' together with a
  // non-space, and the lookahead (?!\S) cannot see past it into a run of spaces), and nothing
  // looks behind.
  std::vector<Segment> items;
  const size_t target = std::max<size_t>(text.size() / (static_cast<size_t>(threads) * 8), 1 << 14);
  for (const Segment& s : split_added(text)) {
    if (s.added_id >= 0 || s.text.size() <= target) {
      items.push_back(s);
      continue;
    }
    size_t start = 0;
    while (s.text.size() - start > target) {
      size_t cut = std::string_view::npos;
      for (size_t i = start + target; i + 1 < s.text.size(); ++i) {
        if (s.text[i] == '\n' && is_ascii_graph(s.text[i - 1]) && is_ascii_graph(s.text[i + 1])) {
          cut = i + 1;
          break;
        }
      }
      if (cut == std::string_view::npos) break;
      items.push_back({s.text.substr(start, cut - start), -1});
      start = cut;
    }
    items.push_back({s.text.substr(start), -1});
  }
  const size_t n_threads = std::min<size_t>(static_cast<size_t>(threads), items.size());
  std::vector<std::vector<int32_t>> parts(n_threads);
  std::vector<std::exception_ptr> errors(n_threads);
  std::mutex progress_mu;
  size_t bytes_done = 0;
  auto work = [&](size_t t) {
    try {
      MatchData md(regex_->code());
      std::unordered_map<std::string, std::vector<int32_t>> cache;
      // Contiguous ranges of items, so the parts concatenate in order.
      const size_t lo = items.size() * t / n_threads, hi = items.size() * (t + 1) / n_threads;
      for (size_t i = lo; i < hi; ++i) {
        if (items[i].added_id >= 0)
          parts[t].push_back(items[i].added_id);
        else
          encode_text(items[i].text, parts[t], md.md, cache);
        if (progress) {
          std::lock_guard<std::mutex> lock(progress_mu);
          bytes_done += items[i].text.size();
          progress(bytes_done);
        }
      }
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<int32_t> out;
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  out.reserve(total);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- decoding -------------------------------------------------------------------------------

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || id_to_token_[id].empty()) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      continue;
    }
    const std::string& tok = id_to_token_[id];
    if (is_added_[id]) {
      out += tok;
      continue;
    }
    for (size_t i = 0; i < tok.size();) {
      const size_t at = i;
      const int32_t cp = next_code_point(tok, i);
      if (cp >= 0 && cp < 512 && unicode_byte_[cp] >= 0)
        out.push_back(static_cast<char>(unicode_byte_[cp]));
      else
        out.append(tok, at, i - at);  // not a stand-in: the character as it is
    }
  }
  return out;
}

}  // namespace ct
