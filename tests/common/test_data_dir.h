// Where the test data (tests/data) is, looked up once per process:
//   1. $CROSSTRAIN_TEST_DATA, when set and not empty;
//   2. a `test-data` folder beside the test executable (a bundle: scripts/bundle.sh);
//   3. the source tree's tests/data, compiled in (CT_TEST_DATA_SOURCE_DIR): the build tree.
// So a test binary copied away from the source tree (the GPU check's bundle) finds its data
// without the path it was built at.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/registry.h"

namespace ct::test {

inline const std::string& data_dir() {
  static const std::string dir = [] {
    if (const char* env = std::getenv("CROSSTRAIN_TEST_DATA"); env && *env) return std::string(env);
    std::error_code ec;
    std::filesystem::path beside = std::filesystem::path(executable_dir()) / "test-data";
    if (std::filesystem::is_directory(beside, ec)) return beside.string();
#ifdef CT_TEST_DATA_SOURCE_DIR
    return std::string(CT_TEST_DATA_SOURCE_DIR);
#else
    return beside.string();
#endif
  }();
  return dir;
}

}  // namespace ct::test
