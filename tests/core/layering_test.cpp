// Core reaches backends only through the registry: no file under core/ includes a backend's
// header or calls a backend's factory, nothing outside backends/ decides by a backend's name,
// and the built-in cpu backend is still listed and opens.
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

// Capabilities, not names: outside backends/ nothing decides by a backend's name (a device says
// what it is good at in DeviceInfo), and --tf32 reaches the device as an option, not through the
// environment.
TEST(Layering, NoDecisionByBackendName) {
  const std::regex by_name(
      R"re((==|!=)\s*"(cpu|vulkan|cuda|hip|simt|simt64)"|"(cpu|vulkan|cuda|hip|simt)"\s*(==|!=)|rfind\("(vulkan|cuda|hip|simt))re");
  std::vector<std::string> hits;
  for (const char* dir : {"core", "tools", "bench"}) {
    auto h = grep_tree(fs::path(CT_SOURCE_DIR) / dir, by_name);
    hits.insert(hits.end(), h.begin(), h.end());
  }
  EXPECT_TRUE(hits.empty()) << "decide by DeviceInfo's capabilities, not the backend's name:"
                            << joined(hits);
  std::vector<std::string> env;
  for (const char* dir : {"core", "tools", "bench", "backends"}) {
    auto h = grep_tree(fs::path(CT_SOURCE_DIR) / dir, std::regex(R"(CT_TF32)"));
    env.insert(env.end(), h.begin(), h.end());
  }
  EXPECT_TRUE(env.empty()) << "--tf32 is Device::set_allow_tf32:" << joined(env);
}

// --backend auto ranks devices by what they report.
TEST(Layering, AutoRanksByCapabilities) {
  auto info = [](DeviceType t, bool native, bool test_only = false) {
    DeviceInfo d;
    d.type = t;
    d.native_stack = native;
    d.test_only = test_only;
    return d;
  };
  const int native_gpu = auto_rank(info(DeviceType::kDiscreteGpu, true));
  const int vulkan_gpu = auto_rank(info(DeviceType::kDiscreteGpu, false));
  const int native_igpu = auto_rank(info(DeviceType::kIntegratedGpu, true));
  const int vulkan_igpu = auto_rank(info(DeviceType::kIntegratedGpu, false));
  const int cpu = auto_rank(info(DeviceType::kCpu, true));
  EXPECT_LT(native_gpu, vulkan_gpu);
  EXPECT_LT(vulkan_gpu, native_igpu);
  EXPECT_LT(native_igpu, vulkan_igpu);
  EXPECT_LT(vulkan_igpu, cpu);
  EXPECT_GE(native_gpu, 0);
  EXPECT_EQ(auto_rank(info(DeviceType::kCpu, false)), -1);  // lavapipe: the cpu backend instead
  EXPECT_EQ(auto_rank(info(DeviceType::kVirtualGpu, true, true)), -1);  // the SIMT runtime
  EXPECT_EQ(auto_rank(info(DeviceType::kDiscreteGpu, true, true)), -1);
  EXPECT_EQ(auto_rank(open_device("cpu")->info()), cpu);
  // The choice among the devices of this machine: one of the lowest rank (here cpu:0, lavapipe
  // and the SIMT runtime never).
  int best = 99;
  std::string best_ids;
  for (const auto& e : backends()) {
    if (!e.backend || !e.error.empty()) continue;
    for (const auto& d : e.backend->devices()) {
      const int r = auto_rank(d);
      if (r < 0) continue;
      if (r < best) best = r, best_ids.clear();
      if (r == best) best_ids += " " + d.id();
    }
  }
  const std::string chosen = choose_auto_device(nullptr);
  EXPECT_NE(best_ids.find(" " + chosen), std::string::npos) << chosen << " vs" << best_ids;
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
