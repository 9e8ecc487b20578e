// GPT-2 byte-level BPE against Hugging Face `tokenizers`: the ids it gave for the committed
// vocabulary (tests/data/bpe, made by scripts/make_bpe_data.py), in both file formats; the
// parallel encoder against the serial one; decoding; refusal of files it does not implement.
#include "core/data/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/io/json_file.h"
#include "tests/common/test_data_dir.h"
#include "tests/io/io_test_util.h"

namespace ct {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_bytes;

const std::string kDir = ct::test::data_dir() + "/bpe";

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    nlohmann::json j = read_json_file(kDir + "/expected.json");
    std::vector<Case> out;
    for (const auto& c : j["cases"])
      out.push_back({c["text"].get<std::string>(), c["ids"].get<std::vector<int32_t>>()});
    return out;
  }();
  return all;
}

const BpeTokenizer& tokenizer() {
  static const BpeTokenizer tok = BpeTokenizer::from_folder(kDir);
  return tok;
}

TEST(BpeTokenizer, MatchesHuggingFaceTokenizersInBothFormats) {
  const BpeTokenizer from_json = BpeTokenizer::from_tokenizer_json(kDir + "/tokenizer.json");
  const BpeTokenizer from_files =
      BpeTokenizer::from_files(kDir + "/vocab.json", kDir + "/merges.txt");
  const BpeTokenizer from_folder = BpeTokenizer::from_folder(kDir);  // tokenizer.json wins
  EXPECT_EQ(from_json.vocab_size(), 1111);
  EXPECT_EQ(from_files.vocab_size(), 1111);
  int checked = 0;
  for (const Case& c : cases()) {
    EXPECT_EQ(from_json.encode(c.text), c.ids) << "tokenizer.json, text: " << c.text;
    EXPECT_EQ(from_files.encode(c.text), c.ids) << "vocab.json + merges.txt, text: " << c.text;
    EXPECT_EQ(from_folder.encode(c.text), c.ids) << "folder, text: " << c.text;
    ++checked;
  }
  EXPECT_GE(checked, 200);
}

TEST(BpeTokenizer, FolderWithoutTokenizerJsonReadsVocabAndMerges) {
  TempDir dir;
  for (const char* f : {"vocab.json", "merges.txt"})
    std::filesystem::copy_file(kDir + "/" + f, dir.file(f));
  const BpeTokenizer tok = BpeTokenizer::from_folder(dir.path());
  for (const Case& c : cases()) EXPECT_EQ(tok.encode(c.text), c.ids) << c.text;
}

TEST(BpeTokenizer, DecodeInvertsEncode) {
  const BpeTokenizer& tok = tokenizer();
  for (const Case& c : cases()) EXPECT_EQ(tok.decode(c.ids), c.text);
  const std::vector<int32_t> outside = {-1, tok.vocab_size()};
  EXPECT_EQ(tok.decode(outside), "\xEF\xBF\xBD\xEF\xBF\xBD");
  ASSERT_TRUE(tok.token_to_id("<|endoftext|>").has_value());
  EXPECT_EQ(*tok.token_to_id("<|endoftext|>"), 0);  // the trainer puts special tokens first
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0}), "<|endoftext|>");
  EXPECT_EQ(tok.token_to_id("\xC4\xA0the"), tok.encode(" the").front());  // "Ġthe"
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
}

TEST(BpeTokenizer, MergesAsStringsReadLikeMergesAsPairs) {
  // tokenizers >= 0.20 writes merges as ["a", "b"]; older files (GPT-2's on the Hub) as "a b".
  TempDir dir;
  nlohmann::json j = read_json_file(kDir + "/tokenizer.json");
  nlohmann::json strings = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"])
    strings.push_back(m.is_string() ? m.get<std::string>()
                                    : m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = strings;
  write_bytes(dir.file("tokenizer.json"), j.dump());
  const BpeTokenizer tok = BpeTokenizer::from_folder(dir.path());
  for (const Case& c : cases()) EXPECT_EQ(tok.encode(c.text), c.ids) << c.text;
}

TEST(BpeTokenizer, RepeatedMergeTakesItsLastRank) {
  // tokenizers 0.23.3 with ["i", "n"] (rank 0) repeated at the end of the merges encodes "ine"
  // as ["i", "ne"]: the later rank replaces the earlier one. Without the repeat: ["ine"].
  TempDir dir;
  nlohmann::json j = read_json_file(kDir + "/tokenizer.json");
  ASSERT_EQ(j["model"]["merges"][0], nlohmann::json::array({"i", "n"}));
  j["model"]["merges"].push_back(nlohmann::json::array({"i", "n"}));
  write_bytes(dir.file("tokenizer.json"), j.dump());
  const BpeTokenizer tok = BpeTokenizer::from_folder(dir.path());
  const BpeTokenizer& plain = tokenizer();
  EXPECT_EQ(plain.encode("ine"), std::vector<int32_t>{*plain.token_to_id("ine")});
  EXPECT_EQ(tok.encode("ine"),
            (std::vector<int32_t>{*tok.token_to_id("i"), *tok.token_to_id("ne")}));
}

// A text of about `bytes` bytes: the expected cases in a seeded random order, with stretches
// that a careless cut would change -- whitespace runs, blank lines with spaces, added tokens
// beside newlines and spaces, Unicode spaces before ' ' and '\n', lines of CJK only (cuts between
// non-ASCII characters), invalid UTF-8 -- all through it, so that chunk edges land among them.
std::string hostile_text(size_t bytes, uint32_t seed) {
  const std::vector<std::string> hostile = {
      std::string(3000, ' '),
      "\n\n   \n",
      " \n \n\t\n",
      "x\n<|endoftext|>\ny",
      "<|endoftext|> <|endoftext|>\n<|endoftext|>",
      "\u3000 \u3000\n\u3000x \u00a0 y\u00a0\nz",
      "\u180e \u180e\n\u180ex",
      "\u65e5\u672c\u8a9e\u306e\n\u6587\u7ae0\u3067\u3059\n\u3002\n",
      "\u00e9 \u00e9\n\u00e9",
      "ab\xC3 cd\xE2\x82\nef\xFF\n\xFE gh",
      std::string(500, '\n') + "t",
      "'s\n'll 're\n's",
      "a \n b \n\n c",
  };
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    if (rng() % 3 == 0) {
      text += hostile[rng() % hostile.size()];
    } else {
      text += cases()[rng() % cases().size()].text;
      text += " \n\t"[rng() % 3];
    }
  }
  return text;
}

// tests/data/bpe's tokenizer behind a Digits pre-tokenizer (SmolLM's and StarCoder's shape),
// against tokenizers' ids (scripts/make_bpe_digits_data.py); and encode_parallel = encode.
TEST(BpeTokenizer, DigitsThenByteLevelMatchesHuggingFaceTokenizers) {
  const nlohmann::json g = read_json_file(kDir + "/digits_expected.json");
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ct_bpe_digits_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (bool individual : {true, false}) {
    nlohmann::json j = read_json_file(kDir + "/tokenizer.json");
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", individual}}, j["pre_tokenizer"]}}};
    const std::string path = (dir / "tokenizer.json").string();
    write_json_file(path, j);
    const BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(path);
    const char* key = individual ? "individual" : "contiguous";
    int checked = 0;
    for (const auto& c : g["cases"]) {
      const std::string text = c["text"].get<std::string>();
      EXPECT_EQ(tok.encode(text), c[key].get<std::vector<int32_t>>()) << key << ": " << text;
      ++checked;
    }
    EXPECT_GE(checked, 100);
    const std::string big = hostile_text(size_t{3} << 19, 3);
    const std::vector<int32_t> serial = tok.encode(big);
    for (int threads : {2, 3}) EXPECT_EQ(tok.encode_parallel(big, threads), serial) << key;
    // Without number characters: the plain tokenizer's ids.
    EXPECT_EQ(tok.encode("no numbers here, just words."),
              tokenizer().encode("no numbers here, just words."));
  }
  fs::remove_all(dir);
}

// tests/data/bpe's tokenizer.json with a shape's changes (split_expected.json's "changes":
// pre_tokenizer, post_processor, normalizer, model.ignore_merges) written to `path`; then
// checked id for id on the shape's cases and, on any number of threads, on 1.5 MiB.
nlohmann::json reshaped_tokenizer(const nlohmann::json& shape, const std::string& path) {
  nlohmann::json j = read_json_file(kDir + "/tokenizer.json");
  for (const char* k : {"pre_tokenizer", "post_processor", "normalizer"})
    if (shape["changes"].contains(k)) j[k] = shape["changes"][k];
  j["model"]["ignore_merges"] = shape["changes"]["ignore_merges"];
  write_json_file(path, j);
  const BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(path);
  int checked = 0;
  for (const auto& c : shape["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text), c["ids"].get<std::vector<int32_t>>()) << text;
    ++checked;
  }
  EXPECT_GE(checked, 240);
  const std::string big = hostile_text(size_t{3} << 19, 4);
  const std::vector<int32_t> serial = tok.encode(big);
  for (int threads : {2, 3}) EXPECT_EQ(tok.encode_parallel(big, threads), serial) << threads;
  return j;
}

// tests/data/bpe's tokenizer reshaped as Meta Llama 3's tokenizer.json is (a Split pre-tokenizer
// with Llama 3's pattern before ByteLevel without its regex, ignore_merges, a BOS template
// post-processor), against tokenizers 0.20.3's encode(text, add_special_tokens=False)
// (tests/data/bpe/split_expected.json, scripts/make_bpe_split_data.py). encode_parallel cuts
// only before a ' ' between ASCII letters.
TEST(BpeTokenizer, Llama3SplitThenByteLevelMatchesHuggingFaceTokenizers) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ct_bpe_split_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tokenizer.json").string();
  nlohmann::json j = reshaped_tokenizer(read_json_file(kDir + "/split_expected.json"), path);
  // Another Split pattern is never cut (its safe places are unknown), and still encodes.
  const std::string big = hostile_text(size_t{3} << 19, 4);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|\\s+";
  write_json_file(path, j);
  const BpeTokenizer other = BpeTokenizer::from_tokenizer_json(path);
  EXPECT_EQ(other.encode_parallel(big, 3), other.encode(big));
  // Refused, naming the field: other behaviours, inverted, a pattern PCRE2 cannot compile.
  auto refused = [&](const char* key, const nlohmann::json& value, const char* what) {
    nlohmann::json k = j;
    k["pre_tokenizer"]["pretokenizers"][0][key] = value;
    write_json_file(path, k);
    try {
      (void)BpeTokenizer::from_tokenizer_json(path);
      ADD_FAILURE() << key << " " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("behavior", "Removed", "pretokenizers[0].behavior");
  refused("invert", true, "pretokenizers[0].invert");
  refused("pattern", {{"Regex", "(unclosed"}}, "the pattern does not compile");
  refused("pattern", {{"String", " "}}, "pretokenizers[0].pattern");
  fs::remove_all(dir);
}

// Qwen2's shape: Llama 3's pattern with one digit a piece, behind an NFC normalizer (ICU);
// the same texts, with decomposed letters, Hangul jamo, singletons and marks to reorder.
TEST(BpeTokenizer, Qwen2NfcSplitThenByteLevelMatchesHuggingFaceTokenizers) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ct_bpe_qwen2_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tokenizer.json").string();
  nlohmann::json j =
      reshaped_tokenizer(read_json_file(kDir + "/split_expected.json")["qwen2"], path);
  const BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(path);
  // Invalid UTF-8 around a decomposed letter: the valid runs are normalized, the bytes kept.
  const std::string bad = std::string("e\xcc\x81") + "\xff" + "a\xcc\x8a";
  EXPECT_EQ(tok.decode(tok.encode(bad)), std::string("\xc3\xa9\xff\xc3\xa5"));
  // An added token matched after normalization cannot be honoured: refused, naming it.
  j["added_tokens"].push_back(
      {{"id", 7}, {"content", "caf\u00e9"}, {"special", false}, {"normalized", true}});
  write_json_file(path, j);
  try {
    (void)BpeTokenizer::from_tokenizer_json(path);
    ADD_FAILURE() << "a normalized added token was accepted with NFC";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".normalized"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(BpeTokenizer, ParallelEqualsSerial) {
  const BpeTokenizer& tok = tokenizer();
  for (uint32_t seed : {1u, 2u}) {
    const std::string big = hostile_text(size_t{3} << 19, seed);
    const std::vector<int32_t> serial = tok.encode(big);
    for (int threads : {1, 2, 3, 7})
      EXPECT_EQ(tok.encode_parallel(big, threads), serial) << threads << " threads";
  }
  // No safe cut anywhere: one chunk.
  const std::string spaces(size_t{1} << 20, ' ');
  EXPECT_EQ(tok.encode_parallel(spaces, 3), tok.encode(spaces));
  EXPECT_TRUE(tok.encode_parallel("", 3).empty());
}

TEST(BpeTokenizer, ParallelReportsProgress) {
  const BpeTokenizer& tok = tokenizer();
  const std::string text = hostile_text(size_t{1} << 20, 3);
  for (int threads : {1, 3}) {
    std::vector<size_t> seen;
    const std::vector<int32_t> ids =
        tok.encode_parallel(text, threads, [&](size_t done) { seen.push_back(done); });
    EXPECT_EQ(ids, tok.encode(text));
    ASSERT_FALSE(seen.empty());
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
    EXPECT_EQ(seen.back(), text.size());
  }
}

TEST(BpeTokenizer, InvalidUtf8DoesNotFail) {
  const BpeTokenizer& tok = tokenizer();
  const std::string bad = std::string("ok \xff\xfe bytes \xc3 cut \xe2\x82", 21);
  const std::vector<int32_t> ids = tok.encode(bad);
  EXPECT_EQ(tok.decode(ids), bad);  // every byte kept, as its own stand-in
  // A run of invalid bytes is one piece, the valid text around it pieces as usual.
  std::vector<int32_t> want = tok.encode("ok ");
  for (int32_t id : tok.encode("\xff\xfe")) want.push_back(id);
  for (int32_t id : tok.encode(" bytes")) want.push_back(id);
  EXPECT_EQ(tok.encode("ok \xff\xfe bytes"), want);
}

TEST(BpeTokenizer, RefusesWhatItDoesNotImplementNamingTheFile) {
  TempDir dir;
  const auto kBad = ErrorKind::kInvalidArgument;
  const nlohmann::json good = read_json_file(kDir + "/tokenizer.json");
  auto refused = [&](const std::string& name, const nlohmann::json& j,
                     const std::vector<std::string>& parts) {
    const std::string path = dir.file(name);
    write_bytes(path, j.dump());
    std::vector<std::string> want = parts;
    want.push_back(path);
    expect_error([&] { BpeTokenizer::from_tokenizer_json(path); }, kBad, want);
  };
  nlohmann::json j = good;
  j["model"]["type"] = "WordPiece";
  refused("type.json", j, {"model.type", "WordPiece"});
  j = good;
  j["normalizer"] = {{"type", "NFKC"}};  // (NFC is read: Qwen2's)
  refused("norm.json", j, {"normalizer", "NFKC"});
  j = good;
  j["pre_tokenizer"]["add_prefix_space"] = true;
  refused("prefix.json", j, {"add_prefix_space"});
  j = good;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  refused("pre.json", j, {"pre_tokenizer", "Whitespace"});
  j = good;
  j["decoder"] = {{"type", "WordPiece"}};
  refused("decoder.json", j, {"decoder", "WordPiece"});
  j = good;
  j["truncation"] = {{"max_length", 8}};
  refused("truncation.json", j, {"truncation"});
  j = good;
  j["model"]["dropout"] = 0.1;
  refused("dropout.json", j, {"model.dropout"});
  j = good;
  j["model"]["unk_token"] = "<unk>";
  refused("unk.json", j, {"model.unk_token"});
  j = good;
  j["added_tokens"][0]["lstrip"] = true;
  refused("lstrip.json", j, {"added_tokens[0].lstrip"});
  j = good;
  j["model"]["merges"].push_back(nlohmann::json::array({"zz_not", "in_vocab"}));
  refused("merge.json", j, {"model.merges[854]", "zz_not", "not in model.vocab"});
  j = good;
  j["model"]["merges"].push_back(42);
  refused("merge_kind.json", j, {"model.merges[854]"});

  write_bytes(dir.file("broken.json"), "{\"model\": ");
  expect_error([&] { BpeTokenizer::from_tokenizer_json(dir.file("broken.json")); }, kBad,
               {dir.file("broken.json")});
  write_bytes(dir.file("vocab_bad.json"), "{\"a\": \"one\"}");
  expect_error([&] { BpeTokenizer::from_files(dir.file("vocab_bad.json"), kDir + "/merges.txt"); },
               kBad, {dir.file("vocab_bad.json"), "\"a\""});

  // merges.txt naming a token vocab.json does not have: the line is named
  write_bytes(dir.file("merges.txt"), "#version: 0.2\ni n\nqq rr\n");
  expect_error([&] { BpeTokenizer::from_files(kDir + "/vocab.json", dir.file("merges.txt")); },
               kBad, {dir.file("merges.txt"), "line 3", "qq", "vocab.json"});
  write_bytes(dir.file("merges1.txt"), "i n extra\n");
  expect_error([&] { BpeTokenizer::from_files(kDir + "/vocab.json", dir.file("merges1.txt")); },
               kBad, {dir.file("merges1.txt"), "line 1"});
  // an empty folder
  TempDir empty;
  expect_error([&] { BpeTokenizer::from_folder(empty.path()); }, kBad,
               {empty.path(), "tokenizer.json"});
}

}  // namespace
}  // namespace ct
