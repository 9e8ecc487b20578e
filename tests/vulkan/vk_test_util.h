// The Vulkan test harness: the Vulkan device (loaded through the registry, as crosstrain does),
// the CPU reference device as the oracle, and the normalised-MSE comparison.
//
// Tolerances (normalised MSE, sum((got-want)^2) / sum(want^2)): 1e-7 by default, 5e-4 for
// matmul and attention; a NaN on one side only, or an inf the other side lacks, fails.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/device.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/registry.h"
#include "tests/common/test_data.h"

namespace ct::vktest {

inline constexpr double kTol = 1e-7;
inline constexpr double kTolGemm = 5e-4;

using Vec = std::vector<float>;

// Pins the Vulkan loader to lavapipe before anything opens Vulkan (CT_VK_LAVAPIPE_ICD, found at
// configure time), unless the environment already chose a driver. True when pinned here.
inline bool pin_lavapipe() {
#ifdef CT_VK_LAVAPIPE_ICD
  if (std::getenv("VK_DRIVER_FILES") || std::getenv("VK_ICD_FILENAMES")) return false;
  setenv("VK_DRIVER_FILES", CT_VK_LAVAPIPE_ICD, 1);
  setenv("VK_ICD_FILENAMES", CT_VK_LAVAPIPE_ICD, 1);  // loaders before 1.3.207
  return true;
#else
  return false;
#endif
}
inline const bool kPinnedToLavapipe = pin_lavapipe();

inline const BackendEntry* vulkan_entry() {
  for (const auto& e : backends())
    if (e.name == "vulkan") return &e;
  return nullptr;
}

// Why there is no usable Vulkan device, or "" if there is one.
inline std::string vulkan_missing() {
  const BackendEntry* e = vulkan_entry();
  std::string hint =
      " -- these tests need a Vulkan device; on a machine without a GPU install lavapipe "
      "(Debian: mesa-vulkan-drivers) and the loader (libvulkan1)";
  if (!e) return "libcrosstrain_backend_vulkan.so was not found beside the test binary" + hint;
  if (!e->error.empty()) return "the Vulkan backend is unavailable: " + e->error + hint;
  if (e->backend->devices().empty()) return "the Vulkan backend lists no devices" + hint;
  return "";
}

// Messages counted by the backend's debug-utils messenger (CROSSTRAIN_VK_VALIDATION=1).
inline uint64_t validation_messages() {
  const BackendEntry* e = vulkan_entry();
  if (!e) return 0;
  void* h = dlopen(e->path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return 0;
  auto fn = reinterpret_cast<uint64_t (*)()>(dlsym(h, "crosstrain_vk_validation_messages"));
  uint64_t n = fn ? fn() : 0;
  dlclose(h);
  return n;
}

inline Device& vk() {
  static std::unique_ptr<Device> d = open_device("vulkan");
  return *d;
}
inline Device& ref() {
  static std::unique_ptr<Device> d = make_cpu_device(true);
  return *d;
}

// Fails (never skips) without a Vulkan device; fails on any validation message.
class VulkanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = vulkan_missing();
    ASSERT_TRUE(why.empty()) << why;
    messages_before_ = validation_messages();
  }
  void TearDown() override {
    if (!vulkan_missing().empty()) return;
    EXPECT_NO_THROW(vk().synchronize());
    EXPECT_EQ(validation_messages(), messages_before_) << "Vulkan validation layer messages";
  }
  uint64_t messages_before_ = 0;
};

inline Tensor up(Device& d, const Shape& s, const Vec& v) {
  Tensor t = d.empty(s, DType::f32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(float));
  return t;
}
inline Tensor up_i32(Device& d, const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = d.empty(s, DType::i32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}
inline Vec down(Device& d, const Tensor& t) { return testdata::download_as<float>(d, t); }
template <class T>
std::vector<T> down_as(Device& d, const Tensor& t) {
  return testdata::download_as<T>(d, t);
}

// Seeded inputs (Philox streams 41, 43, 47 of `seed`).
inline Vec randn(size_t n, uint64_t seed, float scale = 1.0f) { return testdata::randn(n, seed, scale, 41); }
inline Vec uniform(size_t n, uint64_t seed, float lo, float hi) {
  return testdata::uniform(n, seed, lo, hi, 43);
}
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi) {
  return testdata::randint(n, seed, hi, 47);
}

inline ::testing::AssertionResult close_nmse(const Vec& got, const Vec& want, double tol,
                                             const std::string& what = "") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << want.size();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    if (std::isnan(g) != std::isnan(w) || ((std::isinf(g) || std::isinf(w)) && g != w))
      return ::testing::AssertionFailure()
             << what << ": non-finite mismatch at " << i << ": got " << g << ", want " << w;
    if (std::isnan(g) || std::isinf(g)) continue;
    num += (g - w) * (g - w);
    den += w * w;
  }
  double e = den > 0 ? num / den : num;
  if (std::getenv("CT_PRINT_NMSE"))
    std::printf("  nmse %-50s %.3g (tol %.0e)\n", what.c_str(), e, tol);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": normalised MSE " << e << " > " << tol;
}

// The same host data on both devices.
struct Pair {
  Tensor v, r;  // Vulkan, reference
};
inline Pair both(const Shape& s, const Vec& data) { return {up(vk(), s, data), up(ref(), s, data)}; }
inline Pair both_i32(const Shape& s, const std::vector<int32_t>& data) {
  return {up_i32(vk(), s, data), up_i32(ref(), s, data)};
}
inline Pair both_empty(const Shape& s, DType dt = DType::f32) {
  return {vk().empty(s, dt, MemCategory::kActivations), ref().empty(s, dt, MemCategory::kActivations)};
}
inline ::testing::AssertionResult same(const Pair& p, double tol, const std::string& what) {
  return close_nmse(down(vk(), p.v), down(ref(), p.r), tol, what);
}

}  // namespace ct::vktest
