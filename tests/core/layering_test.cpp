// Core reaches backends only through the registry: no file under core/ includes a backend's
// header or calls a backend's factory, and the built-in cpu backend is still listed and opens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "core/registry.h"

namespace ct {
namespace {

namespace fs = std::filesystem;

// "path:line: text" for every line of a C++ file under `root` that matches `re`.
std::vector<std::string> grep_tree(const fs::path& root, const std::regex& re) {
  std::vector<std::string> hits;
  for (const auto& f : fs::recursive_directory_iterator(root)) {
    if (!f.is_regular_file()) continue;
    std::string ext = f.path().extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".hpp" && ext != ".inc") continue;
    std::ifstream in(f.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (std::regex_search(line, re))
        hits.push_back(fs::relative(f.path(), CT_SOURCE_DIR).string() + ":" + std::to_string(n) +
                       ": " + line);
  }
  return hits;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "\n  " + x;
  return s;
}

TEST(Layering, CoreIncludesNoBackend) {
  fs::path core = fs::path(CT_SOURCE_DIR) / "core";
  ASSERT_TRUE(fs::is_directory(core)) << core;
  auto hits = grep_tree(core, std::regex(R"(^\s*#\s*include\s*[<"](\.\./)*backends/)"));
  EXPECT_TRUE(hits.empty()) << "core/ must reach backends through core/registry.h only:"
                            << joined(hits);
}

TEST(Layering, CoreCallsNoBackendFactory) {
  // The offload optimizer's host device, like every device core uses, comes from open_device().
  auto hits =
      grep_tree(fs::path(CT_SOURCE_DIR) / "core", std::regex(R"(\bmake_cpu_(device|backend)\b)"));
  EXPECT_TRUE(hits.empty()) << "core/ opens devices with open_device():" << joined(hits);
}

TEST(Layering, BuiltinCpuBackendIsRegistered) {
  auto builtin = builtin_backends();
  ASSERT_FALSE(builtin.empty());
  EXPECT_EQ(builtin.front()->name(), "cpu");
  ASSERT_FALSE(backends().empty());
  EXPECT_EQ(backends().front().name, "cpu");
  EXPECT_EQ(backends().front().path, "built in");
  EXPECT_TRUE(backends().front().error.empty()) << backends().front().error;
  auto dev = open_device("cpu");
  EXPECT_EQ(dev->info().id(), "cpu:0");
  EXPECT_EQ(open_device("cpu:1")->info().id(), "cpu:1");
}

}  // namespace
}  // namespace ct
