// Model::forward_backward (the training step's pass: the loss and its gradient over the logits in
// one op, Device::crossentropy_forward_backward) against forward() then backward() on every
// device under test: GPT-2 (vocabulary 1000, padded to 1024: rows longer than the GPU kernels'
// blocks of 256 threads) with gradient checkpointing, and Llama; fp32 and bf16; two accumulated
// micro-batches of different shapes. The losses, the gradients and the logits buffer after the
// step (the dlogits either way) agree; on the CPU backend, whose fused kernel runs the backward's
// row function, the gradients are the same bits. A plain forward after it (evaluation) gives the
// loss and logits of a fresh model's forward.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/model/gpt2.h"
#include "core/model/llama.h"
#include "tests/common/device_harness.h"
#include "tests/common/half_compare.h"
#include "tests/common/small_models.h"

namespace ct::test {
namespace {

std::vector<int32_t> tokens_for(int B, int T, int vocab, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(B) * T);
  for (int i = 0; i < B * T; ++i) v[i] = (i * 7 + salt * 13 + (i * i) % 11) % vocab;
  return v;
}

std::unique_ptr<Model> make_model(Device& d, bool llama, Precision p) {
  ModelOptions o;
  o.policy = PrecisionPolicy::make(p);
  if (llama) return std::make_unique<Llama>(d, two_layer_llama(32, 1000), true, o);
  o.gradient_checkpointing = true;
  return std::make_unique<GPT2>(d, two_layer_gpt2(32, 1000), true, o);
}

struct StepResult {
  Vec losses, grads, after;  // the mean losses, the gradients, the logits buffer after the step
};

// Two micro-batches of different shapes accumulated at dloss_scale 0.5 each.
StepResult step(Device& d, Model& m, bool fused) {
  m.init(31);
  m.zero_grad();
  StepResult r;
  const int shapes[2][2] = {{3, 20}, {2, 32}};
  for (int k = 0; k < 2; ++k) {
    const int B = shapes[k][0], T = shapes[k][1];
    Tensor tokens = upload_i32(d, {B, T}, tokens_for(B, T, m.vocab_size(), 1 + k));
    Tensor targets = upload_i32(d, {B, T}, tokens_for(B, T, m.vocab_size(), 5 + k));
    Tensor loss;
    if (fused) {
      loss = m.forward_backward(tokens, targets, B, T, 0.5f);
    } else {
      loss = m.forward(tokens, &targets, B, T);
      m.backward(0.5f);
    }
    r.losses.push_back(download(d, loss)[0]);
  }
  r.after = download_h(d, m.logits());
  const Tensor g = m.trainable_grads();
  r.grads = download(d, g);
  return r;
}

using FusedLoss = DeviceTest;

TEST_P(FusedLoss, ForwardBackwardEqualsForwardThenBackward) {
  for (bool llama : {false, true}) {
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      const DType h = PrecisionPolicy::make(p).compute;
      if (!dev().supports(OpKind::kMatmul, h) || !dev().supports(OpKind::kAttention, h)) continue;
      const std::string nm =
          std::string(llama ? " llama " : " gpt2 ") + dtype_name(h) + " on " + id();
      std::unique_ptr<Model> a = make_model(dev(), llama, p), b = make_model(dev(), llama, p);
      const StepResult two = step(dev(), *a, false), one = step(dev(), *b, true);
      EXPECT_TRUE(close_nmse(one.losses, two.losses, tol(), "losses" + nm));
      // the dlogits differ by the rounding of the fused kernel's statistics (16 bits: an ulp of
      // a few elements), the gradients by what the matmuls make of that. Measured on simt and
      // lavapipe: f32 1e-14 (dlogits 1e-17), bf16 3e-9 (dlogits 1e-12).
      const double gtol = h == DType::f32 ? tol() : 1e-6;
      EXPECT_TRUE(close_nmse(one.after, two.after, gtol, "dlogits left in the logits" + nm));
      EXPECT_TRUE(close_nmse(one.grads, two.grads, gtol, "gradients" + nm));
      if (same_backend_as_ref()) {
        EXPECT_EQ(0,
                  std::memcmp(one.grads.data(), two.grads.data(), one.grads.size() * sizeof(float)))
            << "gradients not bitwise equal" << nm;
      }
      // evaluation after the fused pass: a plain forward, the logits intact
      const int B = 2, T = 16;
      Tensor tokens = upload_i32(dev(), {B, T}, tokens_for(B, T, 1000, 9));
      Tensor targets = upload_i32(dev(), {B, T}, tokens_for(B, T, 1000, 10));
      const Vec eval_after = download(dev(), b->forward(tokens, &targets, B, T));
      const Vec logits_after = download_h(dev(), b->logits());
      std::unique_ptr<Model> fresh = make_model(dev(), llama, p);
      fresh->init(31);
      const Vec eval_fresh = download(dev(), fresh->forward(tokens, &targets, B, T));
      // b's weights are the initial ones still (no optimizer step)
      EXPECT_EQ(eval_after, eval_fresh) << "evaluation loss" << nm;
      EXPECT_EQ(logits_after, download_h(dev(), fresh->logits())) << "evaluation logits" << nm;
    }
  }
}

CT_INSTANTIATE_DEVICE_SUITE(FusedLoss);

}  // namespace
}  // namespace ct::test
