// Loading training text and splitting it into training and validation tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ct {

// The bytes of the file `path` (taken as is), or of every text file under the folder `path`:
// recursive, sorted by path, skipping symlinks, hidden entries (name starting with '.'), files
// ending in ".dat", empty files, and files containing a NUL byte (binary). Files of a folder are
// concatenated, with a '\n' added after any file that does not end in one. Throws
// Error(kInvalidArgument) naming the path if it does not exist, is an empty file, is a folder
// with no text file, or yields fewer than `min_bytes` bytes; Error(kIo) if a file cannot be read.
std::string load_text(const std::string& path, size_t min_bytes = 1);

struct TokenSplit {
  std::vector<int32_t> train;
  std::vector<int32_t> val;
};

// train = the first (1 - val_fraction) of `tokens`, val = the last val_fraction (rounded to the
// nearest token). val_fraction in [0, 1); 0 gives an empty val. Each non-empty part must hold at
// least one window of `window` inputs (window + 1 tokens), else Error(kInvalidArgument) saying
// how many tokens each part got and needs.
TokenSplit split_train_val(std::span<const int32_t> tokens, double val_fraction, int64_t window);

}  // namespace ct
