#include "core/data/batch_loader.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/io/io_test_util.h"

namespace ct {
namespace {

using testing::expect_error;

// Token i has value i, so a row's start position is its first input.
std::vector<int32_t> iota_tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = i;
  return t;
}

void expect_same(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.B, b.B);
  EXPECT_EQ(a.T, b.T);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
}

TEST(BatchLoader, ShapesAndShiftedTargets) {
  const int64_t B = 4, T = 16;
  BatchLoader loader(iota_tokens(1000), B, T, 1234);
  for (int k = 0; k < 5; ++k) {
    Batch b = loader.next();
    EXPECT_EQ(b.index, k);
    ASSERT_EQ(b.inputs.size(), static_cast<size_t>(B * T));
    ASSERT_EQ(b.targets.size(), static_cast<size_t>(B * T));
    for (int64_t r = 0; r < B; ++r) {
      const int32_t start = b.inputs[r * T];
      EXPECT_GE(start, 0);
      EXPECT_LE(start + T, 999);  // the last target t[start + T] exists
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(b.inputs[r * T + t], start + t);
        EXPECT_EQ(b.targets[r * T + t], start + t + 1);
      }
    }
  }
  EXPECT_EQ(loader.position(), 5);
}

TEST(BatchLoader, SameSeedSameBatches) {
  BatchLoader a(iota_tokens(5000), 3, 8, 42, 2);
  BatchLoader b(iota_tokens(5000), 3, 8, 42, 4);
  BatchLoader c(iota_tokens(5000), 3, 8, 43);
  bool differs = false;
  for (int k = 0; k < 20; ++k) {
    Batch x = a.next(), y = b.next(), z = c.next();
    expect_same(x, y);
    expect_same(x, a.make_batch(k));
    differs |= x.inputs != z.inputs;
  }
  EXPECT_TRUE(differs) << "seeds 42 and 43 gave the same 20 batches";
}

TEST(BatchLoader, SeekReproducesBatches) {
  BatchLoader ref(iota_tokens(3000), 2, 10, 7);
  std::vector<Batch> seq;
  for (int k = 0; k < 12; ++k) seq.push_back(ref.next());

  BatchLoader loader(iota_tokens(3000), 2, 10, 7);
  loader.next();
  loader.seek(8);
  EXPECT_EQ(loader.position(), 8);
  for (int k = 8; k < 12; ++k) expect_same(loader.next(), seq[k]);
  loader.seek(3);
  expect_same(loader.next(), seq[3]);
  EXPECT_EQ(loader.position(), 4);
  loader.seek(0);
  expect_same(loader.next(), seq[0]);
  expect_error([&] { loader.seek(-1); }, ErrorKind::kInvalidArgument, {"-1"});
}

TEST(BatchLoader, StartsCoverTheRange) {
  // 21 tokens, T = 4: starts 0..16 are possible; all of them should appear over many batches.
  BatchLoader loader(iota_tokens(21), 8, 4, 99);
  std::set<int32_t> starts;
  for (int k = 0; k < 50; ++k) {
    Batch b = loader.next();
    for (int r = 0; r < 8; ++r) starts.insert(b.inputs[r * 4]);
  }
  EXPECT_EQ(starts.size(), 17u);
  EXPECT_EQ(*starts.begin(), 0);
  EXPECT_EQ(*starts.rbegin(), 16);
}

// Data parallel: rank r's shard of rows [r B, r B + B) of each batch of N B rows; the shards of
// the N ranks, in rank order, are the whole batch, batch after batch (and after a seek).
TEST(BatchLoader, ShardsTogetherAreTheWholeBatch) {
  const int64_t B = 3, N = 2, T = 8;
  BatchLoader whole(iota_tokens(4000), N * B, T, 5);
  BatchLoader rank0(iota_tokens(4000), N * B, T, 5, 2, RowShard{0, B});
  BatchLoader rank1(iota_tokens(4000), N * B, T, 5, 2, RowShard{B, B});
  for (int k = 0; k < 6; ++k) {
    if (k == 3) {  // a resumed rank continues the same shards
      rank1.seek(3);
      ASSERT_EQ(rank1.position(), 3);
    }
    const Batch w = whole.next(), a = rank0.next(), b = rank1.next();
    ASSERT_EQ(a.B, B);
    ASSERT_EQ(b.B, B);
    EXPECT_EQ(a.index, w.index);
    EXPECT_EQ(b.index, w.index);
    std::vector<int32_t> inputs = a.inputs, targets = a.targets;
    inputs.insert(inputs.end(), b.inputs.begin(), b.inputs.end());
    targets.insert(targets.end(), b.targets.begin(), b.targets.end());
    EXPECT_EQ(inputs, w.inputs) << "batch " << k;
    EXPECT_EQ(targets, w.targets) << "batch " << k;
  }
  expect_error(
      [] {
        BatchLoader l(iota_tokens(40), 4, 4, 1, 1, RowShard{2, 3});
      },
      ErrorKind::kInvalidArgument, {"shard rows [2, 5) are not within a batch of 4 rows"});
  expect_error(
      [] {
        BatchLoader l(iota_tokens(40), 4, 4, 1, 1, RowShard{1, 0});
      },
      ErrorKind::kInvalidArgument, {"shard rows"});
}

TEST(BatchLoader, MinimalDataAndErrors) {
  BatchLoader exact(iota_tokens(5), 2, 4, 1);  // exactly one window
  Batch b = exact.next();
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{1, 2, 3, 4, 1, 2, 3, 4}));
  expect_error([] { BatchLoader l(iota_tokens(4), 2, 4, 1); }, ErrorKind::kInvalidArgument,
               {"4 tokens", "T + 1 = 5"});
  expect_error([] { BatchLoader l(iota_tokens(40), 0, 4, 1); }, ErrorKind::kInvalidArgument,
               {"B=0"});
  expect_error([] { BatchLoader l(iota_tokens(40), 2, 4, 1, 0); }, ErrorKind::kInvalidArgument,
               {"prefetch"});
}

TEST(BatchLoader, DestroyWhilePrefetching) {
  for (int i = 0; i < 20; ++i) {
    BatchLoader loader(iota_tokens(100000), 64, 256, static_cast<uint64_t>(i));
    if (i % 2) loader.next();
  }
}

TEST(EvalWindows, Count) {
  EXPECT_EQ(eval_windows(0, 4), 0);
  EXPECT_EQ(eval_windows(4, 4), 0);
  EXPECT_EQ(eval_windows(5, 4), 1);
  EXPECT_EQ(eval_windows(8, 4), 1);
  EXPECT_EQ(eval_windows(9, 4), 2);
  EXPECT_EQ(eval_windows(1001, 100), 10);
  EXPECT_EQ(eval_windows(1000, 100), 9);
}

TEST(EvalWindows, Batch) {
  std::vector<int32_t> t = iota_tokens(9);  // T = 4: windows 0 and 1
  Batch b = eval_batch(t, 4, 0, 2);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.inputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  Batch w1 = eval_batch(t, 4, 1, 1);
  EXPECT_EQ(w1.index, 1);
  EXPECT_EQ(w1.inputs, (std::vector<int32_t>{4, 5, 6, 7}));
  expect_error([&] { eval_batch(t, 4, 1, 2); }, ErrorKind::kInvalidArgument, {"out of range"});
  expect_error([&] { eval_batch(t, 4, 0, 0); }, ErrorKind::kInvalidArgument, {"out of range"});
}

}  // namespace
}  // namespace ct
