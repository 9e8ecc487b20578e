// Memory on every device under test: per-category accounting of the bytes asked for, buffers
// freed with their last view, peaks, and an out-of-memory error that names the request and its
// category and leaves the accounting as it was.
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

using DeviceMemory = DeviceTest;

TEST_P(DeviceMemory, AccountsPerCategoryAndFreesWithTheLastView) {
  Device& d = dev();
  const int w = static_cast<int>(MemCategory::kWeights), g = static_cast<int>(MemCategory::kGrads);
  MemoryStats before = d.memory();
  d.reset_memory_peaks();
  {
    Tensor a = d.empty({1000}, DType::f32, MemCategory::kWeights);
    Tensor b = d.empty({10, 10}, DType::bf16, MemCategory::kGrads);
    MemoryStats s = d.memory();
    EXPECT_EQ(s.current[w] - before.current[w], 4000);
    EXPECT_EQ(s.current[g] - before.current[g], 200);
    Tensor view = a.slice_flat(10, {5});
    a = Tensor{};
    EXPECT_EQ(d.memory().current[w] - before.current[w], 4000);  // the view keeps the buffer
    view = Tensor{};
    EXPECT_EQ(d.memory().current[w], before.current[w]);
    EXPECT_GE(d.memory().peak[w] - before.current[w], 4000);
  }
  EXPECT_EQ(d.memory().total_current, before.total_current);
  // A buffer of the same size again (a caching allocator serves it from its cache): accounted
  // the same, and it holds what is written to it.
  for (int round = 0; round < 3; ++round) {
    Tensor t = d.empty({1000}, DType::f32, MemCategory::kActivations);
    EXPECT_EQ(d.memory().total_current - before.total_current, 4000);
    Vec v = randn(1000, 7 + round);
    d.upload(t, v.data(), v.size() * sizeof(float));
    EXPECT_EQ(download(d, t), v);
  }
  EXPECT_EQ(d.memory().total_current, before.total_current);
}

TEST_P(DeviceMemory, OutOfMemoryNamesTheRequestAndKeepsTheAccounting) {
  Device& d = dev();
  const MemoryStats before = d.memory();
  size_t huge = size_t{1} << 50;  // 1 PiB
  if (d.info().max_allocation_bytes > 0 &&
      static_cast<size_t>(d.info().max_allocation_bytes) >= huge)
    huge = static_cast<size_t>(d.info().max_allocation_bytes) + (size_t{1} << 20);
  try {
    d.allocate(huge, MemCategory::kActivations);
    ADD_FAILURE() << "no error for " << huge << " bytes";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(huge)), std::string::npos) << m;
    EXPECT_NE(m.find("activations"), std::string::npos) << m;
    EXPECT_TRUE(m.find("free") != std::string::npos || m.find("available") != std::string::npos)
        << m;
  }
  EXPECT_EQ(d.memory().total_current, before.total_current);
  // The device still works.
  Tensor t = d.empty({3}, DType::f32, MemCategory::kActivations);
  d.fill(t, 2.5f);
  EXPECT_EQ(download(d, t), Vec(3, 2.5f));
}

CT_INSTANTIATE_DEVICE_SUITE(DeviceMemory);

}  // namespace
}  // namespace ct::test
