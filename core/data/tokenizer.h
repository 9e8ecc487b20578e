// Byte-level tokenizer: token id = byte value.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ct {

class ByteTokenizer {
 public:
  static constexpr int kVocabSize = 256;
  int vocab_size() const { return kVocabSize; }

  // One token per byte, in [0, 256); bytes >= 0x80 (UTF-8 continuation etc.) map to themselves.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes back, raw (the result need not be valid UTF-8). An id outside [0, 256), which a
  // model with a padded vocabulary may sample, becomes U+FFFD rather than an error.
  std::string decode(std::span<const int32_t> ids) const;
};

}  // namespace ct
