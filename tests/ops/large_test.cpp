// Tensors past each device's binding range (DeviceInfo::max_buffer_range_bytes; lavapipe's
// maxStorageBufferRange is 128 MiB), split by the backend into bindable ranges: elementwise ops,
// the LM-head matmuls and the embedding of a vocabulary table past the range. Sizes follow the
// device's limit; a device whose range is larger than this machine can hold (the CPU binds any
// size) skips with the reason. (Optimizers and 16-bit add past the range: their own suites.)
#include "tests/common/device_harness.h"

namespace ct::test {
namespace {

class LargeTensor : public DeviceTest {
 protected:
  // Rows of a [rows, cols] f32 table just past the binding range.
  int64_t rows_past_range(int64_t cols) const {
    return dev().info().max_buffer_range_bytes / (4 * cols) + 1001;
  }
};

TEST_P(LargeTensor, ElementwisePastTheRange) {
  int64_t n = dev().info().max_buffer_range_bytes / 4 + 1234567;  // > range bytes of f32
  if (std::string why = cannot_hold(n * 4, 6); !why.empty()) GTEST_SKIP() << why;
  Vec xs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) xs[i] = static_cast<float>(i % 1000) * 0.5f;
  Pair a = both({n}, xs), b = both({n}, xs);
  dev().accumulate(a.d, b.d);
  ref().accumulate(a.r, b.r);
  dev().scale(a.d, 0.5f);
  ref().scale(a.r, 0.5f);
  Vec got = download(dev(), a.d);
  EXPECT_TRUE(close_nmse(got, download(ref(), a.r), tol(), "large accumulate+scale on " + id()));
  EXPECT_EQ(got[n - 1], xs[n - 1]);
}

TEST_P(LargeTensor, LmHeadMatmulsSplitOverN) {
  const int64_t M = 3, K = 48, V = rows_past_range(K);
  if (std::string why = cannot_hold(V * K * 4, 7); !why.empty()) GTEST_SKIP() << why;
  ASSERT_GT(V * K * 4, dev().info().max_buffer_range_bytes);
  Pair x = both({M, K}, randn(M * K, 200)), wte = both({V, K}, randn(V * K, 201, 0.1f));
  Pair logits = both_empty({M, V});
  // logits = x @ wte^T
  dev().matmul(logits.d, x.d, wte.d, false, true);
  ref().matmul(logits.r, x.r, wte.r, false, true);
  EXPECT_TRUE(same(logits, tol(Tol::kGemm), "x @ wte^T"));
  // dwte (+=) dlogits^T @ x: c [V, K] itself beyond the range
  Pair dwte = both({V, K}, randn(V * K, 202, 0.1f));
  dev().matmul(dwte.d, logits.d, x.d, true, false, 1.0f, 1.0f);
  ref().matmul(dwte.r, logits.r, x.r, true, false, 1.0f, 1.0f);
  EXPECT_TRUE(same(dwte, tol(Tol::kGemm), "dlogits^T @ x"));
}

TEST_P(LargeTensor, EmbeddingWithLargeVocabulary) {
  const int64_t B = 2, T = 5, C = 40, V = rows_past_range(C);
  if (std::string why = cannot_hold(V * C * 4, 5); !why.empty()) GTEST_SKIP() << why;
  auto toks = randint(B * T, 210, static_cast<int32_t>(V));
  toks[0] = static_cast<int32_t>(V - 1);  // a row past the first binding
  toks[1] = 3;
  toks[7] = static_cast<int32_t>(V - 1);
  Pair tokens = both_i32({B, T}, toks);
  Pair wte = both({V, C}, randn(V * C, 211)), wpe = both({T, C}, randn(T * C, 212));
  Pair out = both_empty({B, T, C});
  dev().embedding_forward(out.d, tokens.d, wte.d, wpe.d);
  ref().embedding_forward(out.r, tokens.r, wte.r, wpe.r);
  EXPECT_TRUE(same(out, tol(), "embedding_forward, large wte"));
  Pair dout = both({B, T, C}, randn(B * T * C, 213));
  Pair dwpe = both({T, C}, randn(T * C, 214));
  dev().embedding_backward(wte.d, dwpe.d, dout.d, tokens.d);  // wte as its own gradient buffer
  ref().embedding_backward(wte.r, dwpe.r, dout.r, tokens.r);
  EXPECT_TRUE(same(wte, tol(), "embedding_backward, large dwte"));
  EXPECT_TRUE(same(dwpe, tol(), "embedding_backward dwpe"));
}

CT_INSTANTIATE_DEVICE_SUITE(LargeTensor);

}  // namespace
}  // namespace ct::test
