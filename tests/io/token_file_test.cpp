// llm.c and nanoGPT token files: detection, reading, the llm.c writer, and every refusal naming
// the file and the byte offset.
#include "core/data/token_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/io/io_test_util.h"

namespace ct {
namespace {

using testing::expect_error;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// Bytes laid out by hand, independently of write_llmc_token_file.
std::string le(uint64_t v, int width) {
  std::string s;
  for (int b = 0; b < width; ++b) s.push_back(static_cast<char>((v >> (8 * b)) & 0xFF));
  return s;
}
std::string llmc_header(int32_t magic, int32_t version, int64_t count) {
  std::string h = le(static_cast<uint32_t>(magic), 4) + le(static_cast<uint32_t>(version), 4) +
                  le(static_cast<uint32_t>(count), 4);
  h.resize(1024, '\0');
  return h;
}

TEST(TokenFile, ReadsLlmcGpt2Tokens) {
  TempDir dir;
  const std::vector<int32_t> want = {50256, 0, 1, 65535 - 15279, 464, 3290};
  std::string bytes = llmc_header(20240520, 1, static_cast<int64_t>(want.size()));
  for (int32_t t : want) bytes += le(static_cast<uint32_t>(t), 2);
  write_bytes(dir.file("train.tok"), bytes);  // the magic decides, not the name
  EXPECT_EQ(detect_data_format(dir.file("train.tok")), DataFormat::kLlmc);
  EXPECT_EQ(read_token_file(dir.file("train.tok"), 50257), want);
}

TEST(TokenFile, ReadsLlmcLlama3Tokens) {
  TempDir dir;
  const std::vector<int32_t> want = {128000, 9906, 1917, 128001};
  std::string bytes = llmc_header(20240801, 7, 4);
  for (int32_t t : want) bytes += le(static_cast<uint32_t>(t), 4);
  write_bytes(dir.file("a.bin"), bytes);  // a magic wins over the .bin name
  EXPECT_EQ(detect_data_format(dir.file("a.bin")), DataFormat::kLlmc);
  EXPECT_EQ(read_token_file(dir.file("a.bin"), 128256), want);
}

TEST(TokenFile, ReadsNanoGptBin) {
  TempDir dir;
  std::string bytes = le(15496, 2) + le(11, 2) + le(995, 2);
  write_bytes(dir.file("val.bin"), bytes);
  write_bytes(dir.file("val.txt"), bytes);
  EXPECT_EQ(detect_data_format(dir.file("val.bin")), DataFormat::kNanoGpt);
  EXPECT_EQ(detect_data_format(dir.file("val.txt")), DataFormat::kText);
  EXPECT_EQ(detect_data_format(dir.path()), DataFormat::kText);
  EXPECT_EQ(read_token_file(dir.file("val.bin"), 50257), (std::vector<int32_t>{15496, 11, 995}));
}

TEST(TokenFile, WriterRoundTripsAndPicksTheWidth) {
  TempDir dir;
  std::vector<int32_t> small = {0, 1, 255, 65535, 42};
  write_llmc_token_file(dir.file("s.tok"), small);
  std::string bytes = read_bytes(dir.file("s.tok"));
  EXPECT_EQ(bytes.substr(0, 12), llmc_header(20240520, 1, 5).substr(0, 12));
  EXPECT_EQ(bytes.size(), 1024u + 5 * 2);
  EXPECT_EQ(read_token_file(dir.file("s.tok"), 65536), small);

  std::vector<int32_t> big = {65536, 7, 128255};
  write_llmc_token_file(dir.file("b.tok"), big);
  bytes = read_bytes(dir.file("b.tok"));
  EXPECT_EQ(bytes.substr(0, 12), llmc_header(20240801, 7, 3).substr(0, 12));
  EXPECT_EQ(bytes.size(), 1024u + 3 * 4);
  EXPECT_EQ(read_token_file(dir.file("b.tok"), 128256), big);

  EXPECT_THROW(write_llmc_token_file(dir.file("neg.tok"), std::vector<int32_t>{1, -1}), Error);
}

TEST(TokenFile, RefusesBadFilesNamingTheOffset) {
  TempDir dir;
  const auto kBad = ErrorKind::kInvalidArgument;
  // nanoGPT: odd byte count
  write_bytes(dir.file("odd.bin"), le(1, 2) + "x");
  expect_error([&] { read_token_file(dir.file("odd.bin"), 256); }, kBad,
               {dir.file("odd.bin"), "odd", "byte offset 2"});
  // an empty file
  write_bytes(dir.file("empty.bin"), "");
  expect_error([&] { read_token_file(dir.file("empty.bin"), 256); }, kBad,
               {dir.file("empty.bin"), "empty"});
  // llm.c: header cut short
  write_bytes(dir.file("short.tok"), llmc_header(20240520, 1, 3).substr(0, 100));
  expect_error([&] { read_token_file(dir.file("short.tok"), 256); }, kBad,
               {dir.file("short.tok"), "header truncated", "100 bytes"});
  // llm.c: wrong version for the magic
  write_bytes(dir.file("ver.tok"), llmc_header(20240520, 2, 0));
  expect_error([&] { read_token_file(dir.file("ver.tok"), 256); }, kBad,
               {dir.file("ver.tok"), "version 2", "byte offset 4"});
  // llm.c: body shorter than the count (truncated) and longer (trailing bytes)
  write_bytes(dir.file("trunc.tok"), llmc_header(20240520, 1, 3) + le(1, 2) + le(2, 2));
  expect_error([&] { read_token_file(dir.file("trunc.tok"), 256); }, kBad,
               {dir.file("trunc.tok"), "byte offset 8", "3 tokens", "4 bytes", "truncated"});
  write_bytes(dir.file("long.tok"), llmc_header(20240520, 1, 1) + le(1, 2) + le(2, 2));
  expect_error([&] { read_token_file(dir.file("long.tok"), 256); }, kBad,
               {dir.file("long.tok"), "trailing"});
  // an id past the vocabulary: named with its index and byte offset
  write_bytes(dir.file("vocab.tok"),
              llmc_header(20240520, 1, 3) + le(1, 2) + le(2, 2) + le(300, 2));
  expect_error(
      [&] { read_token_file(dir.file("vocab.tok"), 256); }, kBad,
      {dir.file("vocab.tok"), "token 2", "byte offset 1028", "300", "vocabulary size 256"});
  write_bytes(dir.file("vocab.bin"), le(5, 2) + le(256, 2));
  expect_error([&] { read_token_file(dir.file("vocab.bin"), 256); }, kBad,
               {dir.file("vocab.bin"), "token 1", "byte offset 2", "256"});
  // a file that is not a token file at all
  write_bytes(dir.file("text.txt"), "hello");
  expect_error([&] { read_token_file(dir.file("text.txt"), 256); }, kBad,
               {dir.file("text.txt"), "not a token file"});
  // missing: an I/O error naming it
  expect_error([&] { read_token_file(dir.file("missing.bin"), 256); }, ErrorKind::kIo,
               {dir.file("missing.bin")});
}

}  // namespace
}  // namespace ct
