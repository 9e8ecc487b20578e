// Unicode Normalization Form C, as a tokenizer.json "normalizer": {"type": "NFC"} (Qwen2's)
// applies it before pre-tokenization. ICU's normalizer (Unicode 15 in Debian 12's ICU 72).
#pragma once

#include <string>
#include <string_view>

namespace ct {

// Whether NFC can change `text`: only text with a byte >= 0x80 can (ASCII is NFC, and an ASCII
// character composes only with a following non-ASCII mark).
bool nfc_may_change(std::string_view text);

// Appends NFC(text) to `out`. Text that is not valid UTF-8 (which `tokenizers` never sees: Python
// strings are Unicode) is normalized run by run: each maximal valid run is normalized, and the
// bytes between runs are kept as they are.
void append_nfc(std::string_view text, std::string& out);

}  // namespace ct
