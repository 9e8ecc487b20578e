#include "core/io/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "tests/io/io_test_util.h"

namespace ct {
namespace {

using testing::expect_error;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file by hand: length prefix, header text, data bytes.
std::string craft(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

std::vector<std::byte> pattern_bytes(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7 + 3) & 0xff);
  return v;
}

TEST(Safetensors, RoundTripEveryDType) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const DType dtypes[] = {DType::f32, DType::f16, DType::bf16, DType::i8, DType::u8, DType::i32};
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsTensor> tensors;
  int i = 0;
  for (DType dt : dtypes) {
    std::vector<int64_t> shape = {2, 3 + i};
    storage.push_back(pattern_bytes(static_cast<size_t>(2 * (3 + i)) * dtype_size(dt), i));
    tensors.push_back({std::string("t_") + dtype_name(dt), dt, shape, storage.back()});
    ++i;
  }
  storage.push_back({});
  tensors.push_back({"empty", DType::f32, {0, 4}, storage.back()});
  storage.push_back(pattern_bytes(4, 9));
  tensors.push_back({"scalar", DType::f32, {}, storage.back()});
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "42"}};
  write_safetensors(path, tensors, meta);

  // The header is padded so the data section is 8-byte aligned.
  std::string raw = read_bytes(path);
  uint64_t hlen = 0;
  std::memcpy(&hlen, raw.data(), 8);
  EXPECT_EQ(hlen % 8, 0u);

  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.names().size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const SafetensorsTensor& t = tensors[k];
    EXPECT_EQ(f.names()[k], t.name);  // data-section order = write order
    const SafetensorsInfo& info = f.info(t.name);
    EXPECT_EQ(info.dtype, t.dtype) << t.name;
    EXPECT_EQ(info.shape, t.shape) << t.name;
    auto d = f.data(t.name);
    ASSERT_EQ(d.size(), t.data.size()) << t.name;
    EXPECT_TRUE(std::equal(d.begin(), d.end(), t.data.begin())) << t.name;
  }
  EXPECT_EQ(f.info("scalar").numel(), 1);
  Shape s = f.info("t_f32").to_shape();
  EXPECT_EQ(s.ndim, 2);
  EXPECT_EQ(s.d[0], 2);
  EXPECT_EQ(s.d[1], 3);
  expect_error([&] { f.info("nope"); }, ErrorKind::kInvalidArgument, {path, "nope"});

  // Moving keeps the mapping valid.
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(g.data("t_u8").size(), 2u * 7u);
}

TEST(Safetensors, DTypeNamesOnDisk) {
  TempDir dir;
  const std::string path = dir.file("a.safetensors");
  std::vector<std::byte> b(2);
  write_safetensors(path, {{"x", DType::bf16, {1}, b}});
  EXPECT_NE(read_bytes(path).find("\"BF16\""), std::string::npos);
  EXPECT_STREQ(safetensors_dtype_name(DType::i32), "I32");
  EXPECT_STREQ(safetensors_dtype_name(DType::f16), "F16");
}

TEST(Safetensors, ReadsHandWrittenFile) {
  TempDir dir;
  const std::string path = dir.file("h.safetensors");
  std::string data(12, '\x01');
  write_bytes(path, craft(R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]},)"
                          R"("a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                          R"("__metadata__":{"k":"v"}}   )",
                          data));
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.info("b").begin, 8u);
  EXPECT_EQ(f.metadata().at("k"), "v");
}

TEST(Safetensors, EmptyHeaderObjectIsValid) {
  TempDir dir;
  const std::string path = dir.file("e.safetensors");
  write_bytes(path, craft("{}", ""));
  EXPECT_TRUE(read_safetensors(path).names().empty());
}

TEST(Safetensors, WriterRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  std::vector<std::byte> b(8);
  expect_error(
      [&] {
        write_safetensors(path, {{"x", DType::f32, {3}, b}});
      },
      ErrorKind::kInvalidArgument, {path, "'x'", "12 bytes", "got 8"});
  expect_error(
      [&] {
        write_safetensors(path, {{"x", DType::u8, {8}, b}, {"x", DType::u8, {8}, b}});
      },
      ErrorKind::kInvalidArgument, {path, "duplicate", "'x'"});
  expect_error(
      [&] {
        write_safetensors(path, {{"__metadata__", DType::u8, {8}, b}});
      },
      ErrorKind::kInvalidArgument, {path, "reserved"});
  expect_error(
      [&] {
        write_safetensors(path, {{"x", DType::u8, {-8}, b}});
      },
      ErrorKind::kInvalidArgument, {path, "shape"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, MissingFileIsIoError) {
  TempDir dir;
  const std::string path = dir.file("absent.safetensors");
  expect_error([&] { read_safetensors(path); }, ErrorKind::kIo, {path});
}

// Each broken rule: the file, and words the message must contain besides the path.
struct BadCase {
  const char* label;
  std::string bytes;
  std::vector<std::string> words;
};

std::string entry(const std::string& dtype, const std::string& shape, const std::string& off) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + off + "}";
}

std::vector<BadCase> bad_cases() {
  const std::string d8(8, '\0');
  return {
      {"empty_file", "", {"shorter than the 8-byte"}},
      {"seven_bytes", std::string(7, '\0'), {"7 bytes"}},
      {"header_too_long", u64_le(200'000'000) + "{}", {"header length 200000000", "limit"}},
      {"header_past_end", u64_le(64) + "{}", {"header length 64", "past the end"}},
      {"huge_header_length", u64_le(~0ull) + "{}", {"exceeds the limit"}},
      {"not_json", craft("{\"a\":", ""), {"not valid JSON"}},
      {"garbage", craft("\x01\x02\x03", ""), {"not valid JSON"}},
      {"not_object", craft("[1,2]", ""), {"not a JSON object"}},
      {"entry_not_object", craft(R"({"a":5})", ""), {"'a'", "not an object"}},
      {"unknown_dtype",
       craft(R"({"a":)" + entry("Q7", "[2]", "[0,8]") + "}", d8),
       {"'a'", "unknown dtype 'Q7'"}},
      {"f64_unsupported",
       craft(R"({"a":)" + entry("F64", "[1]", "[0,8]") + "}", d8),
       {"'a'", "'F64' is not supported", "F32"}},
      {"i64_unsupported",
       craft(R"({"a":)" + entry("I64", "[1]", "[0,8]") + "}", d8),
       {"'I64' is not supported"}},
      {"missing_dtype", craft(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8), {"\"dtype\""}},
      {"shape_not_list",
       craft(R"({"a":)" + entry("F32", "2", "[0,8]") + "}", d8),
       {"'a'", "\"shape\""}},
      {"shape_negative",
       craft(R"({"a":)" + entry("F32", "[-2]", "[0,8]") + "}", d8),
       {"'a'", "non-negative integers"}},
      {"shape_float",
       craft(R"({"a":)" + entry("F32", "[2.0]", "[0,8]") + "}", d8),
       {"non-negative integers"}},
      {"shape_string",
       craft(R"({"a":)" + entry("F32", "[\"2\"]", "[0,8]") + "}", d8),
       {"non-negative integers"}},
      {"offsets_one_elem",
       craft(R"({"a":)" + entry("F32", "[2]", "[8]") + "}", d8),
       {"'a'", "data_offsets", "[begin, end]"}},
      {"offsets_negative",
       craft(R"({"a":)" + entry("F32", "[2]", "[-1,7]") + "}", d8),
       {"data_offsets"}},
      {"offsets_reversed",
       craft(R"({"a":)" + entry("U8", "[0]", "[8,0]") + "}", d8),
       {"'a'", "begin > end"}},
      {"size_mismatch",
       craft(R"({"a":)" + entry("F32", "[3]", "[0,8]") + "}", d8),
       {"'a'", "8 bytes", "needs 12"}},
      {"shape_overflow",
       craft(R"({"a":)" + entry("F32", "[4294967296,4294967296]", "[0,8]") + "}", d8),
       {"'a'", "overflow"}},
      {"gap_at_start", craft(R"({"a":)" + entry("U8", "[4]", "[4,8]") + "}", d8), {"'a'", "gap"}},
      {"gap_between",
       craft(R"({"a":)" + entry("U8", "[2]", "[0,2]") + R"(,"b":)" + entry("U8", "[4]", "[4,8]") +
                 "}",
             d8),
       {"'b'", "gap"}},
      {"overlap",
       craft(R"({"a":)" + entry("U8", "[6]", "[0,6]") + R"(,"b":)" + entry("U8", "[4]", "[4,8]") +
                 "}",
             d8),
       {"'b'", "overlapping"}},
      {"data_too_long",
       craft(R"({"a":)" + entry("U8", "[4]", "[0,4]") + "}", d8),
       {"ends at offset 4", "8 bytes", "end of the file"}},
      {"data_truncated",
       craft(R"({"a":)" + entry("U8", "[16]", "[0,16]") + "}", d8),
       {"ends at offset 16", "8 bytes"}},
      {"duplicate_name",
       craft(R"({"a":)" + entry("U8", "[4]", "[0,4]") + R"(,"a":)" + entry("U8", "[4]", "[4,8]") +
                 "}",
             d8),
       {"duplicate key 'a'"}},
      {"metadata_not_object", craft(R"({"__metadata__":[1]})", ""), {"__metadata__"}},
      {"metadata_not_string", craft(R"({"__metadata__":{"k":1}})", ""), {"__metadata__", "'k'"}},
  };
}

TEST(Safetensors, RejectsEveryBrokenRule) {
  TempDir dir;
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.file(std::string(c.label) + ".safetensors");
    write_bytes(path, c.bytes);
    std::vector<std::string> words = c.words;
    words.push_back(path);
    expect_error([&] { read_safetensors(path); }, ErrorKind::kInvalidArgument, words);
  }
}

TEST(Safetensors, TruncatedAndBitFlippedFiles) {
  TempDir dir;
  const std::string path = dir.file("good.safetensors");
  std::vector<std::byte> a = pattern_bytes(40, 1), b = pattern_bytes(6, 2);
  write_safetensors(path, {{"a", DType::f32, {10}, a}, {"b", DType::f16, {3}, b}}, {{"k", "v"}});
  const std::string good = read_bytes(path);
  ASSERT_NO_THROW(read_safetensors(path));

  // Every truncation is rejected with a message naming the file.
  const std::string cut = dir.file("cut.safetensors");
  for (size_t n = 0; n < good.size(); ++n) {
    write_bytes(cut, good.substr(0, n));
    try {
      read_safetensors(cut);
      ADD_FAILURE() << "truncation to " << n << " bytes accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
    }
  }

  // Flipping any bit of the header either still parses to an equally valid file or is rejected
  // with kInvalidArgument; it never crashes or escapes as another exception type.
  uint64_t hlen = 0;
  std::memcpy(&hlen, good.data(), 8);
  const std::string flip = dir.file("flip.safetensors");
  int rejected = 0;
  for (size_t byte = 0; byte < 8 + hlen; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
      write_bytes(flip, bad);
      try {
        read_safetensors(flip);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(Safetensors, AtomicWriteKeepsPreviousFileOnFailure) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  std::vector<std::byte> a = pattern_bytes(16, 1);
  write_safetensors(path, {{"a", DType::f32, {4}, a}});
  const std::string before = read_bytes(path);

  // An invalid tensor fails before anything is written.
  std::vector<std::byte> short_data(3);
  EXPECT_THROW(write_safetensors(path, {{"a", DType::f32, {4}, short_data}}), Error);
  EXPECT_EQ(read_bytes(path), before);

  // A folder that cannot be written: the old file stays, no temp file is left behind.
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(dir.path().c_str(), 0555), 0);
    expect_error(
        [&] {
          write_safetensors(path, {{"a", DType::f32, {4}, a}});
        },
        ErrorKind::kIo, {path});
    ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
    EXPECT_EQ(read_bytes(path), before);
  }

  // A target whose parent is a regular file.
  const std::string under_file = path + "/inner.safetensors";
  expect_error(
      [&] {
        write_safetensors(under_file, {{"a", DType::f32, {4}, a}});
      },
      ErrorKind::kIo, {under_file});
  EXPECT_EQ(read_bytes(path), before);

  // The rename fails after the temp file is fully written: a folder sits at the target.
  const std::string folder = dir.file("folder.safetensors");
  std::filesystem::create_directory(folder);
  expect_error(
      [&] {
        write_safetensors(folder, {{"a", DType::f32, {4}, a}});
      },
      ErrorKind::kIo, {folder});
  std::filesystem::remove(folder);

  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1) << "a temporary file was left behind";
}

TEST(Safetensors, ToShapeRejectsTooManyDims) {
  SafetensorsInfo info;
  info.shape = {1, 1, 1, 1, 1, 1};
  expect_error([&] { info.to_shape(); }, ErrorKind::kInvalidArgument, {"more than 5"});
}

}  // namespace
}  // namespace ct
