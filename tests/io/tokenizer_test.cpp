#include "core/data/tokenizer.h"

#include <gtest/gtest.h>

namespace ct {
namespace {

TEST(ByteTokenizer, RoundTripAllBytes) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.decode(ids), all);
}

TEST(ByteTokenizer, Utf8IsBytes) {
  ByteTokenizer tok;
  std::string s = "h\xC3\xA9llo \xE2\x82\xAC";  // "héllo €"
  std::vector<int32_t> ids = tok.encode(s);
  EXPECT_EQ(ids.size(), s.size());
  EXPECT_EQ(ids[1], 0xC3);
  EXPECT_EQ(tok.decode(ids), s);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, DecodeInvalidDoesNotCrash) {
  ByteTokenizer tok;
  // A lone continuation byte and a truncated sequence stay raw bytes.
  std::vector<int32_t> raw = {0x80, 0xE2, 0x82, 'a'};
  EXPECT_EQ(tok.decode(raw), std::string("\x80\xE2\x82"
                                         "a"));
  // Ids outside the vocabulary become U+FFFD.
  std::vector<int32_t> out_of_range = {'x', -1, 256, 70000, 'y'};
  EXPECT_EQ(tok.decode(out_of_range), "x\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDy");
}

}  // namespace
}  // namespace ct
