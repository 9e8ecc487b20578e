// The 16-bit compute copy of a mixed-precision model after an optimizer step: AdamW writes it in
// its own dispatch (adamw_groups' param16), so updates_compute_copy() says the trainer may skip
// refresh_compute_weights(); the copy it leaves is the refresh's, bit for bit, on the fast and
// the reference CPU devices, and changed with the weights. Every other optimizer, an offloaded
// or ZeRO-sharded AdamW, LoRA and fp32 models leave the refresh to the caller.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/model/gpt2.h"
#include "core/train/optimizer.h"

namespace ct {
namespace {

GPT2Config small_config() {
  GPT2Config c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 200;  // padded to 256 on the device: rows no optimizer range covers
  return c;
}

ModelOptions options(Precision p, int lora_r = 0) {
  ModelOptions o;
  o.policy = PrecisionPolicy::make(p);
  o.lora.r = lora_r;
  return o;
}

std::vector<uint8_t> bytes(Device& d, const Tensor& t) {
  std::vector<uint8_t> v(t.nbytes());
  d.download(v.data(), t, v.size());
  return v;
}

// One forward, backward and optimizer step of `m` on fixed tokens.
void train_step(Device& d, GPT2& m, Optimizer& opt, int64_t step) {
  const int B = 2, T = 8;
  std::vector<int32_t> v(B * T);
  for (int i = 0; i < B * T; ++i) v[i] = (i * 37 + 5) % 200;
  Tensor tokens = d.empty({B, T}, DType::i32, MemCategory::kActivations);
  d.upload(tokens, v.data(), v.size() * sizeof(int32_t));
  m.zero_grad();
  m.forward(tokens, &tokens, B, T);
  m.backward();
  opt.step(m, Tensor(), 1e-2, step);
}

TEST(ComputeCopy, AdamWWritesTheCopyTheRefreshWould) {
  for (bool reference : {false, true})
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      SCOPED_TRACE(std::string(reference ? "reference" : "fast") +
                   (p == Precision::kBf16 ? " bf16" : " fp16"));
      std::unique_ptr<Device> d = make_cpu_device(reference);
      GPT2 m(*d, small_config(), true, options(p));
      m.init(3);
      ASSERT_TRUE(m.trainable_compute().defined());
      OptimizerSettings s;
      s.weight_decay = 0.1;
      std::unique_ptr<Optimizer> opt = make_optimizer(m, s);
      EXPECT_TRUE(opt->updates_compute_copy());
      const std::vector<uint8_t> initial = bytes(*d, m.compute_params_flat());
      for (int64_t step = 1; step <= 2; ++step) {
        train_step(*d, m, *opt, step);
        const std::vector<uint8_t> fused = bytes(*d, m.compute_params_flat());
        m.refresh_compute_weights();
        EXPECT_EQ(fused, bytes(*d, m.compute_params_flat())) << "step " << step;
        EXPECT_NE(fused, initial) << "step " << step;
      }
    }
}

TEST(ComputeCopy, OtherOptimizersAndSetupsLeaveTheRefreshToTheCaller) {
  std::unique_ptr<Device> d = make_cpu_device(false);
  GPT2 bf16(*d, small_config(), true, options(Precision::kBf16));
  for (OptimKind k :
       {OptimKind::kAdamW8bit, OptimKind::kAdafactor, OptimKind::kLion, OptimKind::kSgd}) {
    OptimizerSettings s;
    s.kind = k;
    EXPECT_FALSE(make_optimizer(bf16, s)->updates_compute_copy()) << optim_name(k);
  }
  OptimizerSettings offloaded;
  offloaded.offload = true;
  EXPECT_FALSE(make_optimizer(bf16, offloaded)->updates_compute_copy());
  OptimizerSettings sharded;
  sharded.shard = {0, bf16.trainable_flat().numel() / 2};
  EXPECT_FALSE(make_optimizer(bf16, sharded)->updates_compute_copy());

  GPT2 fp32(*d, small_config(), true, options(Precision::kFp32));
  EXPECT_FALSE(fp32.trainable_compute().defined());
  EXPECT_FALSE(make_optimizer(fp32, OptimizerSettings{})->updates_compute_copy());
  GPT2 lora(*d, small_config(), true, options(Precision::kBf16, 4));
  EXPECT_FALSE(lora.trainable_compute().defined());
  EXPECT_FALSE(make_optimizer(lora, OptimizerSettings{})->updates_compute_copy());
}

}  // namespace
}  // namespace ct
