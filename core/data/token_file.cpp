#include "core/data/token_file.h"

#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/io/read_file.h"

namespace ct {
namespace {

// Little-endian reads: the formats are little-endian whatever the host.
uint32_t le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint16_t le16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail(ErrorKind::kInvalidArgument, path + ": " + what);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// tokens[i] = the id at body + i * width, checked against the vocabulary.
std::vector<int32_t> decode_body(const std::string& path, const unsigned char* body, int64_t count,
                                 int width, int64_t body_offset, int64_t vocab_size) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* p = body + i * width;
    const uint32_t id = width == 2 ? le16(p) : le32(p);
    if (static_cast<int64_t>(id) >= vocab_size)
      bad(path, "token " + std::to_string(i) + " at byte offset " +
                    std::to_string(body_offset + i * width) + " is " + std::to_string(id) +
                    ", not below the vocabulary size " + std::to_string(vocab_size));
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(id);
  }
  return tokens;
}

}  // namespace

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::kText:
      return "text";
    case DataFormat::kLlmc:
      return "llm.c tokens";
    case DataFormat::kNanoGpt:
      return "nanoGPT tokens";
  }
  return "?";
}

DataFormat detect_data_format(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return DataFormat::kText;  // a folder, or missing: the text loader reports it
  unsigned char head[4] = {};
  f.read(reinterpret_cast<char*>(head), 4);
  if (f.gcount() == 4) {
    const int32_t magic = static_cast<int32_t>(le32(head));
    if (magic == kLlmcMagicU16 || magic == kLlmcMagicU32) return DataFormat::kLlmc;
  }
  return ends_with(path, ".bin") ? DataFormat::kNanoGpt : DataFormat::kText;
}

std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size) {
  CT_REQUIRE(vocab_size > 0, "read_token_file: vocab_size must be positive");
  const DataFormat format = detect_data_format(path);
  const std::string bytes = read_file_bytes(path);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size == 0) bad(path, "the token file is empty");

  if (format == DataFormat::kNanoGpt) {
    if (size % 2 != 0)
      bad(path, "a nanoGPT token file holds uint16 tokens, but its " + std::to_string(size) +
                    " bytes are an odd count (the last token, at byte offset " +
                    std::to_string(size - 1) + ", is cut)");
    return decode_body(path, data, size / 2, 2, 0, vocab_size);
  }
  if (format != DataFormat::kLlmc)
    bad(path, "not a token file (no llm.c magic at byte offset 0 and no .bin name)");

  if (size < kLlmcHeaderBytes)
    bad(path, "llm.c header truncated: the file has " + std::to_string(size) +
                  " bytes, the header alone needs " + std::to_string(kLlmcHeaderBytes));
  const int32_t magic = static_cast<int32_t>(le32(data));
  const int32_t version = static_cast<int32_t>(le32(data + 4));
  const int64_t count = static_cast<int32_t>(le32(data + 8));
  const int32_t want_version = magic == kLlmcMagicU16 ? kLlmcVersionU16 : kLlmcVersionU32;
  if (version != want_version)
    bad(path, "llm.c header: version " + std::to_string(version) + " at byte offset 4, magic " +
                  std::to_string(magic) + " needs version " + std::to_string(want_version));
  if (count < 0)
    bad(path, "llm.c header: token count " + std::to_string(count) + " at byte offset 8");
  const int width = magic == kLlmcMagicU16 ? 2 : 4;
  const int64_t body = size - kLlmcHeaderBytes;
  if (body != count * width)
    bad(path, "llm.c header at byte offset 8 says " + std::to_string(count) + " tokens (" +
                  std::to_string(count * width) + " bytes from offset " +
                  std::to_string(kLlmcHeaderBytes) + "), but the body has " + std::to_string(body) +
                  " bytes" + (body < count * width ? " (truncated)" : " (trailing bytes)"));
  return decode_body(path, data + kLlmcHeaderBytes, count, width, kLlmcHeaderBytes, vocab_size);
}

void write_llmc_token_file(const std::string& path, std::span<const int32_t> tokens) {
  CT_REQUIRE(
      tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
      path + ": " + std::to_string(tokens.size()) + " tokens are more than an llm.c header counts");
  bool fits16 = true;
  for (size_t i = 0; i < tokens.size(); ++i) {
    CT_REQUIRE(tokens[i] >= 0, path + ": token " + std::to_string(i) + " is negative");
    fits16 = fits16 && tokens[i] <= 0xFFFF;
  }
  const int width = fits16 ? 2 : 4;
  std::string out(static_cast<size_t>(kLlmcHeaderBytes) + tokens.size() * width, '\0');
  auto put32 = [&](size_t at, uint32_t v) {
    for (int b = 0; b < 4; ++b) out[at + b] = static_cast<char>(v >> (8 * b));
  };
  put32(0, static_cast<uint32_t>(fits16 ? kLlmcMagicU16 : kLlmcMagicU32));
  put32(4, static_cast<uint32_t>(fits16 ? kLlmcVersionU16 : kLlmcVersionU32));
  put32(8, static_cast<uint32_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(tokens[i]);
    const size_t at = static_cast<size_t>(kLlmcHeaderBytes) + i * width;
    for (int b = 0; b < width; ++b) out[at + b] = static_cast<char>(v >> (8 * b));
  }
  write_file_atomic(path, out);
}

}  // namespace ct
