// For the Vulkan backend's own tests (what no other backend has: its device list and limits, the
// GEMM variants forced one by one, device loss, the pipeline cache): vulkan:0 beside the CPU
// reference, on the conformance harness (tests/common/device_harness.h). Every op's conformance
// runs in tests/ops on every device; this fixture is not for op tests.
#pragma once

#include "tests/common/device_harness.h"

namespace ct::vktest {

using namespace ::ct::test;  // NOLINT: the harness is this suite's vocabulary

inline const bool kPinnedToLavapipe = prepare_environment();

inline const BackendEntry* vulkan_entry() {
  return backend_entry("vulkan");
}

// Why there is no usable Vulkan device, or "" if there is one.
inline std::string vulkan_missing() {
  for (const DeviceCase& c : devices_under_test())
    if (c.backend == "vulkan") return c.index < 0 ? c.why : "";
  return "libcrosstrain_backend_vulkan.so was not found beside the test binary";
}

inline uint64_t validation_messages() {
  return ::ct::test::validation_messages("vulkan");
}

inline Device& vk() {
  return open_cached("vulkan:0");
}

// Fails (never skips) without a Vulkan device; fails on any validation message.
class VulkanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = vulkan_missing();
    ASSERT_TRUE(why.empty()) << why;
    current_device() = &vk();  // both(), same(): vulkan:0 against the reference
    messages_before_ = validation_messages();
  }
  void TearDown() override {
    if (!vulkan_missing().empty()) return;
    EXPECT_NO_THROW(vk().synchronize());
    EXPECT_EQ(validation_messages(), messages_before_) << "Vulkan validation layer messages";
    current_device() = nullptr;
  }
  uint64_t messages_before_ = 0;
};

// Seeded inputs (Philox streams 41, 43, 47 of `seed`: the inputs these tests were measured on).
inline Vec randn(size_t n, uint64_t seed, float scale = 1.0f) {
  return testdata::randn(n, seed, scale, 41);
}
inline Vec uniform(size_t n, uint64_t seed, float lo, float hi) {
  return testdata::uniform(n, seed, lo, hi, 43);
}
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi) {
  return testdata::randint(n, seed, hi, 47);
}

inline Tensor up(Device& d, const Shape& s, const Vec& v) {
  return upload(d, s, v);
}
inline Vec down(Device& d, const Tensor& t) {
  return download(d, t);
}

}  // namespace ct::vktest
