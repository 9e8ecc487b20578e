// Ops on tensors beyond maxStorageBufferRange (lavapipe: 128 MiB), split into bindable ranges:
// the LM-head matmuls and the embedding of a GPT-2-sized vocabulary table.
#include "tests/vulkan/vk_test_util.h"

namespace ct::vktest {
namespace {

using LargeTensorTest = VulkanTest;

// Rows of a [rows, cols] f32 table just past maxStorageBufferRange.
int64_t rows_past_range(int64_t cols) {
  return vk().info().max_buffer_range_bytes / (4 * cols) + 1001;
}

TEST_F(LargeTensorTest, LmHeadMatmulsSplitOverN) {
  const int64_t M = 3, K = 48, V = rows_past_range(K);
  ASSERT_GT(V * K * 4, vk().info().max_buffer_range_bytes);
  Pair x = both({M, K}, randn(M * K, 200)), wte = both({V, K}, randn(V * K, 201, 0.1f));
  Pair logits = both_empty({M, V});
  // logits = x @ wte^T
  vk().matmul(logits.v, x.v, wte.v, false, true);
  ref().matmul(logits.r, x.r, wte.r, false, true);
  EXPECT_TRUE(same(logits, kTolGemm, "x @ wte^T"));
  // dwte (+=) dlogits^T @ x: c [V, K] itself beyond the range
  Pair dwte = both({V, K}, randn(V * K, 202, 0.1f));
  vk().matmul(dwte.v, logits.v, x.v, true, false, 1.0f, 1.0f);
  ref().matmul(dwte.r, logits.r, x.r, true, false, 1.0f, 1.0f);
  EXPECT_TRUE(same(dwte, kTolGemm, "dlogits^T @ x"));
}

TEST_F(LargeTensorTest, EmbeddingWithLargeVocabulary) {
  const int64_t B = 2, T = 5, C = 40, V = rows_past_range(C);
  auto toks = randint(B * T, 210, static_cast<int32_t>(V));
  toks[0] = static_cast<int32_t>(V - 1);  // a row past the first binding
  toks[1] = 3;
  toks[7] = static_cast<int32_t>(V - 1);
  Pair tokens = both_i32({B, T}, toks);
  Pair wte = both({V, C}, randn(V * C, 211)), wpe = both({T, C}, randn(T * C, 212));
  Pair out = both_empty({B, T, C});
  vk().embedding_forward(out.v, tokens.v, wte.v, wpe.v);
  ref().embedding_forward(out.r, tokens.r, wte.r, wpe.r);
  EXPECT_TRUE(same(out, kTol, "embedding_forward, large wte"));
  Pair dout = both({B, T, C}, randn(B * T * C, 213));
  Pair dwpe = both({T, C}, randn(T * C, 214));
  vk().embedding_backward(wte.v, dwpe.v, dout.v, tokens.v);  // wte as its own gradient buffer
  ref().embedding_backward(wte.r, dwpe.r, dout.r, tokens.r);
  EXPECT_TRUE(same(wte, kTol, "embedding_backward, large dwte"));
  EXPECT_TRUE(same(dwpe, kTol, "embedding_backward dwpe"));
}

}  // namespace
}  // namespace ct::vktest
