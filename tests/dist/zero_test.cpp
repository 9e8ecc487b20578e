// ZeRO stage 1 in one process: the partition rule (zero_partition), and every optimizer over one
// rank's shard making, on that shard, bitwise the update the unsharded optimizer makes, with the
// state bytes split between the ranks. The runs through mpirun are in data_parallel_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "core/model/gpt2.h"
#include "core/train/optimizer.h"

namespace ct {
namespace {

ParamInfo row(const char* name, int64_t offset, int64_t numel) {
  ParamInfo p;
  p.name = name;
  p.shape = Shape{numel};
  p.offset = offset;
  p.numel = numel;
  return p;
}

// Rows a [0, 1000), b [1000, 1300), padding [1300, 1400), c [1400, 5000).
const std::vector<ParamInfo> kTable = {row("a", 0, 1000), row("b", 1000, 300),
                                       row("c", 1400, 3600)};

TEST(ZeroPartition, CutsAtBlocksOfARowOrOutsideRows) {
  using V = std::vector<int64_t>;
  // 2500 is 1100 into c: blocks of 256 from c's start give 2424 and 2680; 2424 is nearer.
  EXPECT_EQ(zero_partition(kTable, 5000, OptimKind::kAdamW, 2), (V{0, 2424, 5000}));
  EXPECT_EQ(zero_partition(kTable, 5000, OptimKind::kAdamW8bit, 2), (V{0, 2424, 5000}));
  // 1250 is in b, whose last block ends at its end, 1300; 3750 -> 3704.
  EXPECT_EQ(zero_partition(kTable, 5000, OptimKind::kAdamW, 4), (V{0, 1256, 2424, 3704, 5000}));
  // Adafactor: only a row's ends.
  EXPECT_EQ(zero_partition(kTable, 5000, OptimKind::kAdafactor, 2), (V{0, 1400, 5000}));
  EXPECT_EQ(zero_partition(kTable, 5000, OptimKind::kAdafactor, 4), (V{0, 1300, 1400, 5000, 5000}));
  // Outside every row (the padding) anywhere: 1350 of 2700.
  EXPECT_EQ(zero_partition(kTable, 2700, OptimKind::kAdamW, 2), (V{0, 1350, 2700}));
  EXPECT_EQ(zero_partition(kTable, 5000, OptimKind::kSgd, 1), (V{0, 5000}));
  // One large tensor and more ranks than cuts: shards may be empty, never negative.
  const std::vector<ParamInfo> big = {row("small", 0, 10), row("big", 10, 990)};
  EXPECT_EQ(zero_partition(big, 1000, OptimKind::kAdafactor, 4), (V{0, 10, 10, 1000, 1000}));
}

GPT2Config small_config() {
  GPT2Config c = GPT2Config::preset("tiny");
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.block_size = 64;
  return c;
}

std::vector<float> download(Device& dev, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  dev.download(v.data(), t, v.size() * sizeof(float));
  return v;
}

// `world` ranks' optimizers over their shards, each on its own copy of the model, given the same
// gradients as the unsharded optimizer for 3 steps (clipped: their norm is above 1): each
// shard's weights are bitwise the unsharded optimizer's there, the rest of each copy is
// untouched, and the state bytes add up to the unsharded optimizer's (8-bit AdamW: plus a code
// table pair per rank).
void expect_shards_update_as_the_whole(OptimKind kind, bool offload, int world) {
  SCOPED_TRACE(std::string(optim_name(kind)) + (offload ? " offloaded" : "") + " over " +
               std::to_string(world) + " ranks");
  std::unique_ptr<Device> dev = make_cpu_device(false);
  OptimizerSettings s;
  s.kind = kind;
  s.weight_decay = 0.1;
  s.max_grad_norm = 1.0;
  s.momentum = 0.9;
  s.adafactor_beta1 = 0.9;
  s.offload = offload;
  GPT2 whole(*dev, small_config(), true);
  whole.init(7);
  const int64_t n = whole.trainable_flat().numel();
  const std::vector<int64_t> bounds = zero_partition(whole.trainable_params(), n, kind, world);
  std::unique_ptr<Optimizer> whole_opt = make_optimizer(whole, s);
  std::vector<std::unique_ptr<GPT2>> copies;
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (int r = 0; r < world; ++r) {
    copies.push_back(std::make_unique<GPT2>(*dev, small_config(), true));
    copies.back()->init(7);
    OptimizerSettings sr = s;
    sr.shard = {bounds[static_cast<size_t>(r)], bounds[static_cast<size_t>(r) + 1]};
    opts.push_back(make_optimizer(*copies.back(), sr));
  }
  const std::vector<float> init = download(*dev, whole.trainable_flat());
  Tensor norm = dev->empty({1}, DType::f32, MemCategory::kWorkspace);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t step = 1; step <= 3; ++step) {
    for (float& x : g) x = normal(rng);
    dev->upload(whole.trainable_grads(), g.data(), g.size() * sizeof(float));
    dev->norm(norm, whole.trainable_grads());
    whole_opt->step(whole, norm, 1e-2, step);
    for (int r = 0; r < world; ++r) {
      dev->upload(copies[r]->trainable_grads(), g.data(), g.size() * sizeof(float));
      opts[r]->step(*copies[r], norm, 1e-2, step);
    }
  }
  const std::vector<float> want = download(*dev, whole.trainable_flat());
  EXPECT_NE(std::memcmp(want.data(), init.data(), want.size() * sizeof(float)), 0);
  int64_t bytes = 0;
  for (int r = 0; r < world; ++r) {
    const std::vector<float> got = download(*dev, copies[r]->trainable_flat());
    const auto b = static_cast<size_t>(bounds[r]), e = static_cast<size_t>(bounds[r + 1]);
    for (size_t i = 0; i < got.size(); ++i) {
      const float expected = i >= b && i < e ? want[i] : init[i];
      if (std::memcmp(&got[i], &expected, sizeof(float)) != 0) {
        ADD_FAILURE() << "rank " << r << " [" << b << ", " << e << "): element " << i << " is "
                      << got[i] << ", expected " << expected;
        break;
      }
    }
    bytes += opts[r]->state_bytes();
  }
  if (kind == OptimKind::kAdamW8bit) {
    EXPECT_GE(bytes, whole_opt->state_bytes());
    EXPECT_LE(bytes, whole_opt->state_bytes() + (world - 1) * 2 * 256 * 4);
  } else {
    EXPECT_EQ(bytes, whole_opt->state_bytes());
  }
}

TEST(ZeroShards, EveryOptimizerUpdatesItsShardAsTheWhole) {
  for (OptimKind k : {OptimKind::kAdamW, OptimKind::kAdamW8bit, OptimKind::kAdafactor,
                      OptimKind::kLion, OptimKind::kSgd})
    for (int world : {2, 3}) expect_shards_update_as_the_whole(k, false, world);
}

TEST(ZeroShards, OffloadedOptimizersToo) {
  for (OptimKind k : {OptimKind::kAdamW, OptimKind::kAdamW8bit})
    expect_shards_update_as_the_whole(k, true, 2);
}

// A tensor cut by a shard bound keeps its state in 1-D parts named by their element ranges.
TEST(ZeroShards, StateOfACutTensorIsNamedByItsRange) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  GPT2 model(*dev, small_config(), true);
  const ParamInfo& wte = model.trainable_params().front();
  OptimizerSettings s;
  s.shard = {0, wte.offset + 256};
  std::unique_ptr<Optimizer> opt = make_optimizer(model, s);
  ASSERT_EQ(opt->state().size(), 2u);
  EXPECT_EQ(opt->state()[0].name, "exp_avg." + wte.name + "[0:256]");
  EXPECT_EQ(opt->state()[0].tensor.shape, Shape{256});
  EXPECT_EQ(opt->state_bytes(), 2 * 256 * 4);
}

}  // namespace
}  // namespace ct
