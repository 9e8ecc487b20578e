// SHA-256 digests (OpenSSL's libcrypto) for checkpoint integrity checks.
#pragma once

#include <string>
#include <string_view>

namespace ct {

// Lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);
// Lower-case hex SHA-256 of the file at `path`; Error(kIo) naming the path if it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace ct
