#include "core/io/json_file.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/io/read_file.h"

namespace ct {

nlohmann::json read_json_file(const std::string& path) {
  std::string text = read_file_bytes(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorKind::kInvalidArgument, "JSON file '" + path + "' is not valid JSON: " + e.what());
  }
}

void write_json_file(const std::string& path, const nlohmann::json& value, int indent) {
  std::string text;
  try {
    text = value.dump(indent) + "\n";
  } catch (const nlohmann::json::type_error& e) {
    fail(ErrorKind::kInvalidArgument, "cannot write JSON file '" + path + "': " + e.what());
  }
  write_file_atomic(path, text);
}

}  // namespace ct
