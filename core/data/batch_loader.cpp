#include "core/data/batch_loader.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/philox.h"

namespace ct {

BatchLoader::BatchLoader(std::vector<int32_t> tokens, int64_t B, int64_t T, uint64_t seed,
                         int prefetch, RowShard shard)
    : tokens_(std::move(tokens)),
      B_(B),
      T_(T),
      first_row_(shard.first),
      rows_(shard.rows > 0 ? shard.rows : B),
      seed_(seed),
      depth_(static_cast<size_t>(std::max(prefetch, 1))) {
  CT_REQUIRE(B > 0 && T > 0, "batch loader: B and T must be positive, got B=" + std::to_string(B) +
                                 " T=" + std::to_string(T));
  CT_REQUIRE(static_cast<int64_t>(tokens_.size()) >= T + 1,
             "batch loader: " + std::to_string(tokens_.size()) +
                 " tokens are fewer than one window needs (T + 1 = " + std::to_string(T + 1) + ")");
  CT_REQUIRE(prefetch >= 1 && prefetch <= 16,
             "batch loader: prefetch depth must be in [1, 16], got " + std::to_string(prefetch));
  CT_REQUIRE(shard.first >= 0 && shard.rows >= 0 && (shard.rows > 0 || shard.first == 0) &&
                 first_row_ + rows_ <= B,
             "batch loader: shard rows [" + std::to_string(shard.first) + ", " +
                 std::to_string(shard.first + shard.rows) + ") are not within a batch of " +
                 std::to_string(B) + " rows");
  thread_ = std::thread([this] { worker(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Batch BatchLoader::make_batch(int64_t k) const {
  CT_REQUIRE(k >= 0, "batch loader: batch number must be >= 0, got " + std::to_string(k));
  Batch b;
  b.index = k;
  b.B = rows_;
  b.T = T_;
  b.inputs.resize(static_cast<size_t>(rows_ * T_));
  b.targets.resize(static_cast<size_t>(rows_ * T_));
  const Philox rng(seed_, kBatchLoaderStream);
  const uint64_t starts = tokens_.size() - static_cast<uint64_t>(T_);
  for (int64_t row = 0; row < rows_; ++row) {
    PhiloxBlock w = rng.block(static_cast<uint64_t>(k) * static_cast<uint64_t>(B_) +
                              static_cast<uint64_t>(first_row_ + row));
    uint64_t x = static_cast<uint64_t>(w[0]) | static_cast<uint64_t>(w[1]) << 32;
    // Multiply-high maps x uniformly onto [0, starts) without the bias of a modulo.
    auto start = static_cast<size_t>((static_cast<unsigned __int128>(x) * starts) >> 64);
    const int32_t* src = tokens_.data() + start;
    std::copy(src, src + T_, b.inputs.begin() + row * T_);
    std::copy(src + 1, src + T_ + 1, b.targets.begin() + row * T_);
  }
  return b;
}

void BatchLoader::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (queue_.size() < depth_ && !error_); });
    if (stop_) return;
    const int64_t k = produce_;
    const uint64_t gen = generation_;
    lock.unlock();
    Batch b;
    std::exception_ptr err;
    try {
      b = make_batch(k);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (gen != generation_) continue;  // a seek() happened meanwhile: this batch is stale
    if (err) {
      error_ = err;
    } else {
      queue_.push_back(std::move(b));
      ++produce_;
    }
    cv_.notify_all();
  }
}

Batch BatchLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  ++position_;
  cv_.notify_all();
  return b;
}

int64_t BatchLoader::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return position_;
}

void BatchLoader::seek(int64_t k) {
  CT_REQUIRE(k >= 0, "batch loader: cannot seek to batch " + std::to_string(k));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
    position_ = k;
    produce_ = k;
    ++generation_;
    error_ = nullptr;
  }
  cv_.notify_all();
}

int64_t eval_windows(int64_t num_tokens, int64_t T) {
  CT_REQUIRE(T > 0, "eval windows: T must be positive, got " + std::to_string(T));
  return num_tokens > T ? (num_tokens - 1) / T : 0;
}

Batch eval_batch(std::span<const int32_t> tokens, int64_t T, int64_t first, int64_t count) {
  const int64_t total = eval_windows(static_cast<int64_t>(tokens.size()), T);
  CT_REQUIRE(first >= 0 && count > 0 && first + count <= total,
             "eval batch: windows [" + std::to_string(first) + ", " +
                 std::to_string(first + count) + ") out of range: " + std::to_string(total) +
                 " windows of T=" + std::to_string(T) + " in " + std::to_string(tokens.size()) +
                 " tokens");
  Batch b;
  b.index = first;
  b.B = count;
  b.T = T;
  b.inputs.assign(tokens.begin() + first * T, tokens.begin() + (first + count) * T);
  b.targets.assign(tokens.begin() + first * T + 1, tokens.begin() + (first + count) * T + 1);
  return b;
}

}  // namespace ct
