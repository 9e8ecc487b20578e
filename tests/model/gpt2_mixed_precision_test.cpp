// GPT-2 under the 16-bit precision policies (core/amp/precision.h), on both CPU devices: the
// compute-weight copy is the master rounded to nearest even and follows refresh; bf16 and fp16
// forward/backward stay close to the fp32 model from the same init; checkpointing stays bitwise
// under bf16; AdamW steps with loss scaling and refresh track fp32 (measured: worst step loss rel
// 4e-4 bf16, 5e-5 fp16 over 8 steps); activation memory is the prediction; generate works with
// 16-bit logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "backends/cpu/cpu_backend.h"
#include "core/amp/loss_scaler.h"
#include "core/error.h"
#include "core/model/gpt2.h"

namespace ct {
namespace {

constexpr int kActs = static_cast<int>(MemCategory::kActivations);
constexpr int kWeights = static_cast<int>(MemCategory::kWeights);
// Worst per-tensor gradient nMSE against fp32, bounds about 5x above what the CPU devices give
// (2 layers, C=64, B=4, T=32, from init): bf16 worst tensor 4.3e-5 (overall 1.3e-5), loss rel
// 2.6e-5; fp16 (loss scale 1024) worst 7.7e-7 (overall 1.9e-7), loss rel 7.3e-7.
constexpr double kBf16GradNmse = 2e-4;
constexpr double kFp16GradNmse = 4e-6;

GPT2Config test_config() {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 32;
  c.vocab_size = 97;
  return c;
}

ModelOptions options_for(Precision p, bool checkpointing = false) {
  ModelOptions o;
  o.policy = PrecisionPolicy::make(p);
  o.gradient_checkpointing = checkpointing;
  return o;
}

Tensor upload_tokens(Device& dev, int B, int T, int vocab, int salt) {
  std::vector<int32_t> v(size_t(B) * T);
  for (int i = 0; i < B * T; ++i) v[i] = (i * 7 + salt * 13 + (i * i) % 11) % vocab;
  Tensor t = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  dev.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

bool has_16bit(Device& dev, DType h) {
  return dev.supports(OpKind::kMatmul, h) && dev.supports(OpKind::kAttention, h);
}

struct StepResult {
  float loss = 0;
  std::vector<float> grads;
};

// One forward/backward with dloss_scale `scale`; gradients are returned divided by it.
StepResult forward_backward(Device& dev, const ModelOptions& o, float scale) {
  const GPT2Config c = test_config();
  const int B = 4, T = 32;
  GPT2 model(dev, c, true, o);
  model.init(2024);
  Tensor tokens = upload_tokens(dev, B, T, c.vocab_size, 1);
  Tensor targets = upload_tokens(dev, B, T, c.vocab_size, 2);
  StepResult r;
  dev.download(&r.loss, model.forward(tokens, &targets, B, T), sizeof(float));
  model.backward(scale);
  r.grads = model.download_grads();
  for (float& g : r.grads) g /= scale;
  return r;
}

std::string precision_name(Precision p) {
  return PrecisionPolicy::make(p).name();
}

using Param = std::tuple<bool, Precision>;  // reference device, precision
class GPT2MixedPrecision : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    dev_ = make_cpu_device(std::get<0>(GetParam()));
    p_ = std::get<1>(GetParam());
    h_ = PrecisionPolicy::make(p_).compute;
    if (!has_16bit(*dev_, h_)) GTEST_SKIP() << "device has no " << dtype_name(h_) << " ops";
  }
  std::unique_ptr<Device> dev_;
  Precision p_ = Precision::kBf16;
  DType h_ = DType::bf16;
};

TEST_P(GPT2MixedPrecision, ComputeWeightsAreTheRoundedMasterAndFollowRefresh) {
  const GPT2Config c = test_config();
  const int64_t before = dev_->memory().current[kWeights];
  GPT2 model(*dev_, c, true, options_for(p_));
  const int64_t N = model.flat_size();  // the device layout: wte's zero rows included
  EXPECT_EQ(dev_->memory().current[kWeights] - before, N * 4 + N * 2);
  EXPECT_EQ(model.compute_params_flat().dtype, h_);
  model.init(7);
  auto check = [&](const char* when) {
    std::vector<float> master(static_cast<size_t>(N));
    dev_->download(master.data(), model.params_flat(), master.size() * 4);
    std::vector<uint16_t> copy(static_cast<size_t>(N));
    dev_->download(copy.data(), model.compute_params_flat(), copy.size() * 2);
    size_t bad = 0;
    for (size_t i = 0; i < copy.size(); ++i)
      bad += copy[i] != (h_ == DType::bf16 ? f32_to_bf16(master[i]) : f32_to_f16(master[i]));
    EXPECT_EQ(bad, 0u) << when;
  };
  check("after init");
  dev_->scale(model.params_flat(), 0.75f);  // what an optimizer step does to the master
  model.refresh_compute_weights();
  check("after refresh");
}

TEST_P(GPT2MixedPrecision, CloseToFp32FromTheSameInit) {
  // fp16 runs with a loss scale, as the trainer's GradScaler would; bf16 needs none.
  const float scale = p_ == Precision::kFp16 ? 1024.0f : 1.0f;
  StepResult ref = forward_backward(*dev_, options_for(Precision::kFp32), 1.0f);
  StepResult mp = forward_backward(*dev_, options_for(p_), scale);
  const double loss_rel = std::fabs(mp.loss - ref.loss) / ref.loss;
  EXPECT_LE(loss_rel, 1e-2) << mp.loss << " vs " << ref.loss;

  // Normalised MSE per parameter tensor, sum (g - g32)^2 / sum g32^2; the worst tensor.
  GPT2 shape(*dev_, test_config(), false);
  double worst = 0, total_d = 0, total_r = 0;
  std::string worst_name;
  for (const ParamInfo& p : shape.params()) {
    double d2 = 0, r2 = 0;
    for (int64_t j = p.offset; j < p.offset + p.numel; ++j) {
      ASSERT_TRUE(std::isfinite(mp.grads[j])) << p.name;
      const double d = double(mp.grads[j]) - ref.grads[j];
      d2 += d * d;
      r2 += double(ref.grads[j]) * ref.grads[j];
    }
    total_d += d2;
    total_r += r2;
    // Skip tensors whose fp32 gradient is zero up to rounding (the key bias).
    if (r2 < 1e-20) continue;
    if (d2 / r2 > worst) worst = d2 / r2, worst_name = p.name;
  }
  const double bound = p_ == Precision::kBf16 ? kBf16GradNmse : kFp16GradNmse;
  EXPECT_LE(worst, bound) << worst_name;
  std::printf(
      "[%s %s] loss %.6f vs fp32 %.6f (rel %.2e); gradient nMSE overall %.2e, worst "
      "tensor %.2e (%s)\n",
      std::get<0>(GetParam()) ? "reference" : "fast", precision_name(p_).c_str(), mp.loss, ref.loss,
      loss_rel, total_d / total_r, worst, worst_name.c_str());
}

// AdamW steps on one batch, as the trainer records them: backward with the loss scale,
// unscale + inf check (fp16), the optimizer on the f32 master, then refresh_compute_weights().
std::vector<float> train_losses(Device& dev, Precision p, int steps, int64_t* skipped) {
  const GPT2Config c = test_config();
  const int B = 4, T = 32;
  GPT2 model(dev, c, true, options_for(p));
  model.init(99);
  LossScaler scaler(PrecisionPolicy::make(p).loss_scaling);
  Tensor tokens = upload_tokens(dev, B, T, c.vocab_size, 3);
  Tensor targets = upload_tokens(dev, B, T, c.vocab_size, 4);
  const int64_t N = model.flat_size(), D = model.decay_count();  // the device layout
  Tensor m = dev.empty({N}, DType::f32, MemCategory::kOptimizer);
  Tensor v = dev.empty({N}, DType::f32, MemCategory::kOptimizer);
  dev.fill(m, 0.0f);
  dev.fill(v, 0.0f);
  std::vector<float> losses;
  int64_t t = 0;
  for (int step = 0; step < steps; ++step) {
    model.zero_grad();
    float loss;
    dev.download(&loss, model.forward(tokens, &targets, B, T), sizeof loss);
    losses.push_back(loss);
    model.backward(scaler.scale());
    const bool found_inf = scaler.unscale_and_check(dev, model.grads_flat());
    scaler.update(found_inf, step);
    if (found_inf) continue;
    AdamWHyper hp;
    hp.lr = 3e-3f;
    hp.step = ++t;
    hp.weight_decay = 0.1f;
    dev.adamw(model.params_decay(), model.grads_decay(), m.slice_flat(0, {D}), v.slice_flat(0, {D}),
              Tensor(), hp);
    hp.weight_decay = 0.0f;
    dev.adamw(model.params_no_decay(), model.grads_no_decay(), m.slice_flat(D, {N - D}),
              v.slice_flat(D, {N - D}), Tensor(), hp);
    model.refresh_compute_weights();
  }
  *skipped = scaler.skipped_steps();
  return losses;
}

TEST_P(GPT2MixedPrecision, TrainsLikeFp32) {
  const int steps = 8;
  int64_t skipped32 = 0, skipped = 0;
  std::vector<float> ref = train_losses(*dev_, Precision::kFp32, steps, &skipped32);
  std::vector<float> mp = train_losses(*dev_, p_, steps, &skipped);
  EXPECT_EQ(skipped, 0);
  double worst = 0;
  for (int i = 0; i < steps; ++i)
    worst = std::max(worst, std::fabs(double(mp[i]) - ref[i]) / ref[i]);
  EXPECT_LE(worst, 1e-2);
  EXPECT_LT(mp.back(), 0.9f * mp.front());  // it learns
  std::printf(
      "[%s %s] %d AdamW steps: loss %.4f -> %.4f (fp32 %.4f -> %.4f), worst step rel "
      "%.2e\n",
      std::get<0>(GetParam()) ? "reference" : "fast", precision_name(p_).c_str(), steps, mp.front(),
      mp.back(), ref.front(), ref.back(), worst);
}

TEST_P(GPT2MixedPrecision, CheckpointingIsBitwiseIdentical) {
  const float scale = p_ == Precision::kFp16 ? 1024.0f : 1.0f;
  StepResult plain = forward_backward(*dev_, options_for(p_, false), scale);
  StepResult ckpt = forward_backward(*dev_, options_for(p_, true), scale);
  EXPECT_EQ(std::memcmp(&plain.loss, &ckpt.loss, sizeof(float)), 0);
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  size_t differing = 0;
  for (size_t i = 0; i < plain.grads.size(); ++i)
    differing += std::memcmp(&plain.grads[i], &ckpt.grads[i], sizeof(float)) != 0;
  EXPECT_EQ(differing, 0u) << "of " << plain.grads.size();
}

TEST_P(GPT2MixedPrecision, ActivationBytesAreThePrediction) {
  GPT2Config c = test_config();
  c.n_layer = 6;
  for (bool ckpt : {false, true}) {
    const ModelOptions o = options_for(p_, ckpt);
    GPT2 model(*dev_, c, true, o);
    const int64_t before = dev_->memory().current[kActs];
    model.allocate_activations(3, 24);
    EXPECT_EQ(dev_->memory().current[kActs] - before, GPT2::activation_bytes(c, o, 3, 24))
        << "checkpointing " << ckpt;
  }
  // 16-bit activations take less than fp32's.
  EXPECT_LT(GPT2::activation_bytes(c, options_for(p_), 3, 24),
            GPT2::activation_bytes(c, options_for(Precision::kFp32), 3, 24));
}

TEST_P(GPT2MixedPrecision, GenerateReadsSixteenBitLogits) {
  const GPT2Config c = test_config();
  GPT2 model(*dev_, c, false, options_for(p_));
  model.init(5);
  SampleOptions so;
  so.top_k = 8;
  so.seed = 4;
  std::vector<int32_t> a = model.generate({1, 2, 3}, 40, so);
  ASSERT_EQ(a.size(), 40u);
  EXPECT_EQ(model.generate({1, 2, 3}, 40, so), a);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
  EXPECT_EQ(model.logits().dtype, h_);
}

INSTANTIATE_TEST_SUITE_P(CpuDevices, GPT2MixedPrecision,
                         ::testing::Combine(::testing::Values(false, true),
                                            ::testing::Values(Precision::kBf16, Precision::kFp16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Reference" : "Fast") +
                                  "_" + precision_name(std::get<1>(info.param));
                         });

TEST(GPT2Precision, PolicyIsChecked) {
  auto dev = make_cpu_device(false);
  ModelOptions o = options_for(Precision::kBf16);
  o.policy.compute = DType::f32;  // matmul needs a and b of one dtype: lnf (h) @ wte (compute)
  try {
    GPT2 model(*dev, test_config(), true, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  // An fp32 model keeps a single weight buffer: refresh is a no-op and the copy is the master.
  GPT2 fp32(*dev, test_config());
  EXPECT_EQ(fp32.compute_params_flat().buffer, fp32.params_flat().buffer);
  EXPECT_NO_THROW(fp32.refresh_compute_weights());
}

}  // namespace
}  // namespace ct
