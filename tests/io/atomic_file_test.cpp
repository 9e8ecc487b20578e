#include "core/io/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/io/json_file.h"
#include "core/io/read_file.h"
#include "tests/io/io_test_util.h"

namespace ct {
namespace {

using testing::expect_error;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

size_t count_entries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

TEST(AtomicFile, WritesAndReplaces) {
  TempDir dir;
  const std::string path = dir.file("out.txt");
  write_file_atomic(path, "first");
  EXPECT_EQ(read_bytes(path), "first");
  write_file_atomic(path, [](FileSink& s) {
    s.write("sec");
    s.write("ond", 3);
    EXPECT_EQ(s.bytes_written(), 6u);
  });
  EXPECT_EQ(read_bytes(path), "second");
  EXPECT_EQ(count_entries(dir.path()), 1u);
}

TEST(AtomicFile, ThrowingFillLeavesOldFileAndNoTemp) {
  TempDir dir;
  const std::string path = dir.file("out.txt");
  write_file_atomic(path, "keep me");
  EXPECT_THROW(write_file_atomic(path,
                                 [](FileSink& s) {
                                   s.write("partial");
                                   throw std::runtime_error("producer failed");
                                 }),
               std::runtime_error);
  EXPECT_EQ(read_bytes(path), "keep me");
  EXPECT_EQ(count_entries(dir.path()), 1u);
}

TEST(AtomicFile, ParentIsAFile) {
  TempDir dir;
  write_bytes(dir.file("plain"), "x");
  const std::string path = dir.file("plain/child.txt");
  expect_error([&] { write_file_atomic(path, "data"); }, ErrorKind::kIo, {path});
  EXPECT_EQ(read_bytes(dir.file("plain")), "x");
}

TEST(AtomicFile, TargetIsAFolder) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("sub"));
  expect_error([&] { write_file_atomic(dir.file("sub"), "data"); }, ErrorKind::kIo,
               {dir.file("sub")});
  EXPECT_TRUE(std::filesystem::is_directory(dir.file("sub")));
  EXPECT_EQ(count_entries(dir.path()), 1u);
}

TEST(ReadFile, MissingAndFolder) {
  TempDir dir;
  expect_error([&] { read_file_bytes(dir.file("nope")); }, ErrorKind::kIo, {dir.file("nope")});
  expect_error([&] { read_file_bytes(dir.path()); }, ErrorKind::kIo, {dir.path()});
}

TEST(JsonFile, RoundTrip) {
  TempDir dir;
  const std::string path = dir.file("cfg.json");
  nlohmann::json j = {{"n_layer", 12}, {"name", "gpt2"}, {"eps", 1e-5}, {"list", {1, 2, 3}}};
  write_json_file(path, j);
  EXPECT_EQ(read_json_file(path), j);
  EXPECT_EQ(read_bytes(path).back(), '\n');
}

TEST(JsonFile, ErrorsNameTheFile) {
  TempDir dir;
  const std::string bad = dir.file("bad.json");
  write_bytes(bad, "{\"a\": 1,");
  expect_error([&] { read_json_file(bad); }, ErrorKind::kInvalidArgument, {bad, "not valid JSON"});
  const std::string missing = dir.file("missing.json");
  expect_error([&] { read_json_file(missing); }, ErrorKind::kIo, {missing});
  // Invalid UTF-8 cannot be serialised: an error naming the file, and nothing written.
  const std::string out = dir.file("out.json");
  expect_error(
      [&] {
        write_json_file(out, nlohmann::json{{"k", std::string("\xff\xfe")}});
      },
      ErrorKind::kInvalidArgument, {out});
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace ct
