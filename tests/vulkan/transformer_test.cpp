// embedding, layernorm, attention, crossentropy: Vulkan vs the CPU reference on odd sizes.
#include "tests/vulkan/vk_test_util.h"

namespace ct::vktest {
namespace {

using TransformerOpTest = VulkanTest;

TEST_F(TransformerOpTest, EmbeddingForwardBackward) {
  const int64_t B = 3, T = 13, C = 37, V = 29, maxT = 17;
  // Few distinct tokens so rows repeat (the deterministic chain in the backward).
  auto toks = randint(B * T, 60, V);
  toks[0] = toks[5] = toks[B * T - 1] = 7;
  Pair tokens = both_i32({B, T}, toks);
  Pair wte = both({V, C}, randn(V * C, 61)), wpe = both({maxT, C}, randn(maxT * C, 62));
  Pair out = both_empty({B, T, C});
  vk().embedding_forward(out.v, tokens.v, wte.v, wpe.v);
  ref().embedding_forward(out.r, tokens.r, wte.r, wpe.r);
  EXPECT_TRUE(same(out, kTol, "embedding_forward"));

  Pair dout = both({B, T, C}, randn(B * T * C, 63));
  Pair dwte = both({V, C}, randn(V * C, 64)), dwpe = both({maxT, C}, randn(maxT * C, 65));
  vk().embedding_backward(dwte.v, dwpe.v, dout.v, tokens.v);
  ref().embedding_backward(dwte.r, dwpe.r, dout.r, tokens.r);
  EXPECT_TRUE(same(dwte, kTol, "embedding_backward dwte"));
  EXPECT_TRUE(same(dwpe, kTol, "embedding_backward dwpe"));
}

TEST_F(TransformerOpTest, EmbeddingBackwardIsDeterministic) {
  const int64_t B = 4, T = 64, C = 24, V = 5;
  Pair tokens = both_i32({B, T}, randint(B * T, 66, V));
  Pair dout = both({B, T, C}, randn(B * T * C, 67));
  Vec first;
  for (int rep = 0; rep < 3; ++rep) {
    Tensor dwte = vk().empty({V, C}, DType::f32, MemCategory::kGrads);
    Tensor dwpe = vk().empty({T, C}, DType::f32, MemCategory::kGrads);
    vk().fill(dwte, 0.0f);
    vk().fill(dwpe, 0.0f);
    vk().embedding_backward(dwte, dwpe, dout.v, tokens.v);
    Vec got = down(vk(), dwte);
    if (rep == 0) first = got;
    else EXPECT_EQ(got, first);
  }
}

TEST_F(TransformerOpTest, LayerNormForwardBackward) {
  const int64_t N = 2 * 19, C = 77;
  Vec xs = randn(N * C, 70, 2.0f);
  for (int64_t i = 0; i < C; ++i) xs[i] += 100.0f;  // a row with a large mean
  Pair x = both({2, 19, C}, xs), w = both({C}, randn(C, 71)), b = both({C}, randn(C, 72));
  Pair out = both_empty({2, 19, C}), mean = both_empty({N}), rstd = both_empty({N});
  vk().layernorm_forward(out.v, mean.v, rstd.v, x.v, w.v, b.v, 1e-5f);
  ref().layernorm_forward(out.r, mean.r, rstd.r, x.r, w.r, b.r, 1e-5f);
  EXPECT_TRUE(same(out, kTol, "layernorm out"));
  EXPECT_TRUE(same(mean, kTol, "layernorm mean"));
  EXPECT_TRUE(same(rstd, kTol, "layernorm rstd"));

  Pair dout = both({2, 19, C}, randn(N * C, 73));
  Pair dx = both({2, 19, C}, randn(N * C, 74)), dw = both({C}, randn(C, 75)),
       db = both({C}, randn(C, 76));
  vk().layernorm_backward(dx.v, dw.v, db.v, dout.v, x.v, w.v, mean.v, rstd.v);
  ref().layernorm_backward(dx.r, dw.r, db.r, dout.r, x.r, w.r, mean.r, rstd.r);
  EXPECT_TRUE(same(dx, kTol, "layernorm dx"));
  EXPECT_TRUE(same(dw, kTol, "layernorm dw"));
  EXPECT_TRUE(same(db, kTol, "layernorm db"));
}

TEST_F(TransformerOpTest, AttentionForwardBackward) {
  const int64_t B = 2, T = 11, NH = 3, C = NH * 7;
  Pair qkv = both({B, T, 3 * C}, randn(B * T * 3 * C, 80));
  Pair out = both_empty({B, T, C}), att = both_empty({B, NH, T, T});
  vk().attention_forward(out.v, att.v, qkv.v, static_cast<int>(NH));
  ref().attention_forward(out.r, att.r, qkv.r, static_cast<int>(NH));
  EXPECT_TRUE(same(out, kTolGemm, "attention out"));
  EXPECT_TRUE(same(att, kTolGemm, "attention att"));
  EXPECT_TRUE(same(out, 1e-10, "attention out (tight)"));

  Pair dout = both({B, T, C}, randn(B * T * C, 81));
  Pair dqkv = both({B, T, 3 * C}, randn(B * T * 3 * C, 82));
  vk().attention_backward(dqkv.v, dout.v, qkv.v, att.v, static_cast<int>(NH));
  ref().attention_backward(dqkv.r, dout.r, qkv.r, att.r, static_cast<int>(NH));
  EXPECT_TRUE(same(dqkv, kTolGemm, "attention dqkv"));
  EXPECT_TRUE(same(dqkv, 1e-10, "attention dqkv (tight)"));
}

TEST_F(TransformerOpTest, CrossEntropyForwardBackwardInPlace) {
  const int64_t N = 23, V = 1001;
  Vec xs = randn(N * V, 90, 3.0f);
  xs[5] = 80.0f;  // a dominant logit
  Pair logits = both({N, V}, xs), targets = both_i32({N}, randint(N, 91, V));
  Pair losses = both_empty({N});
  vk().crossentropy_forward(losses.v, logits.v, targets.v);
  ref().crossentropy_forward(losses.r, logits.r, targets.r);
  EXPECT_TRUE(same(losses, kTol, "crossentropy losses"));
  Pair d = both_empty({N, V});
  vk().crossentropy_backward(d.v, logits.v, targets.v, 1.0f / N);
  ref().crossentropy_backward(d.r, logits.r, targets.r, 1.0f / N);
  EXPECT_TRUE(same(d, kTol, "crossentropy dlogits"));
  // in place: dlogits aliases logits
  vk().crossentropy_backward(logits.v, logits.v, targets.v, 1.0f / N);
  EXPECT_TRUE(close_nmse(down(vk(), logits.v), down(ref(), d.r), kTol, "crossentropy in place"));
}

}  // namespace
}  // namespace ct::vktest
