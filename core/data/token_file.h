// Pre-tokenized training data: llm.c token files and nanoGPT .bin files.
//
// llm.c (dev/data/data_common.py): a header of 256 little-endian int32 -- [0] magic, [1] version,
// [2] token count, the rest zero -- then the tokens, little-endian:
//   magic 20240520, version 1: uint16 tokens (GPT-2's vocabulary)
//   magic 20240801, version 7: uint32 tokens (Llama 3's vocabulary)
// nanoGPT (data/*/prepare.py): the tokens as raw little-endian uint16, no header, name ends ".bin".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ct {

inline constexpr int32_t kLlmcMagicU16 = 20240520;
inline constexpr int32_t kLlmcVersionU16 = 1;
inline constexpr int32_t kLlmcMagicU32 = 20240801;
inline constexpr int32_t kLlmcVersionU32 = 7;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

enum class DataFormat { kText, kLlmc, kNanoGpt };
const char* data_format_name(DataFormat f);  // "text", "llm.c tokens", "nanoGPT tokens"

// What the regular file at `path` holds: an llm.c token file if its first four bytes are one of
// the llm.c magics, a nanoGPT token file if its name ends in ".bin", text otherwise (folders are
// text). Error(kIo) naming the path if a file cannot be read.
DataFormat detect_data_format(const std::string& path);

// The tokens of an llm.c or nanoGPT file (by detect_data_format), each checked below
// `vocab_size`. Error(kInvalidArgument) naming the file and the byte offset for: a bad magic or
// version, a negative token count, a body shorter or longer than the count says, an odd byte
// count (nanoGPT), an empty file, or a token id >= vocab_size (the first one is named, with its
// index). Error(kIo) if it cannot be read.
std::vector<int32_t> read_token_file(const std::string& path, int64_t vocab_size);

// Writes `tokens` as an llm.c file (uint16 version 1 when every id fits, else uint32 version 7),
// atomically. Error(kInvalidArgument) for a negative id or more tokens than an int32 counts.
void write_llmc_token_file(const std::string& path, std::span<const int32_t> tokens);

}  // namespace ct
