// Memory accounting per category, out-of-memory errors, workspace accounting, device info.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/device.h"
#include "core/error.h"
#include "core/registry.h"

namespace ct {
namespace {

TEST(Memory, AccountsPerCategoryAndFreesWithTheLastView) {
  for (bool reference : {false, true}) {
    auto d = make_cpu_device(reference);
    auto w = static_cast<int>(MemCategory::kWeights), g = static_cast<int>(MemCategory::kGrads);
    {
      Tensor a = d->empty({1000}, DType::f32, MemCategory::kWeights);
      Tensor b = d->empty({10, 10}, DType::bf16, MemCategory::kGrads);
      MemoryStats s = d->memory();
      EXPECT_EQ(s.current[w], 4000);
      EXPECT_EQ(s.current[g], 200);
      EXPECT_EQ(s.total_current, 4200);
      Tensor view = a.slice_flat(10, {5});
      a = Tensor{};
      EXPECT_EQ(d->memory().current[w], 4000);  // the view keeps the buffer
      view = Tensor{};
      EXPECT_EQ(d->memory().current[w], 0);
      EXPECT_EQ(d->memory().peak[w], 4000);
    }
    MemoryStats s = d->memory();
    EXPECT_EQ(s.total_current, 0);
    EXPECT_EQ(s.total_peak, 4200);
    d->reset_memory_peaks();
    EXPECT_EQ(d->memory().total_peak, 0);
  }
}

TEST(Memory, OutOfMemoryNamesSizeAndLimit) {
  auto d = make_cpu_device(false);
  size_t huge = size_t{1} << 50;  // 1 PiB
  try {
    d->allocate(huge, MemCategory::kActivations);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    std::string m = e.what();
    EXPECT_NE(m.find(std::to_string(huge)), std::string::npos) << m;
    EXPECT_NE(m.find("available"), std::string::npos) << m;
    EXPECT_NE(m.find("activations"), std::string::npos) << m;
  }
  EXPECT_EQ(d->memory().total_current, 0);
}

TEST(Memory, BuffersAreAligned) {
  auto d = make_cpu_device(false);
  // Alignment is visible through a cblas-free path: upload/download of odd sizes work and the
  // accounting counts requested bytes, not the rounded ones.
  Tensor t = d->empty({3}, DType::u8, MemCategory::kActivations);
  EXPECT_EQ(d->memory().total_current, 3);
  uint8_t in[3] = {1, 2, 3}, out[3] = {};
  d->upload(t, in, 3);
  d->download(out, t, 3);
  EXPECT_EQ(out[2], 3);
  EXPECT_THROW(d->upload(t, in, 4), Error);
}

TEST(Memory, WorkspaceIsAccountedAndReused) {
  auto d = make_cpu_device(false);
  const int64_t B = 1, T = 64, C = 32, NH = 2;
  Tensor qkv = d->empty({B, T, 3 * C}, DType::f32, MemCategory::kActivations);
  Tensor out = d->empty({B, T, C}, DType::f32, MemCategory::kActivations);
  Tensor att = d->empty({B, NH, T, T}, DType::f32, MemCategory::kActivations);
  Tensor dqkv = d->empty({B, T, 3 * C}, DType::f32, MemCategory::kGrads);
  d->fill(qkv, 0.1f);
  d->fill(out, 1.0f);
  d->attention_forward(out, att, qkv, NH);
  d->attention_backward(dqkv, out, qkv, att, NH);
  int ws = static_cast<int>(MemCategory::kWorkspace);
  int64_t after_one = d->memory().current[ws];
  EXPECT_GE(after_one, T * T * 4);  // one (T,T) scratch per thread
  d->attention_backward(dqkv, out, qkv, att, NH);
  EXPECT_EQ(d->memory().current[ws], after_one);  // cached, not reallocated
}

TEST(Devices, CpuBackendListsFastAndReference) {
  auto be = make_cpu_backend();
  EXPECT_EQ(be->name(), "cpu");
  EXPECT_EQ(be->unavailable_reason(), "");
  auto devs = be->devices();
  ASSERT_EQ(devs.size(), 2u);
  EXPECT_EQ(devs[0].id(), "cpu:0");
  EXPECT_EQ(devs[1].id(), "cpu:1");
  EXPECT_EQ(devs[0].name, "CPU (OpenBLAS + OpenMP)");
  EXPECT_GT(devs[0].memory_bytes, 0);
  bool has_processor = false, has_isa = false, has_threads = false;
  for (auto& [k, v] : devs[0].extra) {
    has_processor |= k == "processor" && !v.empty();
    has_isa |= k == "isa";
    has_threads |= k == "threads" && std::stoi(v) >= 1;
  }
  EXPECT_TRUE(has_processor && has_isa && has_threads);
  auto d = be->open(1);
  EXPECT_EQ(d->info().index, 1);
  EXPECT_THROW(be->open(2), Error);
}

TEST(Devices, RegistryOpensCpu) {
  auto d = open_device("cpu");
  EXPECT_EQ(d->info().id(), "cpu:0");
  EXPECT_EQ(open_device("cpu:1")->info().id(), "cpu:1");
  EXPECT_THROW(open_device("cpu:7"), Error);
}

}  // namespace
}  // namespace ct
