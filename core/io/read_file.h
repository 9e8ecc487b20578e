// Reading whole files with errors that name the file.
#pragma once

#include <string>

namespace ct {

// The bytes of the regular file at `path`. Throws Error(kIo) naming the path (and the system's
// reason) if it is missing, not a regular file, or cannot be read.
std::string read_file_bytes(const std::string& path);

}  // namespace ct
