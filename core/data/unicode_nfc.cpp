#include "core/data/unicode_nfc.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "core/error.h"

namespace ct {

namespace {

// Length of the valid UTF-8 prefix of s (no truncated, overlong, surrogate or out-of-range
// sequences: what u_strFromUTF8 accepts).
size_t valid_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const int n = (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + static_cast<size_t>(n) >= s.size()) return i;
    uint32_t cp = c & (0x3Fu >> n);
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((d >> 6) != 2) return i;
      cp = cp << 6 | (d & 0x3Fu);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += static_cast<size_t>(n) + 1;
  }
  return i;
}

void check(UErrorCode e, const char* what) {
  if (U_FAILURE(e)) fail(ErrorKind::kInternal, std::string("NFC: ") + what + ": " + u_errorName(e));
}

// NFC of valid UTF-8, through UTF-16 (ICU's normalizer works on UTF-16).
void append_nfc_valid(std::string_view s, std::string& out) {
  UErrorCode e = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&e);
  check(e, "unorm2_getNFCInstance");
  std::vector<UChar> src(s.size() + 1), dst;
  int32_t n = 0;
  u_strFromUTF8(src.data(), static_cast<int32_t>(src.size()), &n, s.data(),
                static_cast<int32_t>(s.size()), &e);
  check(e, "u_strFromUTF8");
  dst.resize(static_cast<size_t>(n) * 3 + 16);  // NFC grows text by at most 3x (UAX #15)
  const int32_t m =
      unorm2_normalize(nfc, src.data(), n, dst.data(), static_cast<int32_t>(dst.size()), &e);
  check(e, "unorm2_normalize");
  int32_t bytes = 0;
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(m) * 3 + 4);
  u_strToUTF8(out.data() + at, static_cast<int32_t>(out.size() - at), &bytes, dst.data(), m, &e);
  check(e, "u_strToUTF8");
  out.resize(at + static_cast<size_t>(bytes));
}

}  // namespace

bool nfc_may_change(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return true;
  return false;
}

void append_nfc(std::string_view text, std::string& out) {
  while (!text.empty()) {
    const size_t v = valid_prefix(text);
    if (v > 0) append_nfc_valid(text.substr(0, v), out);
    if (v == text.size()) break;
    out.push_back(text[v]);  // an invalid byte stays as it is
    text.remove_prefix(v + 1);
  }
}

}  // namespace ct
