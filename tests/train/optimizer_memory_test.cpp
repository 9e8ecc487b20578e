// Optimizer state bytes per parameter, asserted against the formulas (AdamW 8, 8-bit AdamW about
// 2 plus block scales, Adafactor 4 (R + C) per matrix), in the device accounting and in
// state_bytes(); offloading moves them off the device; --optim names and aliases.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/train/optimizer.h"

namespace ct {
namespace {

GPT2Config small_config() {
  GPT2Config c = GPT2Config::preset("tiny");
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 64;
  c.block_size = 64;
  return c;
}

int64_t expected_bytes(const GPT2& m, OptimKind k) {
  int64_t b = 0;
  for (const ParamInfo& p : m.params()) {
    const int64_t C = p.shape[p.shape.ndim - 1], R = p.numel / C;
    switch (k) {
      case OptimKind::kAdamW:
        b += 8 * p.numel;
        break;
      case OptimKind::kAdamW8bit:
        b += p.numel >= 4096 ? 2 * p.numel + 8 * quant_blocks(p.numel) : 8 * p.numel;
        break;
      case OptimKind::kAdafactor:
        b += p.shape.ndim >= 2 ? 4 * (R + C) : 4 * p.numel;
        break;
      case OptimKind::kLion:
      case OptimKind::kSgd:
        b += 4 * p.numel;
        break;
    }
  }
  if (k == OptimKind::kAdamW8bit) b += 2 * 256 * 4;  // the two code tables
  return b;
}

TEST(OptimizerMemory, BytesPerParameterMatchTheFormulas) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  GPT2 model(*dev, small_config(), true);
  const double n = static_cast<double>(model.num_parameters());
  for (OptimKind k : {OptimKind::kAdamW, OptimKind::kAdamW8bit, OptimKind::kAdafactor,
                      OptimKind::kLion, OptimKind::kSgd}) {
    OptimizerSettings s;
    s.kind = k;
    s.momentum = 0.9;
    const int64_t before = dev->memory().current[static_cast<int>(MemCategory::kOptimizer)];
    std::unique_ptr<Optimizer> opt = make_optimizer(model, s);
    const int64_t accounted =
        dev->memory().current[static_cast<int>(MemCategory::kOptimizer)] - before;
    EXPECT_EQ(accounted, expected_bytes(model, k)) << optim_name(k);
    EXPECT_EQ(opt->state_bytes(), accounted) << optim_name(k);
    std::printf("  %-10s %.3f optimizer bytes / parameter (%lld parameters)\n", optim_name(k),
                static_cast<double>(accounted) / n, static_cast<long long>(model.num_parameters()));
  }
  // The headline ratios on a model whose tensors are almost all large.
  GPT2Config big = GPT2Config::preset("tiny");  // 10.8 M parameters
  GPT2 tiny(*dev, big, true);
  OptimizerSettings s;
  s.kind = OptimKind::kAdamW8bit;
  const double bpp8 = static_cast<double>(make_optimizer(tiny, s)->state_bytes()) /
                      static_cast<double>(tiny.num_parameters());
  s.kind = OptimKind::kAdafactor;
  const double bppf = static_cast<double>(make_optimizer(tiny, s)->state_bytes()) /
                      static_cast<double>(tiny.num_parameters());
  std::printf("  tiny: adamw_8bit %.4f, adafactor %.4f bytes / parameter\n", bpp8, bppf);
  EXPECT_GE(bpp8, 2.0 + 8.0 / 256.0);  // plus the small tensors kept in fp32
  EXPECT_LT(bpp8, 2.06);
  EXPECT_LT(bppf, 0.05);
}

TEST(OptimizerMemory, OffloadKeepsTheStateOffTheDevice) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  GPT2 model(*dev, small_config(), true);
  OptimizerSettings s;
  s.offload = true;
  const int64_t before = dev->memory().current[static_cast<int>(MemCategory::kOptimizer)];
  std::unique_ptr<Optimizer> opt = make_optimizer(model, s);
  EXPECT_EQ(dev->memory().current[static_cast<int>(MemCategory::kOptimizer)], before);
  EXPECT_TRUE(opt->offloaded());
  EXPECT_EQ(opt->state_bytes(), 8 * model.num_parameters());
  EXPECT_EQ(opt->name(), "adamw");
  for (const NamedTensor& t : opt->state())
    EXPECT_NE(&t.tensor.buffer->device(), dev.get()) << t.name;
}

TEST(OptimizerMemory, NamesAndAliases) {
  EXPECT_EQ(parse_optim("adamw_torch"), OptimKind::kAdamW);
  EXPECT_EQ(parse_optim("adamw_torch_fused"), OptimKind::kAdamW);
  EXPECT_EQ(parse_optim("adamw_apex_fused"), OptimKind::kAdamW);
  EXPECT_EQ(parse_optim("adamw_bnb_8bit"), OptimKind::kAdamW8bit);
  EXPECT_EQ(parse_optim("lion_32bit"), OptimKind::kLion);
  EXPECT_EQ(parse_optim("adafactor"), OptimKind::kAdafactor);
  EXPECT_EQ(parse_optim("sgd"), OptimKind::kSgd);
  try {
    parse_optim("adam");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adamw_8bit"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ct
