// --profile's device time per op on the GPU device class (CUDA, HIP, the SIMT runtime): every
// public op is one scope (core/op_checks.cpp's Check calls Device::op_begin/op_end), counted
// under its name once per call, an op that calls other ops counted once, and a failed op's
// scope closed too. The CPU and Vulkan devices report in their own ways (Vulkan: timestamps per
// shader, tests/vulkan); their reports are not checked here.
#include <string>

#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

class OpProfile : public DeviceTest {
 protected:
  bool gpu_class() const {
    const std::string b = dev().info().backend;
    return b == "simt" || b == "simt64" || b == "cuda" || b == "hip";
  }
};

// The calls column of op's row in the time table ("  matmul   3   0.12 ..."), -1 if none.
long long calls_of(const std::string& report, const std::string& op) {
  const std::string table = report.substr(0, report.find("kernel path per op"));
  const std::string key = "\n  " + op + " ";
  const auto at = table.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(table.substr(at + key.size()));
}

TEST_P(OpProfile, CountsEachPublicOpOnce) {
  if (!gpu_class()) GTEST_SKIP() << dut_id() << " reports its profile in its own form";
  Device& d = dev();
  d.set_profiling(false);
  d.set_profiling(true);
  const Shape s{8, 16};
  Tensor a = upload(d, s, randn(128, 1)), b = upload(d, s, randn(128, 2));
  Tensor w = upload(d, Shape{16, 16}, randn(256, 3)),
         c = d.empty(s, DType::f32, MemCategory::kActivations);
  for (int i = 0; i < 3; ++i) d.matmul(c, a, w, false, false, 1.0f, 0.0f, nullptr);
  d.add(c, a, b);
  // A failed op: its scope is closed (the next ops are still counted on their own).
  EXPECT_THROW(d.add(c, a, w), Error);
  d.add(c, c, b);
  const std::string report = d.profile_report();
  d.set_profiling(false);
  EXPECT_NE(report.find("device time per op"), std::string::npos) << report;
  EXPECT_EQ(calls_of(report, "matmul"), 3) << report;
  EXPECT_EQ(calls_of(report, "add"), 3) << report;  // two that ran, one refused by its checks
  EXPECT_EQ(calls_of(report, "upload"), 3) << report;
  EXPECT_NE(report.find("% of the"), std::string::npos) << report;
  // A fresh profile starts from nothing.
  d.set_profiling(true);
  d.add(c, a, b);
  const std::string again = d.profile_report();
  d.set_profiling(false);
  EXPECT_EQ(calls_of(again, "add"), 1) << again;
  EXPECT_EQ(calls_of(again, "matmul"), -1) << again;
}

CT_INSTANTIATE_DEVICE_SUITE(OpProfile);

}  // namespace
}  // namespace ct::test
