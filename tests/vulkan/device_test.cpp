// Instance, device listing, memory accounting and errors of the Vulkan backend.
#include <functional>

#include "core/optim/quant_map.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace ct::vktest {
namespace {

using DeviceTest = VulkanTest;

TEST_F(DeviceTest, ListsDevicesWithCapabilities) {
  auto devs = vulkan_entry()->backend->devices();
  ASSERT_FALSE(devs.empty());
  const DeviceInfo& d = devs[0];
  EXPECT_EQ(d.backend, "vulkan");
  EXPECT_EQ(d.id(), "vulkan:0");
  EXPECT_FALSE(d.name.empty());
  EXPECT_FALSE(d.driver.empty());
  EXPECT_GT(d.memory_bytes, 0);
  EXPECT_GT(d.max_allocation_bytes, 0);
  EXPECT_GT(d.max_buffer_range_bytes, 0);
  bool has_range = false;
  for (auto& [k, v] : d.extra) has_range |= k == "maxStorageBufferRange";
  EXPECT_TRUE(has_range);
  EXPECT_TRUE(vk().supports(OpKind::kMatmul, DType::f32));
}

TEST_F(DeviceTest, IndexOutOfRangeListsDevices) {
  try {
    open_device("vulkan:99");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("vulkan:0"), std::string::npos) << e.what();
  }
}

TEST_F(DeviceTest, UploadDownloadRoundTripAndAccounting) {
  auto before = vk().memory();
  Vec data = randn(1001, 1);
  {
    Tensor t = vk().empty({7, 143}, DType::f32, MemCategory::kWeights);
    vk().upload(t, data.data(), data.size() * 4);
    EXPECT_EQ(down(vk(), t), data);
    auto m = vk().memory();
    EXPECT_EQ(m.current[0] - before.current[0], 1001 * 4);
    // a view at an odd element offset
    Tensor v = t.slice_flat(3, {5});
    Vec part = down(vk(), v);
    EXPECT_EQ(part, Vec(data.begin() + 3, data.begin() + 8));
  }
  EXPECT_EQ(vk().memory().current[0], before.current[0]);
}

TEST_F(DeviceTest, OutOfMemoryNamesSizeAndLimit) {
  size_t huge = static_cast<size_t>(vk().info().max_allocation_bytes) + (1u << 20);
  try {
    vk().allocate(huge, MemCategory::kActivations);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    std::string w = e.what();
    EXPECT_NE(w.find(std::to_string(huge)), std::string::npos) << w;
    EXPECT_NE(w.find("maxMemoryAllocationSize"), std::string::npos) << w;
    EXPECT_NE(w.find("free"), std::string::npos) << w;
  }
}

TEST_F(DeviceTest, ManySmallBuffersShareBlocks) {
  std::vector<Tensor> ts;
  for (int i = 0; i < 300; ++i)
    ts.push_back(vk().empty({i + 1}, DType::f32, MemCategory::kWorkspace));
  for (int i = 0; i < 300; i += 37) vk().fill(ts[i], static_cast<float>(i));
  for (int i = 0; i < 300; i += 37) EXPECT_EQ(down(vk(), ts[i])[i], static_cast<float>(i));
}

TEST_F(DeviceTest, ValidationLayerIsOnUnderCtest) {
  const char* v = std::getenv("CROSSTRAIN_VK_VALIDATION");
  if (!v)
    GTEST_SKIP() << "CROSSTRAIN_VK_VALIDATION not set (ctest sets it when CT_VK_VALIDATION=ON)";
  bool found = false;
  // The backend's messenger is active: the extra symbol exists and counts from zero.
  EXPECT_EQ(validation_messages(), 0u);
  found = true;
  EXPECT_TRUE(found);
}

TEST_F(DeviceTest, PinnedToLavapipe) {
  if (!kPinnedToLavapipe) GTEST_SKIP() << "the environment chose the Vulkan driver";
  EXPECT_NE(vk().info().name.find("llvmpipe"), std::string::npos) << vk().info().name;
}

// CROSSTRAIN_VK_INJECT_DEVICE_LOST=N makes the Nth queue submit report VK_ERROR_DEVICE_LOST.
TEST_F(DeviceTest, DeviceLostStopsAllSubmits) {
  setenv("CROSSTRAIN_VK_INJECT_DEVICE_LOST", "2", 1);
  std::unique_ptr<Device> d = open_device("vulkan");
  unsetenv("CROSSTRAIN_VK_INJECT_DEVICE_LOST");
  Tensor t = d->empty({64}, DType::f32, MemCategory::kWorkspace);
  d->fill(t, 1.0f);
  d->flush();  // submit 1
  d->fill(t, 2.0f);
  auto lost = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kDevice &&
             std::string(e.what()).find("Vulkan device lost") != std::string::npos &&
             std::string(e.what()).find("no further work is submitted") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(lost([&] { d->flush(); }));        // submit 2: lost
  EXPECT_TRUE(lost([&] { d->fill(t, 3.0f); }));  // nothing more is recorded ...
  EXPECT_TRUE(lost([&] { d->synchronize(); }));  // ... or submitted
  std::vector<float> h(64);
  EXPECT_TRUE(lost([&] { d->download(h.data(), t, 256); }));
  t = Tensor();
  d.reset();  // and the device closes cleanly
}

TEST_F(DeviceTest, Supports) {
  EXPECT_TRUE(vk().supports(OpKind::kSgd, DType::f32));
  EXPECT_TRUE(vk().supports(OpKind::kLion, DType::f32));
  EXPECT_TRUE(vk().supports(OpKind::kAdamW8bit, DType::f32));
  EXPECT_TRUE(vk().supports(OpKind::kAdafactor, DType::f32));
  EXPECT_FALSE(vk().supports(OpKind::kSgd, DType::f16));
}

TEST_F(DeviceTest, ArgumentChecks) {
  Tensor p = up(vk(), {12}, Vec(12, 1.0f)), g = up(vk(), {12}, Vec(12, 0.1f));
  SgdHyper s;
  s.momentum = 0.9f;
  EXPECT_THROW(vk().sgd(p, g, Tensor{}, Tensor{}, s), Error);  // momentum needs a buffer
  s.max_grad_norm = 1.0f;
  EXPECT_THROW(vk().sgd(p, g, g, Tensor{}, s), Error);  // clipping needs grad_norm
  Tensor one = up(vk(), {1}, {0.0f}), q256 = up(vk(), {256}, Vec(256, 0.0f));
  AdamWHyper a;
  EXPECT_THROW(vk().adamw_8bit(p, g, g, g, one, one, q256, q256, Tensor{}, a), Error);  // u8 q
  Tensor q = vk().empty({12}, DType::u8, MemCategory::kOptimizer);
  vk().fill(q, 0.0f);
  EXPECT_THROW(vk().adamw_8bit(p, g, q, q, q256, one, q256, q256, Tensor{}, a), Error);  // absmax
}

}  // namespace
}  // namespace ct::vktest
