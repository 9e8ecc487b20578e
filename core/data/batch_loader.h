// Training batches (random windows, prefetched on a background thread) and evaluation windows.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace ct {

// B rows of T tokens: targets[b, t] = the token after inputs[b, t]. Row-major [B, T] int32.
struct Batch {
  int64_t index = 0;  // batch number (BatchLoader) or first window (eval_batch)
  int64_t B = 0;
  int64_t T = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// Batch k is a pure function of (tokens, B, T, seed, k): row b starts at
//   start = floor(x * (n - T) / 2^64),  x = word0 | word1 << 32 of
//   Philox(seed, kBatchLoaderStream).block(k * B + b),
// uniform over the n - T starts whose T + 1 tokens fit. A background thread prepares the next
// `prefetch` batches; next() hands them out in order, and seek(k) makes batch k the next one, so
// a resumed run continues the exact sequence.
//
// Data parallel: rank r of N with B rows each reads rows [r B, r B + B) of the batches of a
// loader of N B rows (a RowShard), so the N ranks together read what one process with N B rows
// reads, in the same order, and batch numbers (positions) mean the same on every rank.
struct RowShard {
  int64_t first = 0;  // the first row of each batch this loader returns
  int64_t rows = 0;   // how many (0: every row, from `first` = 0)
};

class BatchLoader {
 public:
  static constexpr uint64_t kBatchLoaderStream = 0x44415441'00000001ull;  // "DATA", 1

  // B: the rows of a whole batch. Requires B, T > 0, tokens.size() >= T + 1, prefetch in
  // [1, 16] and a shard within [0, B); Error(kInvalidArgument) otherwise. Starts the prefetch
  // thread at batch 0. Returned batches have shard.rows rows (B without a shard).
  BatchLoader(std::vector<int32_t> tokens, int64_t B, int64_t T, uint64_t seed, int prefetch = 3,
              RowShard shard = {});
  // Stops and joins the prefetch thread.
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Batch number position(), then advances position by one. Blocks until it is ready.
  Batch next();
  // The number of the batch next() returns.
  int64_t position() const;
  // Makes batch k the next one (discarding prefetched batches). k >= 0.
  void seek(int64_t k);
  // Batch k, computed on the calling thread (what next() returns for position k).
  Batch make_batch(int64_t k) const;

  int64_t batch_size() const { return B_; }  // rows of a whole batch, every shard's together
  RowShard shard() const { return {first_row_, rows_}; }
  int64_t seq_len() const { return T_; }
  uint64_t seed() const { return seed_; }
  size_t num_tokens() const { return tokens_.size(); }

 private:
  void worker();

  const std::vector<int32_t> tokens_;
  const int64_t B_, T_;
  const int64_t first_row_, rows_;  // the shard (rows_ = B_ without one)
  const uint64_t seed_;
  const size_t depth_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;  // batches position_, position_ + 1, ...
  int64_t position_ = 0;     // next batch next() returns
  int64_t produce_ = 0;      // next batch the worker builds
  uint64_t generation_ = 0;  // bumped by seek() so in-flight work is dropped
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// Number of consecutive non-overlapping evaluation windows in `num_tokens` tokens: window k has
// inputs t[kT, kT + T) and targets t[kT + 1, kT + T + 1); only windows that fit count.
int64_t eval_windows(int64_t num_tokens, int64_t T);

// Windows first, ..., first + count - 1 as one Batch (B = count, index = first). Requires
// first >= 0, count > 0 and first + count <= eval_windows(tokens.size(), T);
// Error(kInvalidArgument) otherwise.
Batch eval_batch(std::span<const int32_t> tokens, int64_t T, int64_t first, int64_t count);

}  // namespace ct
