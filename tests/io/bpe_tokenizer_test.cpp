// GPT-2 byte-level BPE against Hugging Face `tokenizers`: the ids it gave for the committed
// vocabulary (tests/data/bpe, made by scripts/make_bpe_data.py), in both file formats; the
// parallel encoder against the serial one; decoding; refusal of files it does not implement.
#include "core/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/io/json_file.h"
#include "tests/io/io_test_util.h"

namespace ct {
namespace {

using testing::expect_error;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

const std::string kDir = std::string(CT_TEST_DATA_DIR) + "/bpe";

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> cases() {
  nlohmann::json j = read_json_file(kDir + "/expected.json");
  std::vector<Case> out;
  for (const auto& c : j["cases"])
    out.push_back({c["text"].get<std::string>(), c["ids"].get<std::vector<int32_t>>()});
  return out;
}

TEST(BpeTokenizer, MatchesHuggingFaceTokenizersInBothFormats) {
  const BpeTokenizer from_json = BpeTokenizer::from_tokenizer_json(kDir + "/tokenizer.json");
  const BpeTokenizer from_files =
      BpeTokenizer::from_files(kDir + "/vocab.json", kDir + "/merges.txt");
  const BpeTokenizer from_folder = BpeTokenizer::from_folder(kDir);  // tokenizer.json wins
  EXPECT_EQ(from_json.vocab_size(), from_files.vocab_size());
  int checked = 0;
  for (const Case& c : cases()) {
    EXPECT_EQ(from_json.encode(c.text), c.ids) << "tokenizer.json, text: " << c.text;
    EXPECT_EQ(from_files.encode(c.text), c.ids) << "vocab.json + merges.txt, text: " << c.text;
    EXPECT_EQ(from_folder.encode(c.text), c.ids) << "folder, text: " << c.text;
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST(BpeTokenizer, DecodeInvertsEncode) {
  const BpeTokenizer tok = BpeTokenizer::from_folder(kDir);
  for (const Case& c : cases()) EXPECT_EQ(tok.decode(c.ids), c.text);
  const std::vector<int32_t> outside = {-1, tok.vocab_size()};
  EXPECT_EQ(tok.decode(outside), "\xEF\xBF\xBD\xEF\xBF\xBD");
  ASSERT_TRUE(tok.token_to_id("<|endoftext|>").has_value());
  EXPECT_EQ(tok.decode(std::vector<int32_t>{*tok.token_to_id("<|endoftext|>")}), "<|endoftext|>");
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

TEST(BpeTokenizer, ParallelEqualsSerial) {
  const BpeTokenizer tok = BpeTokenizer::from_folder(kDir);
  std::string text;
  for (const Case& c : cases()) text += c.text + "\n";
  // Cut-hostile stretches: whitespace runs across would-be cut points, blank lines with spaces,
  // added tokens next to newlines, a line break between non-ASCII characters.
  const std::string hostile = "x\n\n   \ny\n \n\tz\n<|endoftext|>\nw\n" + std::string(3000, ' ') +
                              "\nv\u00e9\n\u00e9u\n" + std::string(500, '\n') + "t\n";
  std::string big;
  while (big.size() < (1u << 20)) big += text + hostile;
  const std::vector<int32_t> serial = tok.encode(big);
  for (int threads : {1, 2, 3, 7})
    EXPECT_EQ(tok.encode_parallel(big, threads), serial) << threads << " threads";
}

TEST(BpeTokenizer, InvalidUtf8DoesNotFail) {
  const BpeTokenizer tok = BpeTokenizer::from_folder(kDir);
  const std::string bad = std::string("ok \xff\xfe bytes \xc3 cut \xe2\x82", 21);
  const std::vector<int32_t> ids = tok.encode(bad);
  EXPECT_EQ(tok.decode(ids), bad);  // every byte kept, as its own stand-in
}

TEST(BpeTokenizer, RefusesWhatItDoesNotImplementNamingTheFile) {
  TempDir dir;
  const auto kBad = ErrorKind::kInvalidArgument;
  const nlohmann::json good = read_json_file(kDir + "/tokenizer.json");
  auto refused = [&](const std::string& name, nlohmann::json j,
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
  j["normalizer"] = {{"type", "NFC"}};
  refused("norm.json", j, {"normalizer", "NFC"});
  j = good;
  j["pre_tokenizer"]["add_prefix_space"] = true;
  refused("prefix.json", j, {"add_prefix_space"});
  j = good;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  refused("pre.json", j, {"pre_tokenizer", "Whitespace"});
  j = good;
  j["model"]["dropout"] = 0.1;
  refused("dropout.json", j, {"model.dropout"});
  j = good;
  j["added_tokens"][0]["lstrip"] = true;
  refused("lstrip.json", j, {"added_tokens[0].lstrip"});
  j = good;
  j["model"]["merges"].push_back(nlohmann::json::array({"zz_not", "in_vocab"}));
  refused("merge.json", j, {"model.merges[", "zz_not", "not in model.vocab"});

  write_bytes(dir.file("broken.json"), "{\"model\": ");
  expect_error([&] { BpeTokenizer::from_tokenizer_json(dir.file("broken.json")); }, kBad,
               {dir.file("broken.json")});

  // merges.txt naming a token vocab.json does not have: the line is named
  write_bytes(dir.file("merges.txt"), "#version: 0.2\ni n\nqq rr\n");
  expect_error([&] { BpeTokenizer::from_files(kDir + "/vocab.json", dir.file("merges.txt")); },
               kBad, {dir.file("merges.txt"), "line 3", "qq"});
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
