// JSON files with errors that name the file.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace ct {

// Parses the JSON file at `path`. Throws Error(kIo) naming the path if it cannot be read, and
// Error(kInvalidArgument) naming the path and the parser's position/reason if it is not JSON.
nlohmann::json read_json_file(const std::string& path);

// Writes `value` (pretty-printed with `indent` spaces, trailing newline) to `path` atomically
// (see write_file_atomic).
void write_json_file(const std::string& path, const nlohmann::json& value, int indent = 2);

}  // namespace ct
