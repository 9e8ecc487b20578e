#include "core/data/text_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/data/tokenizer.h"
#include "tests/io/io_test_util.h"

namespace ct {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::TempDir;
using testing::write_bytes;

TEST(LoadText, SingleFile) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "hello world");
  EXPECT_EQ(load_text(dir.file("a.txt")), "hello world");  // a single file is taken as is
}

TEST(LoadText, FolderSkipsDatSymlinksHiddenBinary) {
  TempDir dir;
  write_bytes(dir.file("b"), "bravo\n");
  write_bytes(dir.file("a"), "alpha");  // no trailing newline: one is added
  write_bytes(dir.file("a.dat"), "index that must be skipped");
  write_bytes(dir.file("bin"), std::string("has\0nul", 7));
  write_bytes(dir.file(".hidden"), "hidden file");
  write_bytes(dir.file(".git/config"), "hidden folder");
  write_bytes(dir.file("empty"), "");
  write_bytes(dir.file("sub/c"), "charlie\n");
  fs::create_symlink("b", dir.file("b.u8"));
  fs::create_directory(dir.file("elsewhere"));
  write_bytes(dir.file("elsewhere/../elsewhere/d"), "delta\n");
  fs::create_directory_symlink(dir.file("elsewhere"), dir.file("linkdir"));
  // Sorted by path: a, b, elsewhere/d, sub/c.
  EXPECT_EQ(load_text(dir.path()), "alpha\nbravo\ndelta\ncharlie\n");
}

TEST(LoadText, Errors) {
  TempDir dir;
  expect_error([&] { load_text(dir.file("missing")); }, ErrorKind::kInvalidArgument,
               {dir.file("missing"), "does not exist"});
  write_bytes(dir.file("empty.txt"), "");
  expect_error([&] { load_text(dir.file("empty.txt")); }, ErrorKind::kInvalidArgument,
               {dir.file("empty.txt"), "empty"});
  write_bytes(dir.file("only/x.dat"), "dat");
  write_bytes(dir.file("only/bin"), std::string("\0\1\2", 3));
  expect_error([&] { load_text(dir.file("only")); }, ErrorKind::kInvalidArgument,
               {dir.file("only"), "no text files"});
  write_bytes(dir.file("short.txt"), "abc");
  expect_error([&] { load_text(dir.file("short.txt"), 65); }, ErrorKind::kInvalidArgument,
               {dir.file("short.txt"), "3 bytes", "65"});
}

TEST(LoadText, Fortunes) {
  const std::string path = "/usr/share/games/fortunes";
  if (!fs::is_directory(path)) {
    GTEST_SKIP() << path << " not found: install Debian's `fortunes` package to run this test";
  }
  std::string text = load_text(path, 1025);
  EXPECT_GT(text.size(), 1'000'000u);
  EXPECT_EQ(text.find('\0'), std::string::npos);
  // The .dat index files and .u8 symlinks are skipped: every text file appears once, so the
  // total is the sum of the plain files' sizes (plus a newline for any lacking one).
  size_t expect = 0;
  for (const auto& e : fs::directory_iterator(path)) {
    if (e.is_symlink() || !e.is_regular_file() || e.path().extension() == ".dat") continue;
    if (e.path().filename().string()[0] == '.') continue;
    expect += e.file_size();
  }
  EXPECT_GE(text.size(), expect);
  EXPECT_LT(text.size(), expect + 200);
}

TEST(SplitTrainVal, Fractions) {
  std::vector<int32_t> t(100);
  for (int i = 0; i < 100; ++i) t[i] = i;
  TokenSplit s = split_train_val(t, 0.1, 8);
  ASSERT_EQ(s.train.size(), 90u);
  ASSERT_EQ(s.val.size(), 10u);
  EXPECT_EQ(s.train.front(), 0);
  EXPECT_EQ(s.train.back(), 89);
  EXPECT_EQ(s.val.front(), 90);
  EXPECT_EQ(s.val.back(), 99);

  TokenSplit none = split_train_val(t, 0.0, 8);
  EXPECT_EQ(none.train.size(), 100u);
  EXPECT_TRUE(none.val.empty());
}

TEST(SplitTrainVal, TooSmall) {
  std::vector<int32_t> t(100);
  expect_error([&] { split_train_val(t, 0.05, 8); }, ErrorKind::kInvalidArgument,
               {"validation 5", "at least 9"});
  expect_error([&] { split_train_val(t, 0.95, 8); }, ErrorKind::kInvalidArgument, {"train gets 5"});
  expect_error([&] { split_train_val(t, 1.0, 8); }, ErrorKind::kInvalidArgument, {"[0, 1)"});
  std::vector<int32_t> tiny(5);
  expect_error([&] { split_train_val(tiny, 0.0, 8); }, ErrorKind::kInvalidArgument, {"9"});
}

}  // namespace
}  // namespace ct
