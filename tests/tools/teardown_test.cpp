// The end of a process (issue #24: on NVIDIA's Vulkan driver every process that had loaded the
// Vulkan plugin died with SIGSEGV in exit(), its vkDestroyInstance run by a static destructor
// after the driver had torn itself down). Lavapipe survives that, so these tests check the
// order instead: under CROSSTRAIN_TRACE_TEARDOWN=1 every backend, device and Vulkan instance
// says when it goes (core/teardown_trace.h) and main() says when it returns; nothing may go
// after that line. The probe (tests/tools/teardown_probe.cpp) opens a device of every usable
// backend; `crosstrain devices` and a 2-step `crosstrain train --backend vulkan` are checked the
// same way. Each runs as a child process, Vulkan pinned to lavapipe under the validation layer
// (which also reports a VkDevice still alive when the instance goes).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/test_data_dir.h"

namespace {
namespace fs = std::filesystem;

const std::string kPrefix = "crosstrain teardown: ";

struct Child {
  int status = -1;                 // exit status; -1 when killed by a signal
  std::string output;              // stdout and stderr
  std::vector<std::string> trace;  // the teardown lines, in order, without the prefix

  // Index of the first trace line equal to `what`, or -1.
  int at(const std::string& what) const {
    auto it = std::find(trace.begin(), trace.end(), what);
    return it == trace.end() ? -1 : static_cast<int>(it - trace.begin());
  }
};

bool expected(const std::string& backend) {
  std::stringstream ss(CT_EXPECTED_BACKENDS);
  for (std::string n; std::getline(ss, n, ',');)
    if (n == backend) return true;
  return false;
}

Child run(const std::string& command) {
  // Vulkan on lavapipe unless the environment names a driver, with the validation layer.
  std::string env = "CROSSTRAIN_TRACE_TEARDOWN=1";
#ifdef CT_VK_LAVAPIPE_ICD
  if (!std::getenv("VK_DRIVER_FILES") && !std::getenv("VK_ICD_FILENAMES"))
    env += " VK_DRIVER_FILES=" CT_VK_LAVAPIPE_ICD " VK_ICD_FILENAMES=" CT_VK_LAVAPIPE_ICD;
#endif
#ifdef CT_VK_VALIDATION
  env += " VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation CROSSTRAIN_VK_VALIDATION=1";
#endif
  Child c;
  FILE* p = popen(("env " + env + " " + command + " 2>&1").c_str(), "r");
  if (!p) return c;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) c.output.append(buf.data(), n);
  const int st = pclose(p);
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::istringstream in(c.output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(kPrefix, 0) == 0) c.trace.push_back(line.substr(kPrefix.size()));
  return c;
}

// Exit status 0, no validation message, and "main returned" the last teardown line.
void expect_clean_end(const Child& c) {
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_EQ(c.output.find("[vulkan validation"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("Validation Error"), std::string::npos) << c.output;
  ASSERT_FALSE(c.trace.empty()) << c.output;
  EXPECT_EQ(c.trace.back(), "main returned")
      << "torn down after main returned (by a static destructor):\n"
      << c.output;
}

// The Vulkan objects went, in order, before main returned.
void expect_vulkan_closed_in_order(const Child& c, bool device_opened) {
  const int created = c.at("vulkan instance created"),
            destroyed = c.at("vulkan instance destroyed"),
            backend = c.at("backend vulkan destroyed"), main_end = c.at("main returned");
  ASSERT_GE(created, 0) << c.output;
  ASSERT_GE(destroyed, 0) << "the Vulkan instance was never destroyed:\n" << c.output;
  EXPECT_LT(destroyed, main_end) << c.output;
  EXPECT_GE(backend, 0) << c.output;
  if (device_opened) {
    const int opened = c.at("vulkan:0 opened"), closed = c.at("vulkan:0 closed");
    ASSERT_GE(opened, 0) << c.output;
    ASSERT_GE(closed, 0) << c.output;
    EXPECT_LT(closed, destroyed) << "the instance went before its device:\n" << c.output;
  }
}

TEST(Teardown, ProbeClosesEveryBackendBeforeMainReturns) {
  const Child c = run(CT_TEARDOWN_PROBE_BIN);
  expect_clean_end(c);
  for (const char* b : {"cpu", "vulkan", "simt", "simt64"}) {
    if (!expected(b)) continue;
    SCOPED_TRACE(b);
    EXPECT_NE(c.output.find(std::string("ok ") + b + ":0"), std::string::npos) << c.output;
    EXPECT_GE(c.at(std::string("backend ") + b + " destroyed"), 0) << c.output;
    if (std::string(b) != "cpu") {  // the GPU-kernel devices: opened and closed before main ends
      EXPECT_LT(c.at(std::string(b) + ":0 closed"), c.at("main returned")) << c.output;
    }
  }
  if (expected("vulkan")) expect_vulkan_closed_in_order(c, true);
}

// A process that skips shutdown_backends() leaves the backends to the OS: the instance is never
// destroyed (no static destructor does it), and the process still exits 0.
TEST(Teardown, WithoutShutdownNothingIsDestroyedAtExit) {
  const Child c = run(std::string(CT_TEARDOWN_PROBE_BIN) + " --no-shutdown");
  expect_clean_end(c);
  EXPECT_EQ(c.at("vulkan instance destroyed"), -1) << c.output;
  for (const std::string& line : c.trace)
    EXPECT_EQ(line.find("backend "), std::string::npos) << c.output;
  if (expected("vulkan")) {
    EXPECT_LT(c.at("vulkan:0 closed"), c.at("main returned")) << c.output;
  }
}

TEST(Teardown, DevicesCommandExitsCleanly) {
  const Child c = run(std::string(CT_CROSSTRAIN_BIN) + " devices");
  expect_clean_end(c);
  if (expected("vulkan")) expect_vulkan_closed_in_order(c, false);
}

TEST(Teardown, TrainOnVulkanExitsCleanly) {
  if (!expected("vulkan")) GTEST_SKIP() << "this build has no Vulkan backend";
  const fs::path out =
      fs::temp_directory_path() / ("crosstrain_teardown_" + std::to_string(getpid()));
  fs::remove_all(out);
  const Child c = run(
      std::string(CT_CROSSTRAIN_BIN) +
      " train --backend vulkan --no-progress --n-layer 1 --n-head 2 --n-embd 16"
      " --block-size 16 --per-device-train-batch-size 1 --max-steps 2 --sample-tokens 0 --data " +
      ct::test::data_dir() + "/text/harbour.txt --output-dir " + out.string());
  expect_clean_end(c);
  expect_vulkan_closed_in_order(c, true);
  fs::remove_all(out);
}

}  // namespace
